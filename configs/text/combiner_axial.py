r"""Text with Combiner-Axial (arXiv:2107.05768).

  python -m lra_msmra.main --config configs/text/combiner_axial.py:runlocal \
      --workdir /tmp/text_combiner_axial

Default row length: 1001 tokens -> a 32 x 32 grid (m = 32). The paper reports
64.36 for Combiner-Axial (its Transformer: 64.27; docs/mechanisms/combiner.md
§10).

Options: see base.py (`runlocal`, `xiong`, `cst`). The protocol and the axial
plan: configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'axial')
