r"""Image with Linformer attention (`linformer`).

  python -m lra_msmra.main --config configs/image/linformer.py:runlocal \
      --workdir /tmp/image_linformer

The official config (`image/configs/cifar10/linformer_base.py`) is the
Transformer's (1 layer, 8 heads, 128/64/128, CLS pooling) with the model
swapped: k = 16, E of 1025 x 16: 264,858 parameters, 106.6% of the LRA
Transformer's. The LRA leaderboard reports 38.56.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task, the `xiong` setting included: configs/common/linformer.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linformer')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  return common.apply(base.get_config(arg), opts)
