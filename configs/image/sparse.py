r"""Image with Sparse Transformer attention (`sparse`, fixed pattern).

  python -m lra_msmra.main --config configs/image/sparse.py:runlocal \
      --workdir /tmp/image_sparse

The official config (`image/configs/cifar10/sparse_transformer_base.py`)
is the Transformer's (1 layer, 8 heads, 128/64/128, CLS pooling) with the
model swapped: l = 50, c = 10, CLS outside the pattern. Same parameter
count as the LRA Transformer (248,458). The LRA leaderboard reports 44.24.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/sparse.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sparse')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
