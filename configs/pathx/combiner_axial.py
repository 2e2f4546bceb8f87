r"""Path-X with Combiner-Axial (arXiv:2107.05768).

  python -m lra_msmra.main --config configs/pathx/combiner_axial.py:runlocal \
      --workdir /tmp/pathx_combiner_axial

`row_length=128`, so image rows are grid rows: a 128 x 128 grid (MEAN
pooling, no CLS). The paper does not report Path-X; every model of the LRA
paper FAILs it (docs/protocol.md §10.1).

Options: `runlocal`. The protocol and the axial plan:
configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'axial', row_length=128)
