r"""ListOps with Reformer LSH attention (`reformer`, arXiv:2001.04451).

  python -m lra_msmra.main --config configs/listops/reformer.py:runlocal \
      --workdir /tmp/listops_reformer

Options: see base.py; what they mean for every task:
configs/common/reformer.py.

  (none)  the LRA Transformer's config with the official Reformer layer
          (1 hash round, 10 buckets; the official listops/configs/
          reformer_base.py changes nothing): 7,900,170 parameters, 88.3% of
          the LRA Transformer's (shared query-key). LRA leaderboard: 37.27.
  xiong   Xiong et al.'s Reformer (2 hashes, 64 buckets at 2048 tokens):
          19.05.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/reformer')


def get_config(arg=None):
  return common.task_config(base, arg)
