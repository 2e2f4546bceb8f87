r"""Image with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/image/synthesizer.py:runlocal \
      --workdir /tmp/image_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the official image/configs/cifar10/synthesizer_base.py (mode
          'random' with the Transformer's sizes: 1 layer, 128/64/128, 8
          heads, CLS) with the factorised random table of rank k = 1 plus the
          dot product, the largest k within the parameter rule (16,400
          parameters per unit of k, 24,845 spare): 264,858 parameters, 106.6%
          of the LRA Transformer's. Dropped: the official full random table
          (8 heads x 1025^2: 8,653,458 parameters, 34.8 times the
          Transformer's). LRA leaderboard (full table): 41.61.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')


def get_config(arg=None):
  return common.task_config(base, arg, lra_knobs=common.factorized(1))
