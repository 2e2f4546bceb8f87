r"""ListOps with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/listops/synthesizer.py:runlocal \
      --workdir /tmp/listops_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the LRA Transformer's config (the official
          listops/configs/synthesizer_base.py changes nothing) with the
          factorised random table of rank k = 6 plus the dot product, the
          largest k within the parameter rule: 9,717,130 parameters, 108.6%
          of the LRA Transformer's. Dropped: the official full random table
          (8 heads x 2001^2 per layer: 137,076,778 parameters, 15.3 times the
          Transformer's). LRA leaderboard (full table): 36.99.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')


def get_config(arg=None):
  return common.task_config(base, arg, lra_knobs=common.factorized(6))
