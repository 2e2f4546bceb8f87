r"""Text with Reformer LSH attention (`reformer`, arXiv:2001.04451).

  python -m lra_msmra.main --config configs/text/reformer.py:runlocal \
      --workdir /tmp/text_reformer

Options: see base.py; what they mean for every task:
configs/common/reformer.py.

  (none)  the LRA Transformer's config with the official Reformer layer
          (1 hash round, 10 buckets; the official text_classification/
          configs/reformer_base.py changes nothing): 3,224,578 parameters,
          92.5% of the LRA Transformer's. LRA leaderboard: 56.10.
  xiong   Xiong et al.'s Reformer (2 hashes, 128 buckets at 4096 tokens):
          64.88.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/reformer')


def get_config(arg=None):
  return common.task_config(base, arg)
