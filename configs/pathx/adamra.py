r"""Path-X (Pathfinder 128x128) with AdaMRA attention (arXiv:2108.04962).

  python -m lra_msmra.main --config configs/pathx/adamra.py:runlocal \
      --workdir /tmp/pathx_adamra

Options: `runlocal` (see base.py). Neither the paper nor Xiong et al. define
Path-X; every model of the LRA paper FAILs it (docs/protocol.md §10.1). The
knobs: configs/common/adamra.py.

16384 pixels are a multiple of 32. Projections `'stacked'`: the learned
position table dominates, so the paper's stacked per-head projections fit
the LRA rule: 540,306 parameters, 1.004x the 537,954 of the LRA Transformer.
"""

import ml_collections

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/adamra')


def get_config(arg=None) -> ml_collections.ConfigDict:
  return common.apply(base.get_config(arg), lra_projections='stacked')
