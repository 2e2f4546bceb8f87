r"""Path-X with Longformer attention (`longformer`).

  python -m lra_msmra.main --config configs/pathx/longformer.py:runlocal \
      --workdir /tmp/pathx_longformer

LRA has no per-model Path-X config: the Transformer's config with the
attention swapped, a window of 512 pixels, no global token. Same parameter
count as the LRA Transformer (537,954). Every model of the LRA paper FAILs
Path-X.

Options: `runlocal`. What applies to every task: configs/common/longformer.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/longformer')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  return common.apply(base.get_config(arg), opts, image=True)
