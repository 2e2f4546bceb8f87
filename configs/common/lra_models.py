r"""The official LRA per-model settings, for the LRA leaderboard models.

For some tasks and models the LRA repository has a config
`lra_benchmarks/<task>/configs/<model>_base.py` (on Image and Pathfinder one
per model, `image/configs/{cifar10,pathfinder32}/<model>_base.py`) that
starts from the task's base config, not from the Transformer's, and changes
the model's size (layers, widths, heads) and a few other settings (pooling,
dropout, weight decay). ListOps, Text and Retrieval mostly use the task's
base model for every model. The knobs of each attention (block sizes,
windows, ranks) come from the model's encoder defaults in
`lra_benchmarks/models/<model>/`, where no config sets them.

Our rule under the LRA protocol (no option):

* every setting of the model's official config that does not change the
  parameter count (heads, pooling, dropout, weight decay) is kept;
* its sizes (layers, emb_dim, qkv_dim, mlp_dim) are kept only if the model
  then stays within 110% of the LRA Transformer's parameters, the
  leaderboard's rule (docs/protocol.md §10.2, checked for every config by
  tests/test_configs.py); otherwise the Transformer's sizes of the task are
  used, and the task's config says so;
* an attention knob that adds parameters of its own (Linformer's E,
  Synthesizer's tables) keeps its official value where the model fits and
  is reduced otherwise, as the mechanism's file in configs/common/ explains;
* Path-X has no per-model config: the Transformer's config with the
  attention swapped, the knobs at their Pathfinder values.

The `xiong` and `cst` options fix the model of their protocol, and
`runlocal` its small model; none of them takes these per-model settings
(the attention's knobs still apply).
"""

from __future__ import annotations

from typing import Any

import ml_collections


def official(config: ml_collections.ConfigDict, opts: set[str], *,
             weight_decay: float | None = None,
             **model: Any) -> ml_collections.ConfigDict:
  """Sets the fields of the official per-model config that the rule keeps.

  Only under the LRA protocol without `runlocal` (module docstring). With
  `mlp_dim`, a single-input task's classifier hidden layer follows it too,
  as the official classifier head is one layer of mlp_dim.

  Args:
    config: a task's config, modified in place.
    opts: the parsed options of the config.
    weight_decay: the official file's weight decay, if it sets one.
    **model: `config.model` fields and their official values.

  Returns:
    `config`.

  Raises:
    KeyError: a name in `model` is not a field of `config.model` (under
      every option, so that a misspelt key never goes unnoticed).
  """
  for key in model:
    if key not in config.model:
      raise KeyError(f'config.model has no field {key!r}.')
  if config.protocol == 'lra' and 'runlocal' not in opts:
    for key, value in model.items():
      config.model[key] = value
    if 'mlp_dim' in model and config.task != 'retrieval':
      config.model.head_hidden = (model['mlp_dim'],)
    if weight_decay is not None:
      config.optimizer.weight_decay = weight_decay
  return config

