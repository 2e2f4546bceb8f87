r"""ListOps with Sparse Transformer attention (`sparse`, fixed pattern).

  python -m lra_msmra.main --config configs/listops/sparse.py:runlocal \
      --workdir /tmp/listops_sparse

The official config (`listops/configs/sparse_transformer_base.py`) is the
base config with the model swapped: l = 50, c = 10 (2001 tokens with CLS).
Same parameter count as the LRA Transformer (8,948,746). The LRA leaderboard
reports 17.07.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/sparse.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sparse')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
