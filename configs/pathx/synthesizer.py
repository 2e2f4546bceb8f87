r"""Path-X with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/pathx/synthesizer.py:runlocal \
      --workdir /tmp/pathx_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the LRA Transformer's Path-X config with a factorised random
          table (k = 32, the value the official Text file names) plus dot
          product: the official repository has no Path-X file for this
          model, and a full table would hold 2 x 16384^2 = 537M parameters.
          2,635,106 parameters, 4.9 times the LRA Transformer's. LRA
          leaderboard: FAIL.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')

OVER_BUDGET = ('No official Path-X file; even the factorised table (2 heads '
               'x 2 x 16384 x 32) gives 2,635,106 parameters, 4.9x the LRA '
               "Transformer's.")


# No official Path-X file: the full table would hold 2 x 16384^2 = 537M
# parameters; the paper's factorised table with the Text file's k = 32 holds
# 2 x 2 x 16384 x 32.
KNOBS = {'synthesizer_mode': 'factorized_random', 'factorized_k': 32,
         'ignore_dot_product': False}


def get_config(arg=None):
  return common.task_config(base, arg, knobs=KNOBS)
