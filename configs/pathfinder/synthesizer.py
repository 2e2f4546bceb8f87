r"""Pathfinder with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/pathfinder/synthesizer.py:runlocal \
      --workdir /tmp/pathfinder_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the official image/configs/pathfinder32/synthesizer_base.py:
          mode 'random', 2 layers, D = 64, qkv 32, MLP 64, 4 heads, dropout
          0.2: 8,442,946 parameters, 318 times the LRA Transformer's (4 heads
          x 1024^2 per layer). LRA leaderboard: 69.45.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')

OVER_BUDGET = ("The official Synthesizer's random tables (4 heads x 1024 x "
               '1024 per layer) give 8,442,946 parameters, 318x the LRA '
               "Transformer's.")


def get_config(arg=None):
  # Official image/configs/pathfinder32/synthesizer_base.py.
  return common.task_config(base, arg, num_layers=2, num_heads=4, emb_dim=64,
                            qkv_dim=32, mlp_dim=64, dropout_rate=0.2)
