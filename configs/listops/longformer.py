r"""ListOps with Longformer attention (`longformer`).

  python -m lra_msmra.main --config configs/listops/longformer.py:runlocal \
      --workdir /tmp/listops_longformer

The official config (`listops/configs/longformer_base.py`) is the base
config with the model swapped: a sliding window of 512 keys, no global
token. Same parameter count as the LRA Transformer (8,948,746). The LRA
leaderboard reports 35.63.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/longformer.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/longformer')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  return common.apply(base.get_config(arg), opts)
