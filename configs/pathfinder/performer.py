r"""Pathfinder with Performer attention (`performer`, arXiv:2009.14794).

  python -m lra_msmra.main --config configs/pathfinder/performer.py:runlocal \
      --workdir /tmp/pathfinder_performer

Options: see base.py; what they mean for every task:
configs/common/performer.py.

  (none)  the official image/configs/pathfinder32/performer_base.py: the
          Transformer's sizes but 8 heads (head width 2), dropout 0.2, with
          the official Performer default (ReLU generalized attention, no
          random features): 26,530 parameters, 100% of the LRA
          Transformer's. LRA leaderboard: 77.05.
  xiong   Xiong et al. (Performer, r = 256): 69.87.
  cst     the CST paper's Performer re-run: 72.91.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/performer')


def get_config(arg=None):
  # Official image/configs/pathfinder32/performer_base.py.
  return common.task_config(base, arg, num_layers=4, num_heads=8, emb_dim=32,
                            qkv_dim=16, mlp_dim=32, dropout_rate=0.2)
