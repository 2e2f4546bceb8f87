r"""Retrieval with Combiner-Fixed (arXiv:2107.05768).

  python -m lra_msmra.main \
      --config configs/retrieval/combiner_fixed.py:runlocal \
      --workdir /tmp/retrieval_combiner_fixed

Default block size: 4000 tokens per document (no CLS) -> s = 64, 63 blocks
(padded to 4032). The paper reports 59.81 for Combiner-Fixed (its Transformer:
57.46; docs/mechanisms/combiner.md §10).

Options: see base.py (`runlocal`, `xiong`, `cst`). The protocol and the block
size: configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'fixed')
