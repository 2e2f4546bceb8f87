r"""Retrieval with Sparse Transformer attention (`sparse`, fixed pattern).

  python -m lra_msmra.main --config configs/retrieval/sparse.py:runlocal \
      --workdir /tmp/retrieval_sparse

The official config (`matching/configs/sparse_transformer_base.py`) is the
base config with the model swapped: l = 50, c = 10 (4000 bytes per
document). As in the official encoder, whose `use_cls_token` follows the CLS
pooling even without a CLS token, the first byte of each document is outside
the pattern. Same parameter count as the LRA Transformer (1,087,618). The
LRA leaderboard reports 59.59.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/sparse.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sparse')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
