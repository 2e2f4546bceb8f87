"""One trainer for every task and mechanism: `train_and_evaluate(config, workdir)`.

Order of operations: validate the config and `jax.eval_shape` the train state
from it (`validation.trace`, the model's one trace before compilation), build
the mesh, load the task data, build the model and optimizer, derive the
state's shardings, restore the newest readable checkpoint or initialise
under `jit` with those shardings, then run `jit(train_step, donate_argnums=0)`. The train
state and the step functions are `lra_msmra.steps`.

Loop semantics (compare docs/protocol.md §4.3):

* `step` counts updates done. Training batch k (0-based) is fixed by the seed
  and k, so a resumed run continues with exactly the batches it would have
  seen; the data position is saved with every checkpoint.
* Validation runs every `eval_every_steps` updates and after the last one
  (LRA skips the final step, P16). The best validation accuracy so far is
  checkpointed separately.
* At the end the test split is evaluated with the final parameters and with
  the best-validation parameters (once, when the best validation is at the
  last step); both go to `results.json`. The headline
  number is the final one under the LRA protocol, the best-validation one
  under the Xiong et al. and CST protocols (P17).
* A non-finite loss or gradient norm stops the run with an error before any
  later checkpoint is written, so the last good checkpoint stays.
* SIGTERM (preemption) saves a checkpoint at the current step and exits;
  with several processes, at the first step all of them agree on. In a
  single-process run Ctrl-C (SIGINT) and a closed stdout (SIGPIPE, e.g.
  `| head`) do the same; a second Ctrl-C stops at once without saving.
* One run per workdir: process 0 holds `<workdir>/lock` while the run lasts
  (`lra_msmra.workdir_lock`). A run that fails before it trains (missing
  or bad data, a refused resume) removes the workdir if it created it.
* Progress: the compilation of the training step is reported as its own
  phase; steps/s and the ETA leave out the first step of a process (it
  waits for that compilation) and the evaluations, which the ETA adds back
  at their measured speed; long evaluations report batches done. Before
  the first line of `log_every_steps`, lines also come after the process's
  steps 1, 10, 100, ... and every `metrics.EARLY_LINE_SECONDS`.
* Throughput: the model's matmul FLOPs per training step are counted once
  from its jaxpr (`train_step_flops`; with the 'xla' attention
  implementation when another one is configured); progress lines, metrics.jsonl and
  results.json give model TFLOP/s per device, and the model FLOPs
  utilisation (MFU) where `lra_msmra.hardware` knows the device's peak.
* metrics.jsonl has one training record per `log_every_steps`, averaging
  the steps since the previous one; checkpoints carry the steps of the
  record in progress, so a resumed run writes the same records.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import signal
import threading
import time
from typing import Any, Callable, Mapping, Optional

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np

from lra_msmra import checkpoint as checkpoint_lib
from lra_msmra import data as data_lib
from lra_msmra import errors
from lra_msmra import fingerprint as fingerprint_lib
from lra_msmra import hardware
from lra_msmra import metrics as metrics_lib
from lra_msmra import models
from lra_msmra import provenance as provenance_lib
from lra_msmra import sharding
from lra_msmra import steps as steps_lib
from lra_msmra import validation
from lra_msmra import workdir_lock
from lra_msmra.benchmark import flops as flops_lib
from lra_msmra.data import pipeline

# Config keys that may change when a run is resumed in the same workdir.
RESUMABLE_CHANGES = ('num_train_steps', 'eval_every_steps', 'num_eval_steps',
                     'log_every_steps', 'checkpoint_every_steps',
                     'max_checkpoints_to_keep')


class Preempted(Exception):
  """Raised after SIGTERM (or Ctrl-C) once the checkpoint of the current step
  is saved; `signum` is the signal."""

  def __init__(self, step: int, signum: int = signal.SIGTERM):
    super().__init__(step)
    self.step = step
    self.signum = signum


# -------------------------------------------------------------------- helpers


def model_spec(data: pipeline.TaskData) -> dict[str, Any]:
  return {'vocab_size': data.vocab_size, 'num_classes': data.num_classes,
          'max_len': data.max_len, 'dual': data.dual}


def flops_config(config: ml_collections.ConfigDict
                 ) -> tuple[ml_collections.ConfigDict, Optional[str]]:
  """The config whose training step's FLOPs are counted, and the
  implementation it replaces (None if none).

  An attention implementation other than 'xla'
  (`model.attention_kw.implementation`, e.g. a Pallas kernel or cuDNN's
  fused attention) hides its matmuls from a count over the jaxpr, so the
  same model is counted with the 'xla' implementation, which computes the
  same function with plain matmuls. (Performer's own `kernel` knob is its
  feature map, not an implementation.)
  """
  kw = config.model.attention_kw
  implementation = kw.get('implementation', 'xla')
  if implementation == 'xla':
    return config, None
  counted = copy.deepcopy(config)
  with counted.unlocked():
    counted.model.attention_kw.implementation = 'xla'
  return counted, implementation


def train_step_flops(config: ml_collections.ConfigDict,
                     spec: Mapping[str, Any], jit_train_step: Any,
                     abstract_state: Any, mesh: jax.sharding.Mesh
                     ) -> dict[str, Any]:
  """Model FLOPs of one training step over all devices, counted once.

  The analytic matmul FLOPs (`lra_msmra.benchmark.flops`) of the step's
  jaxpr at the global batch: forward, backward (recomputation under
  `jax.checkpoint` included) and the optimizer's update, which has no
  matmul. Traced from shapes only; nothing runs.

  Returns:
    {'flops': int, 'notes': [str]}; a note says when the model was counted
    with the 'xla' implementation instead of the configured one.
  """
  batch = steps_lib.abstract_batch(spec, config.batch_size, mesh)
  counted, replaced = flops_config(config)
  if replaced is None:
    # The step's own trace: jit keeps it, so the first real call does not
    # trace the model again.
    jaxpr = jit_train_step.trace(abstract_state, batch).jaxpr
  else:
    model, tx, schedule = steps_lib.build(counted, spec)
    jaxpr = jax.make_jaxpr(functools.partial(
        steps_lib.train_step, model=model, tx=tx, schedule=schedule,
        grad_accum_steps=config.grad_accum_steps))(abstract_state, batch)
  found: set[str] = set()
  flops = flops_lib.jaxpr_flops(jaxpr, found)
  notes = sorted(found)
  if replaced is not None:
    notes.append(f"counted with implementation 'xla': {replaced!r} hides "
                 'its matmuls from the count')
  return {'flops': int(flops), 'notes': notes}


def num_eval_batches(source: pipeline.Source, batch_size: int,
                     num_steps: int) -> int:
  """Batches `evaluate` runs over `source` (`num_steps` -1 = whole split)."""
  total = -(-len(source) // batch_size)
  return total if num_steps == -1 else min(total, num_steps)


def evaluate(eval_fn: Callable[..., Any], params: Any, source: pipeline.Source,
             batch_size: int, num_steps: int, mesh: jax.sharding.Mesh,
             label: Optional[str] = None, compiling: bool = False
             ) -> dict[str, Any]:
  """Accuracy and mean loss over `num_steps` batches (-1 = whole split).

  Also returns `seconds` (the whole evaluation) and `seconds_per_batch`
  (batches after the first one, which may wait for a compilation; None with
  one batch).

  Args:
    label: names the evaluation in progress lines (none without it); long
      evaluations print batches done every metrics.EVAL_PROGRESS_SECONDS.
    compiling: the first batch compiles `eval_fn`: say so and time it.
  """
  start = time.time()
  total = num_eval_batches(source, batch_size, num_steps)
  progress = metrics_lib.EvalProgress(label, total) if label else None
  totals = None
  steady_start = None
  if compiling and label:
    metrics_lib.log('Compiling the evaluation step ...')
  for i, batch in enumerate(pipeline.eval_batches(
      source, batch_size, num_steps, jax.process_index(),
      jax.process_count())):
    m = eval_fn(params, sharding.to_global(batch, mesh))
    totals = m if totals is None else jax.tree.map(jnp.add, totals, m)
    if i == 0:
      if compiling and label:  # The first call returns once compiled.
        metrics_lib.log(f'Compiled the evaluation step in '
                        f'{time.time() - start:.1f} s.')
      # Wait for the first batch: the time of the others is the steady
      # evaluation speed (for the training ETA).
      jax.block_until_ready(totals)
      steady_start = time.time()
      if progress is not None:
        progress.start()
    elif progress is not None and progress.due(i + 1):
      jax.block_until_ready(totals)  # Report batches done, not queued.
      progress.report(i + 1)
  totals = jax.device_get(totals)
  end = time.time()
  count = float(totals['count'])
  return {'accuracy': float(totals['correct']) / count,
          'loss': float(totals['loss_sum']) / count,
          'examples': int(count),
          'seconds': end - start,
          'seconds_per_batch': ((end - steady_start) / (total - 1)
                                if total > 1 else None)}


def _check_resume_config(workdir: str, config: ml_collections.ConfigDict
                         ) -> None:
  path = os.path.join(workdir, checkpoint_lib.CONFIG_FILE)
  if not os.path.exists(path):
    return
  with open(path) as f:
    old = fingerprint_lib.flatten(json.load(f))
  new = fingerprint_lib.flatten(json.loads(config.to_json()))
  diff = fingerprint_lib.differing_keys(old, new)
  blocking = [k for k in diff if k not in RESUMABLE_CHANGES]
  if blocking:
    hint = (' A moved data folder: make it readable at the recorded path '
            '(e.g. a symbolic link) to resume.'
            if any(k.endswith('data_dir') for k in blocking) else '')
    raise ValueError(
        f'{workdir} holds a run with a different config (recorded → now: '
        f'{describe_changes(old, new, blocking)}). Resume it with the same '
        f'config, or use a new --workdir.{hint}')
  if diff:
    metrics_lib.log(f'Resuming with changed {describe_changes(old, new, diff)}.')


_ABSENT = object()


def describe_changes(old: Mapping[str, Any], new: Mapping[str, Any],
                     keys: list[str]) -> str:
  """`key: old → new` for each of `keys` (dotted leaf keys), joined by '; '."""
  return '; '.join(f'{k}: {_short(old.get(k, _ABSENT))} → '
                   f'{_short(new.get(k, _ABSENT))}' for k in keys)


def _short(value: Any, limit: int = 80) -> str:
  if value is _ABSENT:
    return '(absent)'
  if isinstance(value, str) and value and not any(
      c.isspace() or c in '→;"' for c in value):
    text = value
  else:
    text = json.dumps(value)
  return text if len(text) <= limit else text[:limit - 3] + '...'


class _SigtermFlag:
  """Tells every process to stop at the same step after SIGTERM (or Ctrl-C).

  One process: a Python handler sets a flag instead of dying at once (main
  thread only); Ctrl-C (SIGINT) is handled the same way, and a second Ctrl-C
  stops at once (KeyboardInterrupt, no checkpoint of the current step). A
  closed stdout (`main ... | head`: SIGPIPE, which Python turns into a
  broken pipe error; see `metrics.stdout_closed`) stops the run the same
  way, with `signum` SIGPIPE.
  Several processes: the hosts may get SIGTERM at different steps, and one
  that stops alone would leave the others waiting in the next collective.
  JAX's preemption service (started by `jax.distributed`) catches SIGTERM
  instead and agrees on one step for all hosts, so no Python handler is
  installed there: it would hide the signal from that service. Ctrl-C then
  keeps Python's default (the process stops at once); use SIGTERM.
  """

  def __init__(self):
    self.raised = False
    self.signum = signal.SIGTERM
    self._previous = {}
    self._multiprocess = jax.process_count() > 1

  def __enter__(self):
    if (not self._multiprocess and
        threading.current_thread() is threading.main_thread()):
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT:
      if self.raised and self.signum == signal.SIGINT:
        raise KeyboardInterrupt
      # Straight to the file descriptor: print() may be interrupted midway.
      os.write(2, b'\nCtrl-C: saving a checkpoint after the current step '
               b'(Ctrl-C again stops at once, without saving).\n')
    if not self.raised:
      self.raised = True
      self.signum = signum

  @property
  def name(self) -> str:
    return {signal.SIGINT: 'SIGINT (Ctrl-C)',
            signal.SIGPIPE: 'SIGPIPE (stdout closed)'}.get(self.signum,
                                                           'SIGTERM')

  def should_stop(self, step: int) -> bool:
    """Whether to checkpoint and exit after `step`; call it at every step."""
    if self._multiprocess:
      # Only process 0 prints, and only SIGTERM is agreed on: a closed
      # stdout there just drops its lines.
      self.raised = multihost_utils.reached_preemption_sync_point(step)
    elif not self.raised and metrics_lib.stdout_closed():
      self.raised = True
      self.signum = signal.SIGPIPE
    return self.raised

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, signal.SIG_DFL if previous is None else previous)


class _MetricsWindow:
  """The per-step training metrics behind the next metrics.jsonl record.

  Steps are kept on device until `check` fetches them (at log, evaluation
  and checkpoint steps, and for early progress lines), checks them for
  non-finite values and keeps them on the host until `take` averages and
  clears them for a record. The host part goes into every checkpoint
  (`state`), so a run resumed between two records writes the record the
  uninterrupted run would have written: same steps, same values.
  """

  def __init__(self, saved: Optional[Mapping[str, Any]] = None):
    self.items: list[tuple[int, dict[str, jax.Array]]] = []
    self.host: list[tuple[int, dict[str, np.ndarray]]] = []
    if saved:
      dtypes = saved['dtypes']
      for step, values in zip(saved['steps'], saved['values']):
        self.host.append((step, {k: np.asarray(v, dtypes[k])
                                 for k, v in values.items()}))

  def add(self, step: int, m: dict[str, jax.Array]) -> None:
    self.items.append((step, m))

  def check(self, last_good: Optional[int], ckpt_dir: str) -> None:
    """Fetches the steps kept on device; raises FloatingPointError on a
    non-finite loss or gradient norm."""
    if not self.items:
      return
    steps = [s for s, _ in self.items]
    values = jax.device_get([m for _, m in self.items])
    self.items = []
    for s, m in zip(steps, values):
      if not (np.isfinite(m['loss_sum']) and np.isfinite(m['grad_norm'])):
        where = (f'the last good checkpoint (step {last_good}) is kept in '
                 f'{ckpt_dir}' if last_good is not None else
                 'no checkpoint was written yet')
        raise errors.mark(FloatingPointError(
            f'Non-finite loss or gradient at step {s + 1}; {where}. Lower '
            'the learning rate, set config.optimizer.grad_clip_norm, or use '
            "config.model.dtype='float32'."))
    self.host.extend(zip(steps, values))

  def summary(self) -> Optional[dict[str, float]]:
    """Averages of the checked steps (None if there are none)."""
    if not self.host:
      return None
    values = [m for _, m in self.host]
    count = sum(float(m['count']) for m in values)
    out = {'loss': sum(float(m['loss_sum']) for m in values) / count,
           'accuracy': sum(float(m['correct']) for m in values) / count}
    for k in values[-1]:
      if k not in ('loss_sum', 'correct', 'count'):
        out[k] = float(np.mean([m[k] for m in values]))
    return out

  def take(self) -> Optional[dict[str, float]]:
    """`summary()`, then an empty window."""
    out = self.summary()
    self.host = []
    return out

  def state(self) -> dict[str, Any]:
    """The checked steps as JSON (exact: values keep their dtypes)."""
    values = [m for _, m in self.host]
    return {'steps': [int(s) for s, _ in self.host],
            'values': [{k: float(v) for k, v in m.items()} for m in values],
            'dtypes': ({k: np.asarray(v).dtype.name
                        for k, v in values[-1].items()} if values else {})}


def _previous_result(workdir: str, key: str) -> Any:
  """`key` of the workdir's existing results.json, or None."""
  path = os.path.join(workdir, 'results.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f).get(key)


# ----------------------------------------------------------------- main loop


def describe_data_source(record: Mapping[str, Any], where: str) -> str:
  """One line saying where a run's examples come from."""
  kind = record['kind']
  if kind == 'release':
    return f'Data: release files ({where}).'
  if kind == 'generated':
    seed = record.get('generator', {}).get('seed', '?')
    return (f'Data: generated by our seeded implementation of the LRA '
            f'generator (seed {seed}; {where}).')
  return (f'Data: MOCK examples ({where}): a plumbing check, not comparable '
          'with any published number.')


def learning_warnings(results: Mapping[str, Any]) -> list[str]:
  """Warnings about what a run learned (results.json's `warnings`).

  A reported test accuracy at or below the majority-class rate of the test
  split means the run learned nothing a constant guess would not.
  """
  out = []
  accuracy = results['test_accuracy']
  majority = results.get('test_majority_rate')
  if majority is not None and np.isfinite(majority) and accuracy <= majority:
    out.append(
        f'test accuracy {accuracy:.4f} ({results["reported"]} checkpoint) is '
        f'at or below the majority-class rate {majority:.4f} (always '
        f'predicting label {results.get("test_majority_label")}): the model '
        'learned nothing beyond the label frequencies. Check the learning '
        'rate, the number of steps and the data.')
  return out


def _throughput(results: Mapping[str, Any], progress: metrics_lib.Progress,
                peak: Optional[hardware.Peak],
                devices: list[Mapping[str, Any]]) -> dict[str, Any]:
  """results.json's model TFLOP/s per device at the steady-state steps/s,
  and its MFU where the device's peak is known and one kind of device
  trained every step."""
  speed = progress.throughput(results['train_steps_per_sec'])
  out = {}
  if 'tflops_per_device' in speed:
    out['train_tflops_per_device'] = speed['tflops_per_device']
  kinds = {(d.get('device_kind'), d.get('num_devices')) for d in devices}
  if 'mfu' in speed and len(kinds) <= 1:
    out['train_mfu'] = speed['mfu']
    out['peak_flops_per_device'] = {'flops_per_s': peak.flops_per_s,
                                    'source': peak.source}
  return out


def _evals_from(step: int, config: ml_collections.ConfigDict) -> int:
  """Validation evaluations the loop runs at steps `step`..the last one."""
  total, every = config.num_train_steps, config.eval_every_steps
  if step > total:
    return 0
  return total // every - (step - 1) // every + (1 if total % every else 0)


def _lock_workdir(workdir: str) -> workdir_lock.WorkdirLock:
  """Takes the workdir's lock on process 0; every process raises if it
  could not (all of them stop, none waits in a collective)."""
  lock = workdir_lock.WorkdirLock(workdir)
  error = None
  if metrics_lib.is_chief():
    try:
      note = lock.acquire()
    except workdir_lock.WorkdirLocked as e:
      error = e
    else:
      if note:
        metrics_lib.log(note)
  if jax.process_count() > 1:
    failed = int(multihost_utils.broadcast_one_to_all(
        np.int32(error is not None)))
    if failed and error is None:
      error = workdir_lock.WorkdirLocked(
          f'Process 0 could not lock {workdir} (see its output).')
  if error is not None:
    raise errors.mark(error)
  return lock


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       launch: Optional[Mapping[str, Any]] = None
                       ) -> dict[str, Any]:
  """Trains, evaluates and tests one config; returns the results dict.

  Re-running in the same workdir resumes from the newest readable checkpoint.
  A workdir that another run is using is refused
  (`workdir_lock.WorkdirLocked`).

  Args:
    config: the run config.
    workdir: folder for checkpoints, metrics and results.json.
    launch: how the run was launched (config file and command-line
      overrides), recorded in results.json.
  """
  start_time = time.time()
  with errors.input_errors():
    # The one trace of the model: checks every knob against the task's
    # length and gives the train state's shapes, before any data is read.
    spec, abstract = validation.trace(config)
    # Fails here, before anything runs, if the config names no data source.
    data_lib.data_source(config)
  workdir = os.path.abspath(workdir)
  created = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  lock = _lock_workdir(workdir)
  cleared = False
  try:
    return _train_and_evaluate(config, workdir, launch, start_time, spec,
                               abstract)
  except BaseException:
    # A run that fails before it starts (missing or bad data, a refused
    # resume, Ctrl-C while data is generated) leaves no workdir it created.
    cleared = created and _clear_unstarted_workdir(workdir, lock)
    raise
  finally:
    lock.release()
    if cleared:
      try:
        os.rmdir(workdir)
      except OSError:  # Something else appeared there meanwhile.
        pass


