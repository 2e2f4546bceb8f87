r"""Image with Longformer attention (`longformer`).

  python -m lra_msmra.main --config configs/image/longformer.py:runlocal \
      --workdir /tmp/image_longformer

The official config (`image/configs/cifar10/longformer_base.py`) sets 4
heads, MEAN pooling and 4 layers of 128/64/128 (the Transformer has 1):
447,114 parameters, 180% of the LRA Transformer's 248,458, beyond the
leaderboard's 110%. We keep its heads and pooling and the Transformer's
single layer: 248,202 parameters, 99.9% (no CLS vector, 1024 instead of 1025
learned positions). Window of 512 pixels, no global token. The LRA
leaderboard reports 42.22.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/longformer.py and configs/common/lra_models.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/longformer')
lra_models = config_lib.load_sibling(__file__, '../common/lra_models')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = base.get_config(arg)
  # Official 4 layers break the parameter rule (docstring).
  config = lra_models.official(config, opts, num_heads=4, pooling='MEAN')
  return common.apply(config, opts, image=True)
