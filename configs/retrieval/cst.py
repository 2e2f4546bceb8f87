r"""Retrieval (byte-level AAN) with Composite Slice Attention (`cst`).

  python -m lra_msmra.main --config configs/retrieval/cst.py:runlocal \
      --workdir /tmp/retrieval_cst

Without an option: the official LRA config (docs/protocol.md §5.3) with only the
attention swapped. Each document of 4000 bytes is 500 slices of 8 (the dual
encoder has no CLS token). LRA reports 57.46% for the Transformer; no CST
number exists for this protocol.

`:cst`: the CST paper's setup, 4000 bytes per document in 500 slices. The
paper reports 84.15% test accuracy with L = 8 (this file) and 84.00% with
L = 16 (`cst_l16.py`).

The knobs, the parameter rule, the learning-rate search and the ablation
overrides: configs/common/cst.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/cst')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
