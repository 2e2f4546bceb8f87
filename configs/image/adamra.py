r"""Image (grayscale CIFAR-10) with AdaMRA attention (arXiv:2108.04962).

  python -m lra_msmra.main --config configs/image/adamra.py:runlocal \
      --workdir /tmp/image_adamra

Options: see base.py (`runlocal`, `xiong`, `cst`). The paper reports 46.00%
(Table 1) under the `xiong` protocol. The knobs and the projections of each
protocol: configs/common/adamra.py.

1024 pixels + CLS are padded internally to 1056. Default: projections
`'stacked_shared'`, because stacked per-head projections would give 1.15x
the 248,458 parameters of the LRA Transformer; head-shared second-stage
projections (`'stacked_shared'`) fit with 260,938 (1.05x).
"""

import ml_collections

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/adamra')


def get_config(arg=None) -> ml_collections.ConfigDict:
  return common.apply(base.get_config(arg), lra_projections='stacked_shared')
