"""Checks a whole config before anything runs.

Each section has its owner: `config_lib.check` (the keys of the config and
its top-level values), `models.check_config` (config.model and, through the
attention's `check_knobs` hook, config.model.attention_kw),
`optim.check_config` (config.optimizer and config.schedule) and the task's
data module (config.data, through its model spec). `validate` runs them in
that order and then traces one layer of the model at the task's input length
with `jax.eval_shape` (nothing computed or allocated), so that what a
mechanism can only check against the length (a length that is not a multiple
of its block, a causal mode it refuses with these knobs) fails here, before
the data is loaded, with a message naming the key to change.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import ml_collections

from lra_msmra import config_lib
from lra_msmra import data as data_lib
from lra_msmra import models
from lra_msmra import optim


def validate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Checks `config`; returns the task's model spec (see `models.create_model`).

  Raises:
    ValueError: naming the config key and the fix.
  """
  config_lib.check(config)
  models.check_config(config.model)
  optim.check_config(config.optimizer, config.schedule,
                     config.num_train_steps)
  spec = data_lib.get_model_spec(config)
  if not config_lib.is_int(spec['max_len']) or spec['max_len'] < 1:
    raise ValueError(
        f'config.data of task {config.task!r} gives an input length of '
        f"{spec['max_len']!r}; set config.data.max_length (or the task's "
        'length key) to a positive integer.')
  _trace_one_layer(config, spec)
  return spec


def _trace_one_layer(config: ml_collections.ConfigDict,
                     spec: Mapping[str, Any]) -> None:
  """Traces a one-layer copy of the model at the task's input length.

  Every layer is built from the same fields, so one layer reaches every
  check a mechanism makes at call time.
  """
  model_cfg = config.model.to_dict()
  model_cfg['num_layers'] = 1
  model = models.create_model(model_cfg, **spec)
  batch = {'inputs': jax.ShapeDtypeStruct((1, spec['max_len']), 'int32')}
  if spec['dual']:
    batch['inputs2'] = batch['inputs']

  def init(b):
    rngs = {'params': jax.random.PRNGKey(0), 'dropout': jax.random.PRNGKey(1)}
    return model.init(rngs, b, deterministic=False)

  m = config.model
  try:
    jax.eval_shape(init, batch)
  except NotImplementedError as e:
    raise models.unsupported(m, e) from e
  except (ValueError, TypeError) as e:
    raise ValueError(
        f'The model of config.model (attention={m.attention!r}, '
        f'attention_kw={dict(m.attention_kw)}) does not build for task '
        f"{config.task!r} at input length {spec['max_len']}: {e} Fix the "
        'knob it names in config.model.attention_kw or config.model, or the '
        'input length in config.data.') from e
