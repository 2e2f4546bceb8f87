r"""Retrieval with local attention (`local`; LRA leaderboard: Local Att.).

  python -m lra_msmra.main --config configs/retrieval/local.py:runlocal \
      --workdir /tmp/retrieval_local

The official config (`matching/configs/local_base.py`) is the base config
with the model swapped: blocks of 50 bytes (4000 per document -> 80
blocks). Same parameter count as the LRA Transformer (1,087,618). The LRA
leaderboard reports 53.39.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/local.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/local')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
