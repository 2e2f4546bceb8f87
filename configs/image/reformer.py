r"""Image with Reformer LSH attention (`reformer`, arXiv:2001.04451).

  python -m lra_msmra.main --config configs/image/reformer.py:runlocal \
      --workdir /tmp/image_reformer

Options: see base.py; what they mean for every task:
configs/common/reformer.py.

  (none)  the official image/configs/cifar10/reformer_base.py: 4 layers,
          D = 64, qkv 32, MLP 64, 8 heads, CLS, with the official layer (1
          hash round, 10 buckets): 145,866 parameters, 58.7% of the LRA
          Transformer's. LRA leaderboard: 38.07.
  xiong   Xiong et al.'s Reformer (2 hashes, 32 buckets at 1024 tokens):
          43.29.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/reformer')


def get_config(arg=None):
  # Official image/configs/cifar10/reformer_base.py.
  return common.task_config(base, arg, num_layers=4, num_heads=8, emb_dim=64,
                            qkv_dim=32, mlp_dim=64)