def _clear_unstarted_workdir(workdir: str,
                             lock: workdir_lock.WorkdirLock) -> bool:
  """Deletes what a run wrote in `workdir` if it never started training
  (no config.json), except the lock it still holds; returns whether it did.
  Process 0 only."""
  if (not metrics_lib.is_chief() or
      os.path.exists(os.path.join(workdir, checkpoint_lib.CONFIG_FILE))):
    return False
  try:
    for name in os.listdir(workdir):
      path = os.path.join(workdir, name)
      if path == lock.path:
        continue
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
      else:
        os.remove(path)
  except OSError:
    return False
  return True


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        launch: Optional[Mapping[str, Any]],
                        start_time: float, spec: dict[str, Any],
                        abstract: Any) -> dict[str, Any]:
  """`train_and_evaluate` once the config is valid and the workdir locked.

  `spec` and `abstract` are the model spec and abstract train state
  `validation.trace` derived from the config alone.
  """
  mesh = sharding.create_mesh()
  with errors.input_errors():
    sharding.check_batch_size('batch_size', config.batch_size, mesh,
                              config.grad_accum_steps)
    sharding.check_batch_size('eval_batch_size', config.eval_batch_size,
                              mesh)
    _check_resume_config(workdir, config)
    data = data_lib.get_datasets(config, workdir)
  data_record = fingerprint_lib.data_source_record(data.notes or {})
  metrics_lib.log(describe_data_source(
      data_record, (data.notes or {}).get('data_dir') or
      (data.notes or {}).get('data', '')))
  if model_spec(data) != spec:
    raise RuntimeError(
        f'The {config.task} data gives the model spec {model_spec(data)}, '
        f'but the config alone gives {spec}: the task module\'s '
        '`get_model_spec` and `get_datasets` disagree (a bug; please report '
        'it with the config).')
  model, tx, schedule = steps_lib.build(config, spec)
  checkpoint_lib.write_json(os.path.join(workdir, checkpoint_lib.CONFIG_FILE),
                            json.loads(config.to_json()))
  checkpoint_lib.write_json(
      os.path.join(workdir, checkpoint_lib.MODEL_SPEC_FILE), spec)

  init_fn = functools.partial(steps_lib.create_train_state, model=model,
                              tx=tx, batch=steps_lib.example_batch(spec))
  state_sharding = jax.tree.map(lambda _: sharding.replicated(mesh), abstract)
  abstract = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, state_sharding)

  ckpt = checkpoint_lib.Checkpointer(workdir, config.max_checkpoints_to_keep)
  try:
    restored = ckpt.restore_latest(abstract)
  except checkpoint_lib.NoReadableCheckpoint as e:
    ckpt.close()
    raise errors.mark(e)
  best = {'step': None, 'val_accuracy': -1.0, 'val_loss': None}
  # Seconds spent training (evaluations included) before this process, and
  # the steps and seconds of its steady-state training (see
  # metrics.Progress) summed over the processes that trained.
  earlier_seconds = 0.0
  earlier_steady = (0, 0.0)
  # Which devices trained which steps: one entry per process that trained,
  # so a run resumed on other hardware says so (`provenance.device_history`).
  earlier_devices: list[dict[str, Any]] = []
  # The training metrics since the last metrics.jsonl record, as saved.
  saved_window = None
  if restored is not None:
    start, state, meta = restored
    best = meta['best']
    saved_window = meta.get('metrics_window')
    earlier_seconds = float(meta.get('train_seconds', 0.0))
    earlier_steady = tuple(meta.get('steady', (0, 0.0)))
    earlier_devices = list(meta.get('devices', []))
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

  jit_train_step, jit_eval_step = steps_lib.jit_steps(
      config, model, tx, schedule, mesh, state_sharding)
  step_flops = train_step_flops(config, spec, jit_train_step, abstract, mesh)
  peak = hardware.peak(mesh.devices.flat[0].device_kind, config.model.dtype)
  eval_compiled = False

  def run_eval(params, source, num_steps, label):
    nonlocal eval_compiled
    result = evaluate(jit_eval_step, params, source,
                      batch_size=config.eval_batch_size, num_steps=num_steps,
                      mesh=mesh, label=label, compiling=not eval_compiled)
    eval_compiled = True
    return result

  # Seconds per evaluation batch, once measured: the ETA's evaluation part.
  eval_batch_seconds = None
  val_batches = num_eval_batches(data.eval, config.eval_batch_size,
                                 config.num_eval_steps)
  test_batches = num_eval_batches(data.test, config.eval_batch_size, -1)

  def eval_seconds_left(step: int) -> Optional[float]:
    if eval_batch_seconds is None:
      return None
    # The validations from this step on, then the two test evaluations
    # (one if the best validation turns out to be the last).
    batches = (_evals_from(step, config) * val_batches +
               2 * test_batches)
    return batches * eval_batch_seconds

  train_batches = pipeline.TrainBatches(
      data.train, config.batch_size, config.seed, jax.process_index(),
      jax.process_count())
  writer = metrics_lib.Writer(os.path.join(workdir, 'tensorboard'),
                              resume_step=start)
  progress = metrics_lib.Progress(
      config.num_train_steps, start, flops_per_step=step_flops['flops'],
      num_devices=int(mesh.devices.size),
      peak_flops_per_s=peak.flops_per_s if peak else None)
  loop_start = time.time()
  window = _MetricsWindow(saved_window)
  if (restored is not None and saved_window is None and
      start % config.log_every_steps):
    # A checkpoint written before the window was saved with it.
    window_partial_from = start
  else:
    window_partial_from = None
  last_saved = start if restored is not None else None
  ckpt_dir = str(ckpt.latest.directory)
  last_val = None

  # Steady-state (steps, seconds) up to the last checkpoint, this process's
  # included: what the checkpoint carries and the results report.
  saved_steady = earlier_steady

  this_device = provenance_lib.devices(mesh)
  saved_devices = earlier_devices

  def save(step: int) -> None:
    nonlocal last_saved, saved_steady, saved_devices
    steps, seconds = progress.steady(step)
    saved_steady = (earlier_steady[0] + steps, earlier_steady[1] + seconds)
    saved_devices = provenance_lib.extend_history(
        earlier_devices, this_device, start, step)
    meta = {'step': step, 'best': best,
            'train_seconds': earlier_seconds + time.time() - loop_start,
            'steady': saved_steady, 'devices': saved_devices,
            'metrics_window': window.state(),
            'data_position': {'next_train_batch': step, 'seed': config.seed,
                              'examples_consumed': step * config.batch_size}}
    # The metrics of `step` reach the disk before its checkpoint does.
    writer.flush()
    ckpt.save(step, state, meta)
    last_saved = step

  try:
    with _SigtermFlag() as sigterm:
      for k in range(start, config.num_train_steps):
        batch = sharding.to_global(train_batches.get(k), mesh)
        if k == start:
          metrics_lib.log('Compiling the training step ...')
          compile_start = time.time()
        state, m = jit_train_step(state, batch)
        step = k + 1
        if k == start:
          # The call returns once compiled; the step itself runs after.
          compile_seconds = time.time() - compile_start
          jax.block_until_ready(m)
          metrics_lib.log(f'Compiled the training step in '
                          f'{compile_seconds:.1f} s; training.')
          progress.compiled(step)
        window.add(k, m)
        # At most two steps in flight: enough to keep the device busy, and a
        # SIGTERM (preemption) is answered within a step or two instead of
        # after every queued step.
        if len(window.items) > 1:
          jax.block_until_ready(window.items[-2][1])
        is_last = step == config.num_train_steps
        stop = sigterm.should_stop(step)
        do_eval = step % config.eval_every_steps == 0 or is_last
        do_ckpt = step % config.checkpoint_every_steps == 0 or is_last
        do_log = step % config.log_every_steps == 0 or is_last
        if do_log or do_eval or do_ckpt or stop:
          window.check(last_saved, ckpt_dir)
          if do_log:
            steps_averaged = len(window.host)
            summary = window.take()
            rate = progress.update(step, summary, eval_seconds_left(step))
            if rate is not None:
              summary['steps_per_sec'] = rate
              summary.update(progress.throughput(rate))
            if window_partial_from is not None:
              # Steps before the resumed checkpoint are missing from it.
              summary['partial_window_steps'] = steps_averaged
              window_partial_from = None
            writer.write(step, {f'train/{n}': v for n, v in summary.items()})
        if not do_log and progress.early_due(step):
          window.check(last_saved, ckpt_dir)
          progress.note(step, window.summary(), eval_seconds_left(step))
        if do_eval:
          last_val = run_eval(state.params, data.eval, config.num_eval_steps,
                              f'validation at step {step}')
          progress.exclude(last_val['seconds'])
          if last_val['seconds_per_batch'] is not None:
            eval_batch_seconds = last_val['seconds_per_batch']
          writer.write(step, {'val/accuracy': last_val['accuracy'],
                              'val/loss': last_val['loss']})
          metrics_lib.log(f'step {step}: val accuracy {last_val["accuracy"]:.4f}'
                          f', loss {last_val["loss"]:.4f}')
          if last_val['accuracy'] > best['val_accuracy']:
            best = {'step': step, 'val_accuracy': last_val['accuracy'],
                    'val_loss': last_val['loss']}
            ckpt.save_best(step, state.params, best)
        writer.flush()
        if do_ckpt or stop:
          save(step)
        if stop and not is_last:
          ckpt.wait()
          metrics_lib.log(f'{sigterm.name}: saved step {step} in {ckpt_dir}; '
                          'rerun the same command to resume.')
          raise Preempted(step, sigterm.signum)
    ckpt.wait()
    train_seconds = earlier_seconds + time.time() - loop_start
    steady_steps, steady_seconds = saved_steady  # The last step's save.

    if last_val is None:  # Resumed after the last step: evaluate again.
      last_val = run_eval(state.params, data.eval, config.num_eval_steps,
                          'validation')
    final_step = int(jax.device_get(state.step))
    final_test = run_eval(state.params, data.test, -1,
                          'test, final parameters')
    best_restored = ckpt.restore_best(abstract.params)
    if best_restored is None:
      raise RuntimeError(f'No best-validation checkpoint in {workdir}/best.')
    best_step, best_params, _ = best_restored
    if best_step == final_step:
      # Saved from the final parameters at this step: the same test pass.
      best_test = final_test
    else:
      best_test = run_eval(best_params, data.test, -1,
                           'test, best-validation parameters')
  finally:
    writer.close()
    ckpt.close()

  labels = np.concatenate([
      b['targets'][b['weights'] > 0]
      for b in pipeline.eval_batches(data.test, config.eval_batch_size)])
  majority_label, majority = pipeline.majority_rate(labels)
  reported = 'final' if config.protocol == 'lra' else 'best'
  config_dict = json.loads(config.to_json())
  run_setting = fingerprint_lib.setting(config_dict, data_record)
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
      # Steady-state training speed over every process that trained (their
      # steps after the first, which waits for the compilation, divided by
      # their time, evaluations excluded; the checkpoints carry the sums);
      # train_seconds below is the whole loop, evaluations included. None if
      # no such step was timed; a re-run that trained no step and finds no
      # sums in its checkpoint keeps the figure measured before.
      'train_steps_per_sec': (
          steady_steps / steady_seconds if steady_steps else
          _previous_result(workdir, 'train_steps_per_sec')),
      'num_devices': int(mesh.devices.size),
      # Model FLOPs of one training step (all devices; `train_step_flops`).
      'train_flops_per_step': step_flops['flops'],
      'train_flops_notes': step_flops['notes'],
      'data_notes': data.notes or {},
      'data_source': data_record,
      'setting_fingerprint': fingerprint_lib.fingerprint(run_setting),
      'launch': dict(launch or {}),
      'provenance': dict(provenance_lib.collect(mesh),
                         device_history=saved_devices),
      'train_seconds': train_seconds,
      'wall_seconds': time.time() - start_time,
      'config': config_dict,
  }
  results.update(_throughput(results, progress, peak, saved_devices))
  results['warnings'] = learning_warnings(results)
  checkpoint_lib.write_json(os.path.join(workdir, 'results.json'), results)
  metrics_lib.log(
      f'Test accuracy ({reported} checkpoint, step '
      f'{results[reported]["step"]}): {results["test_accuracy"]:.4f} '
      f'(final {final_test["accuracy"]:.4f}, best-validation '
      f'{best_test["accuracy"]:.4f}; majority-class rate {majority:.4f}). '
      f'Results: {os.path.join(workdir, "results.json")}')
  for warning in results['warnings']:
    metrics_lib.log(f'WARNING: {warning}')
  return results
