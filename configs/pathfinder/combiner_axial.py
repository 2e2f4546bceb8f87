r"""Pathfinder with Combiner-Axial (arXiv:2107.05768).

  python -m lra_msmra.main \
      --config configs/pathfinder/combiner_axial.py:runlocal \
      --workdir /tmp/pathfinder_combiner_axial

`row_length=32`, so image rows are grid rows: a 32 x 32 grid (MEAN pooling,
no CLS). The paper reports 88.43 for Combiner-Axial on Pathfinder-inter (its
Transformer: 88.81), see combiner_axial_inter.py; it reports nothing on the
default 'hard' split.

Options: see base.py (`runlocal`, `xiong`, `cst`). The protocol and the axial
plan: configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'axial', row_length=32)
