r"""Image with Combiner-Fixed (arXiv:2107.05768).

  python -m lra_msmra.main --config configs/image/combiner_fixed.py:runlocal \
      --workdir /tmp/image_combiner_fixed

Default block size: 1025 tokens (CLS + 1024 pixels) -> s = 32, 33 blocks
(padded to 1056). The paper reports 41.67 for Combiner-Fixed (its Transformer:
42.44; docs/mechanisms/combiner.md §10).

Options: see base.py (`runlocal`, `xiong`, `cst`). The protocol and the block
size: configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'fixed')
