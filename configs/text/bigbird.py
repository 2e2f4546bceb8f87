r"""Text with BigBird attention (`bigbird`).

  python -m lra_msmra.main --config configs/text/bigbird.py:runlocal \
      --workdir /tmp/text_bigbird

The official config (`text_classification/configs/bigbird_base.py`) is the
base config with the model swapped: blocks of 64, 3 random blocks, attention
dropout 0 (the official BigBird never applies it). Same parameter count as
the LRA Transformer (3,486,722). The LRA leaderboard reports 64.02.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/bigbird.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/bigbird')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  return common.apply(base.get_config(arg), opts)
