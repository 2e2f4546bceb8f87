r"""Text with local attention (`local`; LRA leaderboard: Local Att.).

  python -m lra_msmra.main --config configs/text/local.py:runlocal \
      --workdir /tmp/text_local

The official config (`text_classification/configs/local_base.py`) is the
base config with the model swapped: blocks of 50 tokens. Same parameter
count as the LRA Transformer (3,486,722). The LRA leaderboard reports 52.98.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/local.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/local')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
