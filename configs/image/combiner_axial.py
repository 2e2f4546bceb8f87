r"""Image with Combiner-Axial (arXiv:2107.05768).

  python -m lra_msmra.main --config configs/image/combiner_axial.py:runlocal \
      --workdir /tmp/image_combiner_axial

`row_length=32`, so image rows are grid rows; with CLS pooling the CLS token
ends an extra first row (`num_prefix_tokens=1`): a 33 x 32 grid. Without CLS
(the `xiong` and `cst` options pool by mean) the grid is 32 x 32. The paper
reports 41.33 for Combiner-Axial (its Transformer: 42.44;
docs/mechanisms/combiner.md §10).

Options: see base.py (`runlocal`, `xiong`, `cst`). The protocol and the axial
plan: configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'axial', row_length=32)
