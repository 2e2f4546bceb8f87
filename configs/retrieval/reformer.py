r"""Retrieval with Reformer LSH attention (`reformer`, arXiv:2001.04451).

  python -m lra_msmra.main --config configs/retrieval/reformer.py:runlocal \
      --workdir /tmp/retrieval_reformer

Options: see base.py; what they mean for every task:
configs/common/reformer.py.

  (none)  the LRA Transformer's config with the official Reformer layer
          (1 hash round, 10 buckets; the official matching/configs/
          reformer_base.py changes nothing): 1,022,082 parameters, 94.0% of
          the LRA Transformer's. LRA leaderboard: 53.40.
  xiong   Xiong et al.'s Reformer (2 hashes, 128 buckets at 4096 tokens):
          78.64.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/reformer')


def get_config(arg=None):
  return common.task_config(base, arg)
