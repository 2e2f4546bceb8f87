r"""Retrieval with Combiner-Axial (arXiv:2107.05768).

  python -m lra_msmra.main \
      --config configs/retrieval/combiner_axial.py:runlocal \
      --workdir /tmp/retrieval_combiner_axial

Default row length: 4000 tokens -> a 63 x 64 grid (m = 64). The paper reports
56.10 for Combiner-Axial (its Transformer: 57.46; docs/mechanisms/combiner.md
§10).

Options: see base.py (`runlocal`, `xiong`, `cst`). The protocol and the axial
plan: configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'axial')
