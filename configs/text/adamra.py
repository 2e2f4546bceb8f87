r"""Text (byte-level IMDb) with AdaMRA attention (arXiv:2108.04962).

  python -m lra_msmra.main --config configs/text/adamra.py:runlocal \
      --workdir /tmp/text_adamra

Options: see base.py (`runlocal`, `xiong`, `cst`). The paper reports 68.44%
(Table 1) under the `xiong` protocol. The knobs and the projections of each
protocol: configs/common/adamra.py.

1000 bytes + CLS are padded internally to 1024 (4096 with `xiong`, 4000 with
`cst`). Default: projections `'single'`, because stacked per-head
projections would give 1.68x and head-shared ones 1.23x the 3,486,722
parameters of the LRA Transformer; `'single'` has 3,489,794 (+0.09%).
"""

import ml_collections

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/adamra')


def get_config(arg=None) -> ml_collections.ConfigDict:
  return common.apply(base.get_config(arg), lra_projections='single')
