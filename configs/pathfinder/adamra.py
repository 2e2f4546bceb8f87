r"""Pathfinder (32x32) with AdaMRA attention (arXiv:2108.04962).

  python -m lra_msmra.main --config configs/pathfinder/adamra.py:runlocal \
      --workdir /tmp/pathfinder_adamra

Options: see base.py (`runlocal`, `xiong`, `cst`). The paper reports 75.77%
(Table 1) under the `xiong` protocol. The knobs and the projections of each
protocol: configs/common/adamra.py.

1024 pixels are a multiple of 32. Default: projections `'single'`, because
stacked per-head projections would give 1.35x and head-shared ones 1.12x the
26,530 parameters of the LRA Transformer; `'single'` has 26,722 (+0.7%).
"""

import ml_collections

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/adamra')


def get_config(arg=None) -> ml_collections.ConfigDict:
  return common.apply(base.get_config(arg), lra_projections='single')
