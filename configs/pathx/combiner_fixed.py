r"""Path-X with Combiner-Fixed (arXiv:2107.05768).

  python -m lra_msmra.main --config configs/pathx/combiner_fixed.py:runlocal \
      --workdir /tmp/pathx_combiner_fixed

Default block size: 16384 pixels (no CLS) -> s = 128, 128 blocks. The paper
does not report Path-X; every model of the LRA paper FAILs it (docs/protocol.md
§10.1).

Options: `runlocal`. The protocol and the block size:
configs/common/combiner.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/combiner')


def get_config(arg=None):
  return common.apply(base.get_config(arg), 'fixed')
