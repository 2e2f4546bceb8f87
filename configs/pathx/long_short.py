r"""Path-X with Transformer-LS attention (`long_short`, arXiv:2107.02192).

  python -m lra_msmra.main --config configs/pathx/long_short.py:runlocal \
      --workdir /tmp/pathx_long_short

Options: `runlocal`. The official LRA config with the attention swapped, at
the paper's fixed LRA setting (w, r) = (8, 32): 540,066 parameters, 100.4% of
the LRA Transformer's (docs/protocol.md §11). The paper does not report Path-X.
The knobs: configs/common/long_short.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/long_short')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
