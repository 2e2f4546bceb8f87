r"""Path-X with Performer attention (`performer`, arXiv:2009.14794).

  python -m lra_msmra.main --config configs/pathx/performer.py:runlocal \
      --workdir /tmp/pathx_performer

Options: see base.py; what they mean for every task:
configs/common/performer.py.

  (none)  the LRA Transformer's Path-X config with the official Performer
          default (ReLU generalized attention, no random features); the
          official repository has no Path-X config for this model:
          537,954 parameters, 100% of the LRA Transformer's. LRA
          leaderboard: FAIL.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/performer')


def get_config(arg=None):
  return common.task_config(base, arg)
