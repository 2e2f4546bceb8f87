r"""Pathfinder-32 with Sinkhorn attention (`sinkhorn`, arXiv:2002.11296).

  python -m lra_msmra.main --config configs/pathfinder/sinkhorn.py:runlocal \
      --workdir /tmp/pathfinder_sinkhorn

Options: see base.py; what they mean for every task:
configs/common/sinkhorn.py.

  (none)  the official image/configs/pathfinder32/sinkhorn_base.py: blocks
          of 64, 2 layers, 4 heads, D = 32, qkv 16, MLP 64, dropout 0.2;
          23,362 parameters, 88.1% of the LRA Transformer's. LRA
          leaderboard: 67.45.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sinkhorn')


def get_config(arg=None):
  # Official image/configs/pathfinder32/sinkhorn_base.py.
  return common.task_config(base, arg, block_size=64, num_layers=2,
                            num_heads=4, emb_dim=32, qkv_dim=16, mlp_dim=64,
                            dropout_rate=0.2)
