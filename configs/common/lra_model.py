r"""Per-model LRA hyperparameters: what an official `<model>_base.py` changes.

The official LRA repository has, for some tasks and models, a config
`lra_benchmarks/<task>/configs/<model>_base.py` that starts from the task's
base config (not from the Transformer's) and changes the model's size,
dropout or weight decay. `apply` makes those changes on our task config,
which already holds the LRA Transformer's values, so a mechanism config
states only the values its official file sets, or that its official file
leaves at a base value that differs from the Transformer's.

They apply under the LRA protocol only: the `xiong` and `cst` protocols fix
their own model, and `runlocal` its small CPU model.

A config whose official per-model setting is more than 110% of the LRA
Transformer's parameter count says so in a module-level `OVER_BUDGET`
string (tests/test_configs.py checks that the statement holds).
"""

from __future__ import annotations

import ml_collections

_MODEL_KEYS = ('num_layers', 'num_heads', 'emb_dim', 'qkv_dim', 'mlp_dim',
               'dropout_rate', 'attention_dropout_rate', 'pooling', 'pos_emb')


def applies(config: ml_collections.ConfigDict, arg: str | None) -> bool:
  """Whether per-model LRA settings apply to `config` built from `arg`."""
  opts = {a.strip() for a in (arg or '').split(',')}
  return config.protocol == 'lra' and 'runlocal' not in opts


def apply(config: ml_collections.ConfigDict, arg: str | None, *,
          weight_decay: float | None = None, **model: object
          ) -> ml_collections.ConfigDict:
  """Sets the official per-model values (LRA protocol, not runlocal).

  Args:
    config: the task's config (the LRA Transformer's values), in place.
    arg: the options it was built with.
    weight_decay: the official file's weight decay, if it sets one.
    **model: official values of `config.model` keys (`_MODEL_KEYS`). With
      `mlp_dim`, single-input tasks also get a classifier hidden layer of
      that width, as the official classifier head uses mlp_dim.

  Returns:
    `config`.
  """
  unknown = set(model) - set(_MODEL_KEYS)
  if unknown:
    raise ValueError(f'Unknown per-model keys {sorted(unknown)}; valid: '
                     f'{_MODEL_KEYS}.')
  if not applies(config, arg):
    return config
  for key, value in model.items():
    config.model[key] = value
  if 'mlp_dim' in model and config.task != 'retrieval':
    config.model.head_hidden = (model['mlp_dim'],)
  if weight_decay is not None:
    config.optimizer.weight_decay = weight_decay
  return config
