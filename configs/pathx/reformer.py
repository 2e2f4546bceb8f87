r"""Path-X with Reformer LSH attention (`reformer`, arXiv:2001.04451).

  python -m lra_msmra.main --config configs/pathx/reformer.py:runlocal \
      --workdir /tmp/pathx_reformer

Options: see base.py; what they mean for every task:
configs/common/reformer.py.

  (none)  the LRA Transformer's Path-X config with the official layer (1
          hash round, 10 buckets); the official repository has no Path-X
          config for this model: 537,442 parameters, 99.9% of the LRA
          Transformer's. LRA leaderboard: FAIL.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/reformer')


def get_config(arg=None):
  return common.task_config(base, arg)
