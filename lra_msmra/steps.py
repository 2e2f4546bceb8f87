"""The train state and the step functions, shared by everything that runs them.

`lra_msmra.train` (the training loop), `lra_msmra.checkpoint` (restoring a
model outside the trainer), the benchmarks and `lra_msmra_tools.scaling` build the
same programs from here:

* `build`: the model, optimizer and learning-rate schedule of a config for a
  task's model spec (`vocab_size`, `num_classes`, `max_len`, `dual`).
* `TrainState`, `create_train_state`, `abstract_train_state` (shapes only).
* `loss_fn`, `train_step` (forward, loss, backward, optimizer update, with
  optional gradient accumulation) and `eval_step`.
* `jit_steps`: both steps jitted as the trainer runs them over a
  data-parallel mesh (state donated), and `abstract_batch`, the shapes and
  shardings of their batches, so they can be lowered without data.

Nothing here reads data, checkpoints or the workdir.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lra_msmra import models
from lra_msmra import objectives
from lra_msmra import optim
from lra_msmra import sharding
from lra_msmra.kernels import mesh as mesh_lib


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def example_batch(spec: Mapping[str, Any], batch_size: int = 1
                  ) -> dict[str, np.ndarray]:
  """A zero batch with the model's input keys (for init and shape tracing)."""
  batch = {'inputs': np.zeros((batch_size, spec['max_len']), np.int32)}
  if spec['dual']:
    batch['inputs2'] = batch['inputs']
  return batch


def abstract_batch(spec: Mapping[str, Any], batch_size: int,
                   mesh: jax.sharding.Mesh, *, train: bool = True
                   ) -> dict[str, jax.ShapeDtypeStruct]:
  """Shapes, dtypes and shardings of a global training (or eval) batch."""
  rows = sharding.batch_sharding(mesh)
  tokens = jax.ShapeDtypeStruct((batch_size, spec['max_len']), jnp.int32,
                                sharding=rows)
  batch = {'inputs': tokens}
  if spec['dual']:
    batch['inputs2'] = tokens
  batch['targets'] = jax.ShapeDtypeStruct((batch_size,), jnp.int32,
                                          sharding=rows)
  if not train:
    batch['weights'] = jax.ShapeDtypeStruct((batch_size,), jnp.float32,
                                            sharding=rows)
  return batch


def create_train_state(rng: jax.Array, model: nn.Module,
                       tx: optax.GradientTransformation,
                       batch: Mapping[str, Any]) -> TrainState:
  init_rng, dropout_rng, train_rng = jax.random.split(rng, 3)
  # The masked objective's masks come from a stream of their own; the
  # parameters depend on the 'params' stream only.
  variables = model.init({'params': init_rng, 'dropout': dropout_rng,
                          'masking': dropout_rng}, batch, deterministic=True)
  params = variables['params']
  return TrainState(step=jnp.zeros([], jnp.int32), params=params,
                    opt_state=tx.init(params), rng=train_rng)


def compute_metrics(logits: jax.Array, targets: jax.Array,
                    weights: Optional[jax.Array] = None
                    ) -> dict[str, jax.Array]:
  """Sums of cross-entropy, correct predictions and example weights."""
  logits = logits.astype(jnp.float32)
  if weights is None:
    weights = jnp.ones(targets.shape, jnp.float32)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  return {'loss_sum': jnp.sum(loss * weights),
          'correct': jnp.sum(correct * weights),
          'count': jnp.sum(weights)}


def _sown_means(sown: Mapping[str, Any]) -> dict[str, jax.Array]:
  """Averages every value sown into the `metrics` collection, by path."""
  out = {}
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(sown), sep='/')
  for path, values in flat.items():
    values = values if isinstance(values, tuple) else (values,)
    out[path] = jnp.mean(jnp.stack([jnp.mean(v) for v in values]))
  return out


def _is_pretraining(model: nn.Module) -> bool:
  return isinstance(model, models.TokenPredictor)


