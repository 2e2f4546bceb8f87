r"""AdaMRA attention (arXiv:2108.04962): settings of every task.

Each `configs/<task>/adamra.py` calls `apply` on its task's base config and
states only what is task-specific (padding, parameter counts, the paper's
number); this docstring holds what applies to every task. The paper reports
its LRA numbers (Table 1) under the `xiong` protocol and states no hardware
for those runs.

Knobs (docs/mechanisms/adamra.md explains every choice): the paper's
Table 1 setting of three resolution heads with compression rates (1/2, 1/8,
1/32) (its ablation row 3), router gated by its probability so it learns,
masked segment means; `num_heads` is the number of subheads S per resolution
head. Inputs are right-padded internally to a multiple of 32, the least
common multiple of the segment lengths 2, 8 and 32.

Projections, by protocol:

* Default (the official LRA config with the attention swapped): the LRA rule
  (<= 110% of the LRA Transformer's parameters) decides; the paper's stacked
  per-head projections (13 D^2 per layer, against softmax's 4 D^2) break it
  on most tasks, so each task picks the largest layout that fits
  (`lra_projections`).
* `xiong` (the paper's protocol, docs/protocol.md §8 and
  docs/mechanisms/adamra.md §9): 2 layers, D = 64, S = 2 subheads of width 32 (S
  is not reported; this matches the 2 x 32 heads of the protocol) and the
  paper's stacked projections, with the biases and PyTorch initialisation of
  that protocol.
* `cst`: the CST paper's protocol with the paper's stacked projections (no
  parameter rule applies there).
"""

import ml_collections

from lra_msmra import config_lib

# The paper's Table 1 rates: three resolution heads, coarse to fine.
PAPER_RATES = (1 / 2, 1 / 8, 1 / 32)


def apply(config: ml_collections.ConfigDict,
          lra_projections: str = 'single') -> ml_collections.ConfigDict:
  """Swaps in AdaMRA at the paper's setting.

  Args:
    config: a task's base config, modified in place.
    lra_projections: the projection layout under the LRA protocol, the
      largest that keeps the task's model within 110% of the LRA
      Transformer's parameters; other protocols use the paper's `'stacked'`.

  Returns:
    `config`.
  """
  config.model.attention = 'adamra'
  layout = lra_projections if config.protocol == 'lra' else 'stacked'
  config.model.attention_kw = config_lib.attention_kw(dict(
      compression_rates=PAPER_RATES, router_gate='prob',
      segment_means='masked', projections=layout))
  return config
