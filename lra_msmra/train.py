"""One trainer for every task and mechanism: `train_and_evaluate(config, workdir)`.

Order of operations: validate the config, build the mesh, load the task data,
build the model and optimizer, `jax.eval_shape` the train state, derive its
shardings, restore the newest readable checkpoint or initialise under `jit`
with those shardings, then run `jit(train_step, donate_argnums=0)`.

Loop semantics (compare PROTOCOL §4.3):

* `step` counts updates done. Training batch k (0-based) is fixed by the seed
  and k, so a resumed run continues with exactly the batches it would have
  seen; the data position is saved with every checkpoint.
* Validation runs every `eval_every_steps` updates and after the last one
  (LRA skips the final step, P16). The best validation accuracy so far is
  checkpointed separately.
* At the end the test split is evaluated with the final parameters and with
  the best-validation parameters; both go to `results.json`. The headline
  number is the final one under the LRA protocol, the best-validation one
  under the Xiong et al. and CST protocols (P17).
* A non-finite loss or gradient norm stops the run with an error before any
  later checkpoint is written, so the last good checkpoint stays.
* SIGTERM (preemption) saves a checkpoint at the current step and exits;
  with several processes, at the first step all of them agree on.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
from typing import Any, Callable, Mapping, Optional

import flax
import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lra_msmra import checkpoint as checkpoint_lib
from lra_msmra import config_lib
from lra_msmra import cpu_rng
from lra_msmra import data as data_lib
from lra_msmra import metrics as metrics_lib
from lra_msmra import models
from lra_msmra import optim
from lra_msmra import sharding
from lra_msmra.data import pipeline

# Config keys that may change when a run is resumed in the same workdir.
RESUMABLE_CHANGES = ('num_train_steps', 'eval_every_steps', 'num_eval_steps',
                     'log_every_steps', 'checkpoint_every_steps',
                     'max_checkpoints_to_keep')


class Preempted(Exception):
  """Raised after SIGTERM once the checkpoint of the current step is saved."""


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


# ------------------------------------------------------------- pure functions


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
  variables = model.init({'params': init_rng, 'dropout': dropout_rng}, batch,
                         deterministic=True)
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


def loss_fn(params: Any, batch: Mapping[str, jax.Array], rng: jax.Array, *,
            model: nn.Module) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean training loss of a (micro-)batch, with dropout, and its metrics."""
  logits, sown = model.apply({'params': params}, batch, deterministic=False,
                             rngs={'dropout': rng}, mutable=['metrics'])
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
  logits = model.apply({'params': params}, batch, deterministic=True)
  return compute_metrics(logits, batch['targets'], batch['weights'])


# -------------------------------------------------------------------- helpers


def model_spec(data: pipeline.TaskData) -> dict[str, Any]:
  return {'vocab_size': data.vocab_size, 'num_classes': data.num_classes,
          'max_len': data.max_len, 'dual': data.dual}


def build(config: ml_collections.ConfigDict, spec: Mapping[str, Any]
          ) -> tuple[nn.Module, optax.GradientTransformation, optim.Schedule]:
  """Model, optimizer and schedule of a config for a task's `model_spec`."""
  model = models.create_model(config.model, **spec)
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
  jit_train_step = jax.jit(
      functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                        grad_accum_steps=config.grad_accum_steps),
      in_shardings=(state_sharding, batch_sharding),
      out_shardings=(state_sharding, sharding.replicated(mesh)),
      donate_argnums=0)
  jit_eval_step = jax.jit(functools.partial(eval_step, model=model),
                          in_shardings=(state_sharding.params, batch_sharding),
                          out_shardings=sharding.replicated(mesh))
  return jit_train_step, jit_eval_step


def evaluate(eval_fn: Callable[..., Any], params: Any, source: pipeline.Source,
             batch_size: int, num_steps: int, mesh: jax.sharding.Mesh
             ) -> dict[str, float]:
  """Accuracy and mean loss over `num_steps` batches (-1 = whole split)."""
  totals = None
  for batch in pipeline.eval_batches(source, batch_size, num_steps,
                                     jax.process_index(), jax.process_count()):
    m = eval_fn(params, sharding.to_global(batch, mesh))
    totals = m if totals is None else jax.tree.map(jnp.add, totals, m)
  totals = jax.device_get(totals)
  count = float(totals['count'])
  return {'accuracy': float(totals['correct']) / count,
          'loss': float(totals['loss_sum']) / count,
          'examples': int(count)}


def _check_resume_config(workdir: str, config: ml_collections.ConfigDict
                         ) -> None:
  path = os.path.join(workdir, checkpoint_lib.CONFIG_FILE)
  if not os.path.exists(path):
    return
  with open(path) as f:
    old = json.load(f)
  new = json.loads(config.to_json())
  diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
  blocking = [k for k in diff if k not in RESUMABLE_CHANGES]
  if blocking:
    raise ValueError(
        f'{workdir} holds a run with a different config (keys {blocking} '
        'differ). Resume it with the same config, or use a new --workdir.')
  if diff:
    metrics_lib.log(f'Resuming with changed {diff}.')


