r"""Combiner attention (arXiv:2107.05768): settings of every task.

Each `configs/<task>/combiner_fixed.py` and `combiner_axial.py` calls `apply`
on its task's base config and states only what is task-specific (the grid or
blocks at the task's length, the paper's numbers); this docstring holds what
applies to every task.

Combiner's LRA protocol: the official LRA config with the attention swapped
(paper §5.2.1; docs/protocol.md §5, §9). No extra parameters, so the model
matches the LRA Transformer's count. The paper does not state its LRA hardware
or block sizes (Appendix E is missing). The `xiong` and `cst` options of base.py
apply as for any mechanism.

Combiner-Fixed: the block size is the default power of two nearest to
sqrt(N), computed from the input length N (CLS included).

Combiner-Axial: the paper does not say which axial plan it used on LRA. We
use 'vertical' (direct own row and column, column spans above and below,
max-pooled): the official code's 'rowmajor' adds two projections and a
LayerNorm per layer, which breaks the 110% parameter budget (docs/protocol.md
§10.2) on ListOps, Text, Retrieval and Pathfinder (+23%, +15%, +12%, +16%). The
row length is the default power of two nearest to sqrt(N), except on image
tasks, whose configs set it to the image width so that image rows are grid rows.
"""

from __future__ import annotations

import ml_collections


def apply(config: ml_collections.ConfigDict, variant: str,
          row_length: int | None = None) -> ml_collections.ConfigDict:
  """Swaps in Combiner.

  Args:
    config: a task's base config, modified in place.
    variant: 'fixed' or 'axial'.
    row_length: axial only: the grid width; None = the default power of two
      nearest to sqrt(N).

  Returns:
    `config`.
  """
  config.model.attention = 'combiner'
  kw = config.model.attention_kw
  kw.variant = variant
  if variant == 'axial':
    kw.axial_plan = 'vertical'
  if row_length is not None:
    kw.row_length = row_length
    # A CLS token exists only with CLS pooling (models.create_model); it then
    # ends an extra first row, so the image rows stay grid rows.
    if config.model.pooling == 'CLS':
      kw.num_prefix_tokens = 1
  return config
