r"""Pathfinder with Combiner-Fixed (arXiv:2107.05768).

  python -m lra_msmra.main \
      --config configs/pathfinder/combiner_fixed.py:runlocal \
      --workdir /tmp/pathfinder_combiner_fixed

Default block size: 1024 pixels (MEAN pooling, no CLS) -> s = 32, 32 blocks.
The paper reports 88.59 for Combiner-Fixed on Pathfinder-inter (its
Transformer: 88.81), see combiner_fixed_inter.py; it reports nothing on the
default 'hard' split.

Options: see base.py (`runlocal`, `xiong`, `cst`). The protocol and the block
size: configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'fixed')