class _SigtermFlag:
  """Tells every process to stop at the same step after SIGTERM.

  One process: a Python handler sets a flag instead of dying at once (main
  thread only). Several processes: the hosts may get SIGTERM at different
  steps, and one that stops alone would leave the others waiting in the next
  collective. JAX's preemption service (started by `jax.distributed`) catches
  SIGTERM instead and agrees on one step for all hosts, so no Python handler
  is installed there: it would hide the signal from that service.
  """

  def __init__(self):
    self.raised = False
    self._previous = None
    self._multiprocess = jax.process_count() > 1

  def __enter__(self):
    if (not self._multiprocess and
        threading.current_thread() is threading.main_thread()):
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.raised = True

  def should_stop(self, step: int) -> bool:
    """Whether to checkpoint and exit after `step`; call it at every step."""
    if self._multiprocess:
      self.raised = multihost_utils.reached_preemption_sync_point(step)
    return self.raised

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


class _PendingMetrics:
  """Per-step metrics kept on device until the next flush."""

  def __init__(self):
    self.items: list[tuple[int, dict[str, jax.Array]]] = []

  def add(self, step: int, m: dict[str, jax.Array]) -> None:
    self.items.append((step, m))

  def flush(self, last_good: Optional[int], ckpt_dir: str
            ) -> Optional[dict[str, float]]:
    """Averages pending metrics; raises FloatingPointError on non-finite."""
    if not self.items:
      return None
    steps = [s for s, _ in self.items]
    values = jax.device_get([m for _, m in self.items])
    self.items = []
    for s, m in zip(steps, values):
      if not (np.isfinite(m['loss_sum']) and np.isfinite(m['grad_norm'])):
        where = (f'the last good checkpoint (step {last_good}) is kept in '
                 f'{ckpt_dir}' if last_good is not None else
                 'no checkpoint was written yet')
        raise FloatingPointError(
            f'Non-finite loss or gradient at step {s + 1}; {where}. Lower '
            'the learning rate, set config.optimizer.grad_clip_norm, or use '
            "config.model.dtype='float32'.")
    count = sum(float(m['count']) for m in values)
    out = {'loss': sum(float(m['loss_sum']) for m in values) / count,
           'accuracy': sum(float(m['correct']) for m in values) / count}
    for k in values[-1]:
      if k not in ('loss_sum', 'correct', 'count'):
        out[k] = float(np.mean([m[k] for m in values]))
    return out


