r"""Image (sequential CIFAR-10) with Composite Slice Attention (`cst`).

  python -m lra_msmra.main --config configs/image/cst.py:runlocal \
      --workdir /tmp/image_cst

Without an option: the official LRA config (docs/protocol.md §5.4) with only the
attention swapped. 1024 pixels plus CLS are padded inside each layer to 1032
(129 slices of 8, i.e. 8-pixel pieces of image rows). MS-VIPE replaces the
learned input position table, so the model is smaller than the LRA
Transformer. LRA reports 42.44% for the Transformer; no CST number exists
for this protocol.

`:cst`: the CST paper's setup, 1024 pixels in 128 slices. The paper reports
51.27% test accuracy with L = 8 (this file) and 51.39% with L = 16
(`cst_l16.py`).

The knobs, the learning-rate search and the ablation overrides:
configs/common/cst.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/cst')


def get_config(arg=None):
  return common.apply(base.get_config(arg))
