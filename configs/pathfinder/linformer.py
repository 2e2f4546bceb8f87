r"""Pathfinder with Linformer attention (`linformer`).

  python -m lra_msmra.main --config configs/pathfinder/linformer.py:runlocal \
      --workdir /tmp/pathfinder_linformer

The official config (`image/configs/pathfinder32/linformer_base.py`) sets 1
layer (the Transformer has 4) of 32/16/32 with 2 heads and dropout 0.2; with
k = 16 its E of 1024 x 16 gives 30,050 parameters, 113.3% of the LRA
Transformer's 26,530, beyond the leaderboard's 110%. We keep that model and
lower k to 15, the largest that fits: 29,026 parameters, 109.4%. The LRA
leaderboard reports 76.34.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task, the `xiong` setting included: configs/common/linformer.py.
Official per-model settings: configs/common/lra_models.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linformer')
lra_models = config_lib.load_sibling(__file__, '../common/lra_models')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = lra_models.official(base.get_config(arg), opts, num_layers=1,
                               num_heads=2, dropout_rate=0.2)
  # k = 16 breaks the parameter rule by a few hundred weights (docstring).
  return common.apply(config, opts, lra_rank=15)
