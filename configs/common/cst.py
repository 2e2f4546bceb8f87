r"""Composite Slice Attention (`cst`): settings of every task.

Each `configs/<task>/cst.py` calls `apply` on its task's base config and
states only what is task-specific (slice counts, the paper's numbers); this
docstring holds what applies to every task.

Knobs (docs/mechanisms/cst.md explains every choice): the paper's main
setting (Table 1), slices of L = 8 tokens without extension (alpha = 1),
local attention inside each slice, then global attention over the slice
means, one set of Q/K/V/O projections for both (A.3), and MS-VIPE position
tables added inside every layer (Section 4.2), which replace the input
position embedding (`model.pos_emb = 'none'`).

Without an option (the official LRA config with only the attention swapped)
the model stays within 110% of the LRA Transformer's parameters
(docs/protocol.md §10.2, checked by tests/test_configs.py).

`:cst`: the CST paper's setup (Table 6, docs/protocol.md §9.1). Its numbers come
from its PyTorch port on one V100 (Table 1), with L = 8 (`cst.py`) and
L = 16 (`cst_l16.py`). It picks the learning rate on validation from
{0.5, 1, 2} x the one its task's base.py sets
(`--config.schedule.learning_rate=...`).

Ablations of Tables 7 and 8 are overrides of the knobs, e.g.
`--config.model.attention_kw.alpha=2`, `...composition=parallel` or
`global_first`, `...aggregation=max` or `linear`,
`...share_local_global=False`. The "Conventional" position ablation is
`--config.model.attention_kw.position_embedding=none
--config.model.pos_emb=learned`.
"""

import ml_collections

from lra_msmra import config_lib


def apply(config: ml_collections.ConfigDict,
          slice_length: int = 8) -> ml_collections.ConfigDict:
  """Swaps in CST at the paper's setting.

  Args:
    config: a task's base config, modified in place.
    slice_length: L, tokens per slice (the paper's main setting: 8).

  Returns:
    `config`.
  """
  config.model.attention = 'cst'
  config.model.attention_kw = config_lib.attention_kw(dict(
      slice_length=slice_length,
      # alpha * L keys per slice: no extension into the neighbouring slices.
      alpha=1,
      # Local attention, then global attention over the slice means.
      composition='local_first',
      aggregation='mean',
      # One set of Q/K/V/O projections for both attentions (A.3).
      share_local_global=True,
      position_embedding='ms_vipe',
      position_init_std=0.02,
  ))
  # MS-VIPE adds its tables inside every layer instead (Section 4.2).
  config.model.pos_emb = 'none'
  return config
