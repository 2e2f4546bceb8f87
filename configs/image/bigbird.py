r"""Image with BigBird attention (`bigbird`).

  python -m lra_msmra.main --config configs/image/bigbird.py:runlocal \
      --workdir /tmp/image_bigbird

The official config (`image/configs/cifar10/bigbird_base.py`) is the
Transformer's (1 layer, 128/64/128, CLS pooling) with blocks of 64 and
`num_head = 4`, a misspelt key (the encoder takes `num_heads`, so the file
as published cannot build the model); we read it as 4 heads. Attention
dropout 0 (the official BigBird never applies it). Same parameter count as
the LRA Transformer (248,458). The LRA leaderboard reports 40.83.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/bigbird.py and configs/common/lra_models.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/bigbird')
lra_models = config_lib.load_sibling(__file__, '../common/lra_models')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = lra_models.official(base.get_config(arg), opts, num_heads=4)
  return common.apply(config, opts, image=True)
