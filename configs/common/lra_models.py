r"""The official LRA per-model settings, for the LRA leaderboard models.

For the image tasks the LRA repository has one config per model
(`lra_benchmarks/image/configs/{cifar10,pathfinder32}/<model>_base.py`),
which changes the model's size (layers, widths, heads) and a few other
settings (pooling, dropout) against the Transformer's; ListOps, Text and
Retrieval use the task's base model for every model. The knobs of each
attention (block sizes, windows, ranks) come from the model's encoder
defaults in `lra_benchmarks/models/<model>/`, where no config sets them.

Our rule under the LRA protocol (no option):

* every setting of the model's official config that does not change the
  parameter count (heads, pooling, dropout, the attention's knobs) is kept;
* its sizes (layers, emb_dim, qkv_dim, mlp_dim) are kept only if the model
  then stays within 110% of the LRA Transformer's parameters, the
  leaderboard's rule (checked by tests/test_configs.py); otherwise the
  Transformer's sizes of the task are used, and the task's config says so;
* Path-X has no per-model config: the Transformer's config with the
  attention swapped, the knobs at their Pathfinder values.

The `xiong` and `cst` options fix the model of their protocol, and
`runlocal` its small model; none of them takes these per-model settings
(the attention's knobs still apply).
"""

from __future__ import annotations

from typing import Any

import ml_collections


def official(config: ml_collections.ConfigDict, opts: set[str],
             **model: Any) -> ml_collections.ConfigDict:
  """Sets `config.model` fields of the official per-model config.

  Only under the LRA protocol without `runlocal` (module docstring).

  Args:
    config: a task's config, modified in place.
    opts: the parsed options of the config.
    **model: `config.model` fields and their official values.

  Returns:
    `config`.
  """
  if config.protocol == 'lra' and 'runlocal' not in opts:
    for key, value in model.items():
      if key not in config.model:
        raise KeyError(f'config.model has no field {key!r}.')
      config.model[key] = value
  return config


def has_cls_token(config: ml_collections.ConfigDict) -> bool:
  """Whether the encoder prepends a CLS token (`models.create_model`)."""
  return config.model.pooling == 'CLS' and config.task != 'retrieval'
