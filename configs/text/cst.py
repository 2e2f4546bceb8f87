r"""Text (byte-level IMDb) with Composite Slice Attention (`cst`).

  python -m lra_msmra.main --config configs/text/cst.py:runlocal \
      --workdir /tmp/text_cst

Without an option: the official LRA config (docs/protocol.md §5.2) with only the
attention swapped. 1000 bytes plus CLS are padded inside each layer to 1008
(126 slices of 8). LRA reports 64.27% for the Transformer; no CST number
exists for this protocol.

`:cst`: the CST paper's setup, 4000 bytes in 500 slices. The paper reports
77.23% test accuracy with L = 8 (this file) and 73.60% with L = 16
(`cst_l16.py`).

The knobs, the parameter rule, the learning-rate search and the ablation
overrides: configs/common/cst.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/cst')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
