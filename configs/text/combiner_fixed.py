r"""Text with Combiner-Fixed (arXiv:2107.05768).

  python -m lra_msmra.main --config configs/text/combiner_fixed.py:runlocal \
      --workdir /tmp/text_combiner_fixed

Default block size: 1001 tokens (CLS + 1000) -> s = 32, 32 blocks (padded to
1024). The paper reports 64.99 for Combiner-Fixed (its Transformer: 64.27;
docs/mechanisms/combiner.md §10).

Options: see base.py (`runlocal`, `xiong`, `cst`). The protocol and the block
size: configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'fixed')
