r"""Path-X with local attention (`local`).

  python -m lra_msmra.main --config configs/pathx/local.py:runlocal \
      --workdir /tmp/pathx_local

LRA has no per-model Path-X config: the Transformer's config with the
attention swapped, blocks of 64 pixels as on Pathfinder (16384 pixels ->
256 blocks). Same parameter count as the LRA Transformer (537,954). Every
model of the LRA paper FAILs Path-X.

Options: `runlocal`. What applies to every task: configs/common/local.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/local')


def get_config(arg=None):
  return common.apply(base.get_config(arg), common.IMAGE_BLOCK_SIZE)
