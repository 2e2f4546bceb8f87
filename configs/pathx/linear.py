r"""Path-X with Linear Transformer attention (`linear`, arXiv:2006.16236).

  python -m lra_msmra.main --config configs/pathx/linear.py:runlocal \
      --workdir /tmp/pathx_linear

Options: see base.py; what they mean for every task:
configs/common/linear.py.

  (none)  the LRA Transformer's Path-X config with the attention swapped
          (the official repository has no Path-X config for this model):
          537,954 parameters, 100% of the LRA Transformer's. LRA
          leaderboard: FAIL.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linear')


def get_config(arg=None):
  return common.task_config(base, arg)
