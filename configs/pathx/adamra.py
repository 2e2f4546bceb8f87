r"""Path-X (Pathfinder 128x128) with AdaMRA attention (arXiv:2108.04962).

  python -m lra_msmra.main --config configs/pathx/adamra.py:runlocal \
      --workdir /tmp/pathx_adamra

Options: `runlocal` (see base.py). Neither the paper nor Xiong et al. define
Path-X; every model of the LRA paper FAILs it (PROTOCOL §10.1).

AdaMRA knobs (lra_msmra/attention/adamra.py lists every choice): the paper's
Table 1 setting of three resolution heads with compression rates (1/2, 1/8,
1/32) (its ablation row 3), router gated by its probability so it learns,
masked segment means; `num_heads` is the number of subheads S per resolution
head. 16384 pixels are a multiple of 32.

* Default (the official LRA config with the attention swapped): projections
  `'stacked'`, because the learned position table dominates, so the paper's
  stacked per-head projections fit: 540,306 parameters, 1.004x the 537,954 of
  the LRA Transformer.
"""

import ml_collections

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')

# The paper's Table 1 rates: three resolution heads, coarse to fine.
PAPER_RATES = (1 / 2, 1 / 8, 1 / 32)


def get_config(arg=None) -> ml_collections.ConfigDict:
  config = base.get_config(arg)
  config.model.attention = 'adamra'
  # The paper's stacked projections fit the LRA rule (<= 110% of the LRA
  # Transformer's parameters).
  config.model.attention_kw = ml_collections.ConfigDict(dict(
      compression_rates=PAPER_RATES, router_gate='prob',
      segment_means='masked', projections='stacked'))
  return config
