"""Checks a whole config before anything runs.

Each section has its owner: `config_lib.check` (the keys of the config and
its top-level values), `models.check_config` (config.model and, through the
attention's `check_knobs` hook, config.model.attention_kw),
`optim.check_config` (config.optimizer and config.schedule) and the task's
data module (config.data, through its model spec). `trace` runs them in that
order and then traces the initialisation of the whole train state (model and
optimizer) at the task's input length with `jax.eval_shape` (nothing
computed or allocated), so that what a mechanism can only check against the
length (a length that is not a multiple of its block, a causal mode it
refuses with these knobs) fails here, before the data is loaded, with a
message naming the key to change. The trainer keeps what `build` made (the
model, optimizer and traced shapes): the model is built and traced once per
run before its step functions are compiled.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import flax.linen as nn
import ml_collections
import optax

from lra_msmra import config_lib
from lra_msmra import data as data_lib
from lra_msmra import models
from lra_msmra import objectives
from lra_msmra import optim
from lra_msmra import steps


def validate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Checks `config`; returns the task's model spec (see `models.create_model`).

  Raises:
    ValueError: naming the config key and the fix.
  """
  return trace(config)[0]


@dataclasses.dataclass(frozen=True)
class Built:
  """A checked config's model spec, model, optimizer, schedule and abstract
  train state (`steps.TrainState` of `jax.ShapeDtypeStruct`s)."""
  spec: dict[str, Any]
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optim.Schedule
  abstract: Any


def trace(config: ml_collections.ConfigDict) -> tuple[dict[str, Any], Any]:
  """Checks `config`; returns the model spec and the abstract train state
  (`build`'s)."""
  built = build(config)
  return built.spec, built.abstract


def build(config: ml_collections.ConfigDict) -> Built:
  """Checks `config`; builds its model and optimizer and traces the train
  state.

  The abstract train state is what `steps.create_train_state` would build
  for this config, without computing or allocating anything.

  Raises:
    ValueError: naming the config key and the fix.
    NotImplementedError: for a combination a mechanism refuses
      (`models.unsupported`).
  """
  config_lib.check(config)
  models.check_config(config.model)
  objectives.check(config)
  models.check_objective(config.model, config.objective)
  optim.check_config(config.optimizer, config.schedule,
                     config.num_train_steps)
  spec = data_lib.get_model_spec(config)
  model, tx, schedule = steps.build(config, spec)
  init = functools.partial(steps.create_train_state, model=model, tx=tx,
                           batch=steps.example_batch(spec))
  m = config.model
  try:
    abstract = jax.eval_shape(init, jax.random.PRNGKey(0))
  except NotImplementedError as e:
    if config.objective == 'causal':
      raise models.causal_refused(m, e) from e
    raise models.unsupported(m, e) from e
  except (ValueError, TypeError) as e:
    raise ValueError(
        f'The model of config.model (attention={m.attention!r}, '
        f'attention_kw={dict(m.attention_kw)}) does not build for task '
        f"{config.task!r} at input length {spec['max_len']}: {e} Fix the "
        'knob it names in config.model.attention_kw or config.model, or the '
        'input length in config.data.') from e
  return Built(spec, model, tx, schedule, abstract)
