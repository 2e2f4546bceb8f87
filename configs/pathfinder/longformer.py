r"""Pathfinder with Longformer attention (`longformer`).

  python -m lra_msmra.main --config configs/pathfinder/longformer.py:runlocal \
      --workdir /tmp/pathfinder_longformer

The official config (`image/configs/pathfinder32/longformer_base.py`), kept
whole: 2 layers (the Transformer has 4) of 32/16/32, 2 heads, dropout 0.1,
MEAN pooling; a window of 512 pixels, no global token. 17,954 parameters,
67.7% of the LRA Transformer's. The LRA leaderboard reports 69.71.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/longformer.py and configs/common/lra_models.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/longformer')
lra_models = config_lib.load_sibling(__file__, '../common/lra_models')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = lra_models.official(base.get_config(arg), opts, num_layers=2,
                               num_heads=2, dropout_rate=0.1)
  return common.apply(config, opts, image=True)