# ----------------------------------------------------------------- main loop


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str
                       ) -> dict[str, Any]:
  """Trains, evaluates and tests one config; returns the results dict.

  Re-running in the same workdir resumes from the newest readable checkpoint.
  """
  config_lib.validate(config)
  cpu_rng.use_unrolled_threefry()  # Same dropout masks, drawn faster on CPU.
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  mesh = sharding.create_mesh()
  sharding.check_batch_size('batch_size', config.batch_size, mesh,
                            config.grad_accum_steps)
  sharding.check_batch_size('eval_batch_size', config.eval_batch_size, mesh)
  _check_resume_config(workdir, config)

  data = data_lib.get_datasets(config, workdir)
  spec = model_spec(data)
  model, tx, schedule = build(config, spec)
  checkpoint_lib.write_json(os.path.join(workdir, checkpoint_lib.CONFIG_FILE),
                            json.loads(config.to_json()))
  checkpoint_lib.write_json(
      os.path.join(workdir, checkpoint_lib.MODEL_SPEC_FILE), spec)

  init_fn = functools.partial(create_train_state, model=model, tx=tx,
                              batch=example_batch(spec))
  abstract = jax.eval_shape(init_fn, jax.random.PRNGKey(config.seed))
  state_sharding = jax.tree.map(lambda _: sharding.replicated(mesh), abstract)
  abstract = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, state_sharding)

  ckpt = checkpoint_lib.Checkpointer(workdir, config.max_checkpoints_to_keep)
  restored = ckpt.restore_latest(abstract)
  best = {'step': None, 'val_accuracy': -1.0, 'val_loss': None}
  if restored is not None:
    start, state, meta = restored
    best = meta['best']
    ckpt.drop_best_after(start)
    metrics_lib.log(f'Resumed from step {start} ({ckpt.latest.directory}).')
  else:
    start = 0
    state = jax.jit(init_fn, out_shardings=state_sharding)(
        jax.random.PRNGKey(config.seed))
  num_params = models.count_params(state.params)
  metrics_lib.log(
      f'{config.task} / {config.model.attention} / protocol '
      f'{config.protocol}: {num_params:,} parameters, {mesh.devices.size} '
      f'device(s), train {len(data.train)}, val {len(data.eval)}, test '
      f'{len(data.test)} examples.')

  jit_train_step, jit_eval_step = jit_steps(config, model, tx, schedule,
                                            mesh, state_sharding)
  run_eval = functools.partial(evaluate, jit_eval_step,
                               batch_size=config.eval_batch_size, mesh=mesh)

  train_batches = pipeline.TrainBatches(
      data.train, config.batch_size, config.seed, jax.process_index(),
      jax.process_count())
  writer = metrics_lib.Writer(os.path.join(workdir, 'tensorboard'))
  progress = metrics_lib.Progress(config.num_train_steps, start)
  pending = _PendingMetrics()
  last_saved = start if restored is not None else None
  ckpt_dir = str(ckpt.latest.directory)
  last_val = None

  def save(step: int) -> None:
    nonlocal last_saved
    meta = {'step': step, 'best': best,
            'data_position': {'next_train_batch': step, 'seed': config.seed,
                              'examples_consumed': step * config.batch_size}}
    ckpt.save(step, state, meta)
    last_saved = step

  try:
    with _SigtermFlag() as sigterm:
      for k in range(start, config.num_train_steps):
        batch = sharding.to_global(train_batches.get(k), mesh)
        state, m = jit_train_step(state, batch)
        step = k + 1
        pending.add(k, m)
        # At most two steps in flight: enough to keep the device busy, and a
        # SIGTERM (preemption) is answered within a step or two instead of
        # after every queued step.
        if len(pending.items) > 1:
          jax.block_until_ready(pending.items[-2][1])
        is_last = step == config.num_train_steps
        stop = sigterm.should_stop(step)
        do_eval = step % config.eval_every_steps == 0 or is_last
        do_ckpt = step % config.checkpoint_every_steps == 0 or is_last
        if step % config.log_every_steps == 0 or do_eval or do_ckpt or stop:
          summary = pending.flush(last_saved, ckpt_dir)
          if step % config.log_every_steps == 0 or is_last:
            summary['steps_per_sec'] = progress.update(step, summary)
            writer.write(step, {f'train/{n}': v for n, v in summary.items()})
        if do_eval:
          last_val = run_eval(state.params, data.eval,
                              num_steps=config.num_eval_steps)
          writer.write(step, {'val/accuracy': last_val['accuracy'],
                              'val/loss': last_val['loss']})
          metrics_lib.log(f'step {step}: val accuracy {last_val["accuracy"]:.4f}'
                          f', loss {last_val["loss"]:.4f}')
          if last_val['accuracy'] > best['val_accuracy']:
            best = {'step': step, 'val_accuracy': last_val['accuracy'],
                    'val_loss': last_val['loss']}
            ckpt.save_best(step, state.params, best)
        if do_ckpt or stop:
          save(step)
        if stop and not is_last:
          ckpt.wait()
          metrics_lib.log(f'SIGTERM: saved step {step} in {ckpt_dir}; '
                          'rerun the same command to resume.')
          raise Preempted(step)
    ckpt.wait()

    if last_val is None:  # Resumed after the last step: evaluate again.
      last_val = run_eval(state.params, data.eval,
                          num_steps=config.num_eval_steps)
    final_step = int(jax.device_get(state.step))
    final_test = run_eval(state.params, data.test, num_steps=-1)
    best_restored = ckpt.restore_best(abstract.params)
    if best_restored is None:
      raise RuntimeError(f'No best-validation checkpoint in {workdir}/best.')
    best_step, best_params, _ = best_restored
    best_test = run_eval(best_params, data.test, num_steps=-1)
  finally:
    writer.close()
    ckpt.close()

  labels = np.concatenate([
      b['targets'][b['weights'] > 0]
      for b in pipeline.eval_batches(data.test, config.eval_batch_size)])
  majority_label, majority = pipeline.majority_rate(labels)
  reported = 'final' if config.protocol == 'lra' else 'best'
  results = {
      'task': config.task, 'attention': config.model.attention,
      'protocol': config.protocol, 'num_params': num_params,
      'final': {'step': final_step, 'val_accuracy': last_val['accuracy'],
                'val_loss': last_val['loss'],
                'test_accuracy': final_test['accuracy'],
                'test_loss': final_test['loss']},
      'best': {'step': best_step, 'val_accuracy': best['val_accuracy'],
               'val_loss': best['val_loss'],
               'test_accuracy': best_test['accuracy'],
               'test_loss': best_test['loss']},
      'reported': reported,
      'test_accuracy': (final_test if reported == 'final' else
                        best_test)['accuracy'],
      'test_examples': final_test['examples'],
      'test_majority_label': majority_label,
      'test_majority_rate': majority,
      'train_steps_per_sec': progress.steps_per_sec(config.num_train_steps),
      'num_devices': int(mesh.devices.size),
      'data_notes': data.notes or {},
      'config': json.loads(config.to_json()),
  }
  checkpoint_lib.write_json(os.path.join(workdir, 'results.json'), results)
  metrics_lib.log(
      f'Test accuracy ({reported} checkpoint, step '
      f'{results[reported]["step"]}): {results["test_accuracy"]:.4f} '
      f'(final {final_test["accuracy"]:.4f}, best-validation '
      f'{best_test["accuracy"]:.4f}; majority-class rate {majority:.4f}). '
      f'Results: {os.path.join(workdir, "results.json")}')
  return results
