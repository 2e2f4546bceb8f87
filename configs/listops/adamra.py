r"""ListOps with AdaMRA attention (arXiv:2108.04962).

  python -m lra_msmra.main --config configs/listops/adamra.py:runlocal \
      --workdir /tmp/listops_adamra

Options: see base.py (`runlocal`, `xiong`, `cst`). The paper reports 40.40%
(Table 1) under the `xiong` protocol. The knobs and the projections of each
protocol: configs/common/adamra.py.

2000 tokens + CLS are padded internally to 2016 (a multiple of 32).

* Default: projections `'single'`, because the paper's stacked per-head
  projections would give 2.06x and the head-shared ones 1.35x the 8,948,746
  parameters of the LRA Transformer; `'single'` has 8,954,890 (+0.07%: the
  routers).
* `runlocal`: rates (1/2, 1/4, 1/8), since the expressions have at most 100
  tokens (+ CLS): the paper's coarsest head would keep 4 landmarks.
"""

import ml_collections

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/adamra')


def get_config(arg=None) -> ml_collections.ConfigDict:
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = common.apply(base.get_config(arg), lra_projections='single')
  if 'runlocal' in opts:
    # At most 101 tokens: keep the coarsest head above a handful of landmarks.
    config.model.attention_kw.compression_rates = (1 / 2, 1 / 4, 1 / 8)
  return config
