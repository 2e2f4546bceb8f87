r"""Pathfinder with Linear Transformer attention (`linear`, arXiv:2006.16236).

  python -m lra_msmra.main --config configs/pathfinder/linear.py:runlocal \
      --workdir /tmp/pathfinder_linear

Options: see base.py; what they mean for every task:
configs/common/linear.py.

  (none)  the official image/configs/pathfinder32/
          linear_transformer_base.py sets 1 layer, D = 128, qkv 64, MLP
          128, 2 heads and dropout 0.2: 116,098 parameters, 437.6% of the
          LRA Transformer's (26,530), far beyond the leaderboard's 110%
          (mostly its 256 x 128 embedding). We keep its heads and dropout
          and use the Transformer's sizes (4 layers of 32/16/32): 26,530
          parameters, the Transformer's count. LRA leaderboard: 75.30.
          AdaMRA's re-run under `xiong`: 70.20.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linear')


def get_config(arg=None):
  # Official image/configs/pathfinder32/linear_transformer_base.py; its
  # sizes (1 layer, 128/64/128) break the parameter rule (docstring).
  return common.task_config(base, arg, num_heads=2, dropout_rate=0.2)
