r"""Image with local attention (`local`; LRA leaderboard: Local Att.).

  python -m lra_msmra.main --config configs/image/local.py:runlocal \
      --workdir /tmp/image_local

The official config (`image/configs/cifar10/local_base.py`), kept whole:
blocks of 64 pixels, 2 heads (the Transformer has 8) and MEAN pooling (no
CLS token), with the Transformer's sizes (1 layer, 128/64/128). 248,202
parameters, 99.9% of the LRA Transformer's (no CLS vector, 1024 instead of
1025 learned positions). The LRA leaderboard reports 41.46.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/local.py and configs/common/lra_models.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/local')
lra_models = config_lib.load_sibling(__file__, '../common/lra_models')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = common.apply(base.get_config(arg), common.IMAGE_BLOCK_SIZE)
  return lra_models.official(config, opts, num_heads=2, pooling='MEAN')
