r"""Longformer attention (`longformer`): settings of every task.

Each `configs/<task>/longformer.py` calls `apply` on its task's base config
and states only what is task-specific; this docstring holds what applies to
every task. How official per-model settings are taken:
configs/common/lra_models.py.

Knobs (lra_msmra/attention/longformer.py lists every choice): a sliding
window of w = 512 keys (256 before the query, itself included, and 256
after), the official encoder's default, which no LRA config changes, and
no global token: LRA passes no global mask (`global_mask=None`), so its
Longformer is the sliding window alone. The paper's classification setting
(global attention on the CLS token) is
`--config.model.attention_kw.num_global_tokens=1`, which adds the paper's
separate global projections (3 x qkv_dim x emb_dim per layer).

Without global tokens the model has the Transformer's parameter count (the
official code creates the global projections anyway, unused).

`runlocal` uses w = 32 on the text-like tasks, whose runlocal inputs (at
most 257 tokens) a 512-wide window would cover entirely.
"""

import ml_collections

from lra_msmra import config_lib

WINDOW_SIZE = 512
RUNLOCAL_WINDOW_SIZE = 32


def apply(config: ml_collections.ConfigDict, opts: set[str],
          image: bool = False) -> ml_collections.ConfigDict:
  """Swaps in Longformer (w = 512, no global token); returns `config`."""
  config.model.attention = 'longformer'
  window = WINDOW_SIZE
  if 'runlocal' in opts and not image:
    window = RUNLOCAL_WINDOW_SIZE
  config.model.attention_kw = config_lib.attention_kw(dict(
      window_size=window, num_global_tokens=0, global_projections=True))
  return config
