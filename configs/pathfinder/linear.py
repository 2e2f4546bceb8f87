r"""Pathfinder with Linear Transformer attention (`linear`, arXiv:2006.16236).

  python -m lra_msmra.main --config configs/pathfinder/linear.py:runlocal \
      --workdir /tmp/pathfinder_linear

Options: see base.py; what they mean for every task:
configs/common/linear.py.

  (none)  the official image/configs/pathfinder32/
          linear_transformer_base.py: 1 layer, D = 128, qkv 64, MLP 128,
          2 heads, dropout 0.2: 116,098 parameters, 437.6% of the LRA
          Transformer's (26,530), over the leaderboard's 110% rule, as the
          official file is (`OVER_BUDGET`). LRA leaderboard: 75.30.
          AdaMRA's re-run under `xiong`: 70.20.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linear')

OVER_BUDGET = ('The official pathfinder32/linear_transformer_base.py (1 layer, '
               'D = 128, qkv 64, MLP 128, 2 heads) has about 4.4x the LRA '
               'Transformer\'s parameters, mostly its 256 x 128 embedding.')


def get_config(arg=None):
  # Official image/configs/pathfinder32/linear_transformer_base.py.
  return common.task_config(base, arg, num_layers=1, num_heads=2, emb_dim=128,
                            qkv_dim=64, mlp_dim=128, dropout_rate=0.2)
