r"""ListOps with Linformer attention (`linformer`).

  python -m lra_msmra.main --config configs/listops/linformer.py:runlocal \
      --workdir /tmp/listops_linformer

The official config (`listops/configs/linformer_base.py`) is the base config
with the model swapped: k = 16, one E of 2001 x 16 (CLS included) per layer:
9,076,810 parameters, 101.4% of the LRA Transformer's. The LRA leaderboard
reports 35.70.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task, the `xiong` setting included: configs/common/linformer.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linformer')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  return common.apply(base.get_config(arg), opts)
