r"""ListOps with Composite Slice Attention (`cst`, docs/mechanisms/cst.md).

  python -m lra_msmra.main --config configs/listops/cst.py:runlocal \
      --workdir /tmp/listops_cst

`runlocal` (generated expressions of at most 100 tokens, 1500 steps, L = 8:
13 slices): its wall time and test accuracy, beside the other mechanisms'
and the majority-class rate, are in docs/runlocal.md, written by the
command given there.

Without an option: the official LRA config (docs/protocol.md §5.1) with only the
attention swapped. 2000 tokens plus CLS are padded inside each layer to 2008
(251 slices of 8). LRA reports 36.37% for the Transformer; no CST number
exists for this protocol.

`:cst`: the CST paper's setup, 2000 tokens in 250 slices. The paper reports
37.45% test accuracy with L = 8 (this file) and 37.90% with L = 16
(`cst_l16.py`).

The knobs, the parameter rule, the learning-rate search and the ablation
overrides: configs/common/cst.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/cst')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
