r"""Retrieval (byte-level AAN) with AdaMRA attention (arXiv:2108.04962).

  python -m lra_msmra.main --config configs/retrieval/adamra.py:runlocal \
      --workdir /tmp/retrieval_adamra

Options: see base.py (`runlocal`, `xiong`, `cst`). The paper reports 84.83%
(Table 1) under the `xiong` protocol. The knobs and the projections of each
protocol: configs/common/adamra.py.

4000 bytes per document are a multiple of 32 (4096 with `xiong`). Default:
projections `'single'`, because stacked per-head projections would give
1.54x and head-shared ones 1.18x the 1,087,618 parameters of the LRA dual
encoder; `'single'` has 1,089,154 (+0.14%).
"""

import ml_collections

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/adamra')


def get_config(arg=None) -> ml_collections.ConfigDict:
  return common.apply(base.get_config(arg), lra_projections='single')
