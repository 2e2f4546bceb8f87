r"""ListOps with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/listops/synthesizer.py:runlocal \
      --workdir /tmp/listops_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the LRA Transformer's config with the official Synthesizer
          (random table plus dot product; the official
          listops/configs/synthesizer_base.py changes nothing): 137,076,778
          parameters, 15.3 times the LRA Transformer's (8 heads x 2001^2
          per layer). LRA leaderboard: 36.99.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')

OVER_BUDGET = ("The official Synthesizer's random tables (8 heads x 2001 x "
               '2001 per layer) give 137,076,778 parameters, 15.3x the LRA '
               "Transformer's.")


def get_config(arg=None):
  return common.task_config(base, arg)
