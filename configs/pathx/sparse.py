r"""Path-X with Sparse Transformer attention (`sparse`, fixed pattern).

  python -m lra_msmra.main --config configs/pathx/sparse.py:runlocal \
      --workdir /tmp/pathx_sparse

LRA has no per-model Path-X config: the Transformer's config with the
attention swapped, l = 50 and c = 10 as on every task. Same parameter count
as the LRA Transformer (537,954). At 16384 pixels every query sees about
3,600 summary keys (N (c + 1) / l): the fixed pattern stays quadratic.
Every model of the LRA paper FAILs Path-X.

Options: `runlocal`. What applies to every task: configs/common/sparse.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sparse')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
