r"""ListOps with Combiner-Fixed (arXiv:2107.05768).

  python -m lra_msmra.main --config configs/listops/combiner_fixed.py:runlocal \
      --workdir /tmp/listops_combiner_fixed

Default block size: 2001 tokens (CLS + 2000) -> s = 32, 63 blocks (padded to
2016). The paper reports 36.65 for Combiner-Fixed (its Transformer: 36.38;
docs/mechanisms/combiner.md §10).

Options: see base.py (`runlocal`, `xiong`, `cst`). The protocol and the block
size: configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'fixed')
