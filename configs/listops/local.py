r"""ListOps with local attention (`local`; LRA leaderboard: Local Attention).

  python -m lra_msmra.main --config configs/listops/local.py:runlocal \
      --workdir /tmp/listops_local

The official config (`listops/configs/local_base.py`) is the base config
with the model swapped: blocks of 50 tokens (2001 tokens with CLS -> 41
blocks, padded to 2050). Same parameter count as the LRA Transformer
(8,948,746). The LRA leaderboard reports 15.82.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/local.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/local')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
