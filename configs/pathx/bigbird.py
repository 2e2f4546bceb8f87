r"""Path-X with BigBird attention (`bigbird`).

  python -m lra_msmra.main --config configs/pathx/bigbird.py:runlocal \
      --workdir /tmp/pathx_bigbird

LRA has no per-model Path-X config: the Transformer's config with the
attention swapped, blocks of 64 and 3 random blocks (drawn within the first
1024 pixels, as the official code does), attention dropout 0. Same parameter
count as the LRA Transformer (537,954). Every model of the LRA paper FAILs
Path-X.

Options: `runlocal`. What applies to every task: configs/common/bigbird.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/bigbird')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  return common.apply(base.get_config(arg), opts, image=True)
