r"""Image with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/image/synthesizer.py:runlocal \
      --workdir /tmp/image_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the official image/configs/cifar10/synthesizer_base.py: mode
          'random' with the Transformer's sizes (1 layer, 128/64/128, 8
          heads, CLS): 8,653,458 parameters, 34.8 times the LRA
          Transformer's (8 heads x 1025^2). LRA leaderboard: 41.61.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')

OVER_BUDGET = ("The official Synthesizer's random table (8 heads x 1025 x "
               '1025) gives 8,653,458 parameters, 34.8x the LRA '
               "Transformer's.")


def get_config(arg=None):
  return common.task_config(base, arg)