def loss_fn(params: Any, batch: Mapping[str, jax.Array], rng: jax.Array, *,
            model: nn.Module) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean training loss of a (micro-)batch, with dropout, and its metrics:
  per example for a classifier, per predicted token for self-pretraining
  (`models.TokenPredictor`)."""
  if _is_pretraining(model):
    dropout_rng, masking_rng = jax.random.split(rng)
    (logits, targets, weights), sown = model.apply(
        {'params': params}, batch, deterministic=False,
        rngs={'dropout': dropout_rng, 'masking': masking_rng},
        mutable=['metrics'])
    m = compute_metrics(logits, targets, weights)
  else:
    logits, sown = model.apply({'params': params}, batch,
                               deterministic=False, rngs={'dropout': rng},
                               mutable=['metrics'])
    m = compute_metrics(logits, batch['targets'])
  m.update(_sown_means(sown.get('metrics', {})))
  return m['loss_sum'] / m['count'], m


def train_step(state: TrainState, batch: Mapping[str, jax.Array], *,
               model: nn.Module, tx: optax.GradientTransformation,
               schedule: optim.Schedule, grad_accum_steps: int
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update on a global batch, optionally as several micro-batches.

  The gradient is that of the mean loss over the whole batch: micro-batches
  have equal sizes, so it is the mean of their mean-loss gradients.
  """
  step_rng = jax.random.fold_in(state.rng, state.step)
  grad_fn = jax.grad(functools.partial(loss_fn, model=model), has_aux=True)
  if grad_accum_steps == 1:
    grads, m = grad_fn(state.params, batch, step_rng)
  else:
    # Micro-batch i takes rows i, i + k, i + 2k, ...: every micro-batch then
    # has rows on every device of the data-parallel mesh.
    k = grad_accum_steps
    micro = jax.tree.map(
        lambda x: x.reshape((x.shape[0] // k, k) + x.shape[1:]).swapaxes(0, 1),
        batch)

    def body(carry, inputs):
      i, mb = inputs
      g, mm = grad_fn(state.params, mb, jax.random.fold_in(step_rng, i))
      return jax.tree.map(jnp.add, carry, (g, mm)), None

    zeros = jax.eval_shape(grad_fn, state.params,
                           jax.tree.map(lambda x: x[0], micro), step_rng)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
    (grads, m), _ = jax.lax.scan(body, zeros, (jnp.arange(k), micro))
    grads = jax.tree.map(lambda g: g / k, grads)
    m = {name: (v if name in ('loss_sum', 'correct', 'count') else v / k)
         for name, v in m.items()}
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  m['grad_norm'] = optax.global_norm(grads)
  m['learning_rate'] = schedule(state.step)
  new_state = state.replace(step=state.step + 1, params=params,
                            opt_state=opt_state)
  return new_state, m


def eval_step(params: Any, batch: Mapping[str, jax.Array], *,
              model: nn.Module) -> dict[str, jax.Array]:
  if _is_pretraining(model):
    logits, targets, weights = model.apply(
        {'params': params}, batch, deterministic=True,
        rngs={'masking': jax.random.PRNGKey(objectives.EVAL_MASKING_SEED)})
    return compute_metrics(logits, targets, weights)
  logits = model.apply({'params': params}, batch, deterministic=True)
  return compute_metrics(logits, batch['targets'], batch['weights'])


# ------------------------------------------------------ building the steps


def build(config: ml_collections.ConfigDict, spec: Mapping[str, Any]
          ) -> tuple[nn.Module, optax.GradientTransformation, optim.Schedule]:
  """Model, optimizer and schedule of a config for a task's `model_spec`."""
  model = models.create_model(
      config.model, objective=config.get('objective', 'classify'),
      masking=config.get('masking'), **spec)
  tx, schedule = optim.create_optimizer(config.optimizer, config.schedule,
                                        config.num_train_steps)
  return model, tx, schedule


def abstract_train_state(config: ml_collections.ConfigDict,
                         spec: Mapping[str, Any]) -> Any:
  """Shapes and dtypes of the train state, without allocating it."""
  model, tx, _ = build(config, spec)
  return jax.eval_shape(
      functools.partial(create_train_state, model=model, tx=tx,
                        batch=example_batch(spec)),
      jax.random.PRNGKey(0))


def jit_steps(config: ml_collections.ConfigDict, model: nn.Module,
              tx: optax.GradientTransformation, schedule: optim.Schedule,
              mesh: jax.sharding.Mesh, state_sharding: Any
              ) -> tuple[Any, Any]:
  """The trainer's jitted train step (state donated) and eval step.

  Both take their batch split along its first axis over `mesh` and return
  replicated metrics; the state keeps `state_sharding`.
  """
  batch_sharding = sharding.batch_sharding(mesh)
  # Traced inside the mesh: fused attention kernels then run once per batch
  # shard (`lra_msmra.kernels.mesh`) instead of on the gathered batch.
  jit_train_step = jax.jit(
      mesh_lib.under_mesh(functools.partial(
          train_step, model=model, tx=tx, schedule=schedule,
          grad_accum_steps=config.grad_accum_steps), mesh),
      in_shardings=(state_sharding, batch_sharding),
      out_shardings=(state_sharding, sharding.replicated(mesh)),
      donate_argnums=0)
  jit_eval_step = jax.jit(mesh_lib.under_mesh(
      functools.partial(eval_step, model=model), mesh),
                          in_shardings=(state_sharding.params, batch_sharding),
                          out_shardings=sharding.replicated(mesh))
  return jit_train_step, jit_eval_step
