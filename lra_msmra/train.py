"""One trainer for every task and mechanism: `train_and_evaluate(config, workdir)`.

Order of operations: validate the config and `jax.eval_shape` the train state
from it (`validation.trace`, the model's one trace before compilation), build
the mesh, load the task data, build the model and optimizer, derive the
state's shardings, restore the newest readable checkpoint or initialise
under `jit` with those shardings, then run `jit(train_step, donate_argnums=0)`. The train
state and the step functions are `lra_msmra.steps`.

The code follows that order: `_setup` (everything up to the first step),
`_TrainLoop` (the steps, their records, validations and checkpoints),
`_final_evaluation` (the test passes) and `run_record.RunRecord`, which
builds results.json in one place; `run_record.RunHistory` keeps the timing
and device history each checkpoint carries.

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
  under the Xiong et al. and CST protocols (P17). The test pass of the final
  parameters also counts the test labels (the majority-class rate).
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
import dataclasses
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
from lra_msmra import flops as flops_lib
from lra_msmra import hardware
from lra_msmra import metrics as metrics_lib
from lra_msmra import models
from lra_msmra import provenance as provenance_lib
from lra_msmra import run_record
from lra_msmra import sharding
from lra_msmra import steps as steps_lib
from lra_msmra import validation
from lra_msmra import workdir_lock
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

  The analytic matmul FLOPs (`lra_msmra.flops`) of the step's
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
             label: Optional[str] = None, compiling: bool = False,
             num_classes: Optional[int] = None) -> dict[str, Any]:
  """Accuracy and mean loss over `num_steps` batches (-1 = whole split).

  Also returns `seconds` (the whole evaluation) and `seconds_per_batch`
  (batches after the first one, which may wait for a compilation; None with
  one batch).

  Args:
    label: names the evaluation in progress lines (none without it); long
      evaluations print batches done every metrics.EVAL_PROGRESS_SECONDS.
    compiling: the first batch compiles `eval_fn`: say so and time it.
    num_classes: also count the labels of the examples evaluated, per class
      and over all processes (`label_counts`, the majority-class rate of a
      split in the same pass).
  """
  start = time.time()
  total = num_eval_batches(source, batch_size, num_steps)
  progress = metrics_lib.EvalProgress(label, total) if label else None
  totals = None
  steady_start = None
  counts = np.zeros(num_classes or 0, np.int64)
  if compiling and label:
    metrics_lib.log('Compiling the evaluation step ...')
  for i, batch in enumerate(pipeline.eval_batches(
      source, batch_size, num_steps, jax.process_index(),
      jax.process_count())):
    if num_classes:
      counts += np.bincount(batch['targets'][batch['weights'] > 0],
                            minlength=num_classes)
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
  out = {'accuracy': float(totals['correct']) / count,
         'loss': float(totals['loss_sum']) / count,
         'examples': int(count),
         'seconds': end - start,
         'seconds_per_batch': ((end - steady_start) / (total - 1)
                               if total > 1 else None)}
  if num_classes:
    out['label_counts'] = _sum_over_processes(counts)
  return out


def _sum_over_processes(counts: np.ndarray) -> np.ndarray:
  """`counts` of every process (each holds its part of each batch), summed."""
  if jax.process_count() == 1:
    return counts
  gathered = multihost_utils.process_allgather(counts.astype(np.int32))
  return np.asarray(gathered, np.int64).sum(axis=0)


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
  """`train_and_evaluate` once the config is valid and the workdir locked:
  setup, the training loop, the final evaluation and results.json.

  `spec` and `abstract` are the model spec and abstract train state
  `validation.trace` derived from the config alone.
  """
  run, state = _setup(config, workdir, spec, abstract)
  history = run_record.RunHistory(run.meta, provenance_lib.devices(run.mesh),
                                  run.start)
  writer = metrics_lib.Writer(os.path.join(workdir, 'tensorboard'),
                              resume_step=run.start)
  progress = metrics_lib.Progress(
      config.num_train_steps, run.start,
      flops_per_step=run.step_flops['flops'],
      num_devices=int(run.mesh.devices.size),
      peak_flops_per_s=run.peak.flops_per_s if run.peak else None)
  evaluator = _Evaluator(config, run)
  try:
    loop = _TrainLoop(config, run, state, evaluator, writer, progress,
                      history)
    loop.train()
    tests = _final_evaluation(config, workdir, run, evaluator, loop)
  finally:
    writer.close()
    run.ckpt.close()
  return run_record.RunRecord(
      config=config, workdir=workdir, launch=launch, start_time=start_time,
      data_notes=run.data.notes or {}, data_record=run.data_record,
      mesh=run.mesh, num_params=run.num_params, step_flops=run.step_flops,
      peak=run.peak, progress=progress, history=history).write(tests)


@dataclasses.dataclass
class _Run:
  """What `_setup` builds for the training loop and the final evaluation.

  `abstract` is the train state's shapes with their shardings; `start` the
  step training resumes from (0 for a new run) and `meta` the resumed
  checkpoint's meta (None for a new run).
  """
  mesh: jax.sharding.Mesh
  data: pipeline.TaskData
  data_record: dict[str, Any]
  abstract: Any
  ckpt: checkpoint_lib.Checkpointer
  start: int
  meta: Optional[dict[str, Any]]
  num_params: int
  jit_train_step: Any
  jit_eval_step: Any
  step_flops: dict[str, Any]
  peak: Optional[hardware.Peak]


def _setup(config: ml_collections.ConfigDict, workdir: str,
           spec: dict[str, Any], abstract: Any) -> tuple[_Run, Any]:
  """Mesh, data, model, the restored or new train state, the jitted steps
  and their FLOPs; returns the run and its train state."""
  mesh = sharding.create_mesh()
  data, data_record = _load_data(config, workdir, spec, mesh)
  model, tx, schedule = steps_lib.build(config, spec)
  checkpoint_lib.write_json(os.path.join(workdir, checkpoint_lib.CONFIG_FILE),
                            json.loads(config.to_json()))
  checkpoint_lib.write_json(
      os.path.join(workdir, checkpoint_lib.MODEL_SPEC_FILE), spec)

  state_sharding = jax.tree.map(lambda _: sharding.replicated(mesh), abstract)
  abstract = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, state_sharding)
  ckpt = checkpoint_lib.Checkpointer(workdir, config.max_checkpoints_to_keep)
  init_fn = functools.partial(steps_lib.create_train_state, model=model,
                              tx=tx, batch=steps_lib.example_batch(spec))
  start, state, meta = _restore_or_init(config, ckpt, abstract,
                                        state_sharding, init_fn)
  if start == 0 and config.init_from:
    state = _start_from(config.init_from, state, tx, state_sharding)
  num_params = models.count_params(state.params)
  metrics_lib.log(
      f'{config.task} / {config.model.attention} / protocol '
      f'{config.protocol}: {num_params:,} parameters, {mesh.devices.size} '
      f'device(s), train {len(data.train)}, val {len(data.eval)}, test '
      f'{len(data.test)} examples.')

  jit_train_step, jit_eval_step = steps_lib.jit_steps(
      config, model, tx, schedule, mesh, state_sharding)
  run = _Run(
      mesh=mesh, data=data, data_record=data_record, abstract=abstract,
      ckpt=ckpt, start=start, meta=meta, num_params=num_params,
      jit_train_step=jit_train_step, jit_eval_step=jit_eval_step,
      step_flops=train_step_flops(config, spec, jit_train_step, abstract,
                                  mesh),
      peak=hardware.peak(mesh.devices.flat[0].device_kind, config.model.dtype))
  return run, state


def _load_data(config: ml_collections.ConfigDict, workdir: str,
               spec: dict[str, Any], mesh: jax.sharding.Mesh
               ) -> tuple[pipeline.TaskData, dict[str, Any]]:
  """The task data and its data-source record, once the batch sizes fit
  the mesh and a resumed run's config is the recorded one."""
  with errors.input_errors():
    sharding.check_batch_size('batch_size', config.batch_size, mesh,
                              config.grad_accum_steps)
    sharding.check_batch_size('eval_batch_size', config.eval_batch_size,
                              mesh)
    _check_resume_config(workdir, config)
    data = data_lib.get_datasets(config, workdir, spec)
  data_record = fingerprint_lib.data_source_record(data.notes or {})
  metrics_lib.log(describe_data_source(
      data_record, (data.notes or {}).get('data_dir') or
      (data.notes or {}).get('data', '')))
  return data, data_record


def _restore_or_init(config: ml_collections.ConfigDict,
                     ckpt: checkpoint_lib.Checkpointer, abstract: Any,
                     state_sharding: Any, init_fn: Callable[..., Any]
                     ) -> tuple[int, Any, Optional[dict[str, Any]]]:
  """(step, train state, meta) of the newest readable checkpoint, or
  (0, the state initialised under `jit` from the seed, None)."""
  try:
    restored = ckpt.restore_latest(abstract)
  except checkpoint_lib.NoReadableCheckpoint as e:
    ckpt.close()
    raise errors.mark(e)
  if restored is None:
    state = jax.jit(init_fn, out_shardings=state_sharding)(
        jax.random.PRNGKey(config.seed))
    return 0, state, None
  start, state, meta = restored
  ckpt.drop_best_after(start)
  metrics_lib.log(f'Resumed from step {start} ({ckpt.latest.directory}).')
  return start, state, meta


def _start_from(init_from: str, state: Any, tx: Any,
                state_sharding: Any) -> Any:
  """`state` with the encoder of the finished run in `init_from` and a new
  optimizer state; the head keeps its initialisation (fine-tuning)."""
  with errors.input_errors():
    encoder, record = checkpoint_lib.pretrained_encoder(
        init_from, state.params['encoder'])
  params = dict(state.params, encoder=encoder)
  state = jax.jit(lambda s, p: s.replace(params=p, opt_state=tx.init(p)),
                  out_shardings=state_sharding, donate_argnums=0)(state,
                                                                  params)
  metrics_lib.log(
      f"Started the encoder from {record['workdir']} ({record['objective']}"
      f", {record['steps']} steps, final validation loss "
      f"{record['final_val_loss']:.4f}); new head and optimizer state.")
  return state


class _Evaluator:
  """Runs `evaluate` with the run's jitted evaluation step (the first call
  compiles it) and keeps the measured evaluation speed for the ETA."""

  def __init__(self, config: ml_collections.ConfigDict, run: _Run):
    self._config = config
    self._run = run
    self._compiled = False
    # Seconds per evaluation batch, once measured: the ETA's evaluation part.
    self._batch_seconds: Optional[float] = None
    self._val_batches = num_eval_batches(
        run.data.eval, config.eval_batch_size, config.num_eval_steps)
    self._test_batches = num_eval_batches(run.data.test,
                                          config.eval_batch_size, -1)

  def __call__(self, params: Any, source: pipeline.Source, num_steps: int,
               label: str, **kwargs: Any) -> dict[str, Any]:
    result = evaluate(self._run.jit_eval_step, params, source,
                      batch_size=self._config.eval_batch_size,
                      num_steps=num_steps, mesh=self._run.mesh, label=label,
                      compiling=not self._compiled, **kwargs)
    self._compiled = True
    return result

  def validate(self, params: Any, step: int) -> dict[str, Any]:
    """The validation at `step`; its speed becomes the ETA's."""
    result = self(params, self._run.data.eval, self._config.num_eval_steps,
                  f'validation at step {step}')
    if result['seconds_per_batch'] is not None:
      self._batch_seconds = result['seconds_per_batch']
    return result

  def seconds_left(self, step: int) -> Optional[float]:
    """Evaluation seconds from `step` on (None until a speed is measured):
    the validations, then the two test evaluations (one if the best
    validation turns out to be the last)."""
    if self._batch_seconds is None:
      return None
    batches = (_evals_from(step, self._config) * self._val_batches +
               2 * self._test_batches)
    return batches * self._batch_seconds


class _TrainLoop:
  """The training steps from the resumed one to the last, with their
  metrics.jsonl records and progress lines, validations, best-validation
  checkpoints and checkpoints (see the module docstring)."""

  def __init__(self, config: ml_collections.ConfigDict, run: _Run,
               state: Any, evaluator: _Evaluator,
               writer: metrics_lib.Writer, progress: metrics_lib.Progress,
               history: run_record.RunHistory):
    self.config = config
    self.run = run
    self.state = state
    self.evaluator = evaluator
    self.writer = writer
    self.progress = progress
    self.history = history
    self.batches = pipeline.TrainBatches(
        run.data.train, config.batch_size, config.seed, jax.process_index(),
        jax.process_count())
    resumed = run.meta is not None
    self.best = (run.meta['best'] if resumed else
                 {'step': None, 'val_accuracy': -1.0, 'val_loss': None})
    # The training metrics since the last metrics.jsonl record, as saved.
    saved_window = run.meta.get('metrics_window') if resumed else None
    self.window = _MetricsWindow(saved_window)
    # A checkpoint written before the window was saved with it: the steps
    # before it are missing from the first record.
    self.partial_window = bool(resumed and saved_window is None and
                               run.start % config.log_every_steps)
    self.last_saved = run.start if resumed else None
    self.ckpt_dir = str(run.ckpt.latest.directory)
    # The last validation this process ran (None: it trained no step).
    self.last_val: Optional[dict[str, Any]] = None

  def train(self) -> None:
    """Runs the steps; raises `Preempted` once a stop signal's checkpoint
    is saved."""
    config = self.config
    self.history.start()
    with _SigtermFlag() as sigterm:
      for k in range(self.run.start, config.num_train_steps):
        self._step(k)
        step = k + 1
        is_last = step == config.num_train_steps
        stop = sigterm.should_stop(step)
        do_eval = step % config.eval_every_steps == 0 or is_last
        do_ckpt = step % config.checkpoint_every_steps == 0 or is_last
        do_log = step % config.log_every_steps == 0 or is_last
        if do_log or do_eval or do_ckpt or stop:
          self.window.check(self.last_saved, self.ckpt_dir)
          if do_log:
            self._record(step)
        if not do_log and self.progress.early_due(step):
          self.window.check(self.last_saved, self.ckpt_dir)
          self.progress.note(step, self.window.summary(),
                             self.evaluator.seconds_left(step))
        if do_eval:
          self._validate(step)
        self.writer.flush()
        if do_ckpt or stop:
          self._save(step)
        if stop and not is_last:
          self.run.ckpt.wait()
          metrics_lib.log(f'{sigterm.name}: saved step {step} in '
                          f'{self.ckpt_dir}; rerun the same command to '
                          'resume.')
          raise Preempted(step, sigterm.signum)
    self.run.ckpt.wait()
    self.history.stop()

  def _step(self, k: int) -> None:
    """Training step k + 1; the first one of the process compiles."""
    batch = sharding.to_global(self.batches.get(k), self.run.mesh)
    first = k == self.run.start
    if first:
      metrics_lib.log('Compiling the training step ...')
      compile_start = time.time()
    self.state, m = self.run.jit_train_step(self.state, batch)
    if first:
      # The call returns once compiled; the step itself runs after.
      compile_seconds = time.time() - compile_start
      jax.block_until_ready(m)
      metrics_lib.log(f'Compiled the training step in '
                      f'{compile_seconds:.1f} s; training.')
      self.progress.compiled(k + 1)
    self.window.add(k, m)
    # At most two steps in flight: enough to keep the device busy, and a
    # SIGTERM (preemption) is answered within a step or two instead of
    # after every queued step.
    if len(self.window.items) > 1:
      jax.block_until_ready(self.window.items[-2][1])

  def _record(self, step: int) -> None:
    """The training record of `step` (metrics.jsonl, TensorBoard) and its
    progress line."""
    steps_averaged = len(self.window.host)
    summary = self.window.take()
    rate = self.progress.update(step, summary,
                                self.evaluator.seconds_left(step))
    if rate is not None:
      summary['steps_per_sec'] = rate
      summary.update(self.progress.throughput(rate))
    if self.partial_window:
      summary['partial_window_steps'] = steps_averaged
      self.partial_window = False
    self.writer.write(step, {f'train/{n}': v for n, v in summary.items()})

  def _validate(self, step: int) -> None:
    """Validates at `step`; a new best validation is checkpointed."""
    val = self.last_val = self.evaluator.validate(self.state.params, step)
    self.progress.exclude(val['seconds'])
    self.writer.write(step, {'val/accuracy': val['accuracy'],
                             'val/loss': val['loss']})
    metrics_lib.log(f'step {step}: val accuracy {val["accuracy"]:.4f}'
                    f', loss {val["loss"]:.4f}')
    if val['accuracy'] > self.best['val_accuracy']:
      self.best = {'step': step, 'val_accuracy': val['accuracy'],
                   'val_loss': val['loss']}
      self.run.ckpt.save_best(step, self.state.params, self.best)

  def _save(self, step: int) -> None:
    """Checkpoints `step`: the state, the best validation, the timing and
    device history, the metrics of the record in progress and the data
    position."""
    config = self.config
    meta = {'step': step, 'best': self.best,
            **self.history.checkpoint(step, self.progress),
            'metrics_window': self.window.state(),
            'data_position': {'next_train_batch': step, 'seed': config.seed,
                              'examples_consumed': step * config.batch_size}}
    # The metrics of `step` reach the disk before its checkpoint does.
    self.writer.flush()
    self.run.ckpt.save(step, self.state, meta)
    self.last_saved = step


def _final_evaluation(config: ml_collections.ConfigDict, workdir: str,
                      run: _Run, evaluator: _Evaluator, loop: _TrainLoop
                      ) -> run_record.FinalEvaluation:
  """Tests the final and the best-validation parameters: once, when they
  are those of the same step. The test pass of the final parameters also
  counts the test labels (the majority-class rate)."""
  data, state = run.data, loop.state
  last_val = loop.last_val
  if last_val is None:  # Resumed after the last step: evaluate again.
    last_val = evaluator(state.params, data.eval, config.num_eval_steps,
                         'validation')
  final_step = int(jax.device_get(state.step))
  final_test = evaluator(state.params, data.test, -1,
                         'test, final parameters',
                         num_classes=data.num_classes)
  best_restored = run.ckpt.restore_best(run.abstract.params)
  if best_restored is None:
    raise RuntimeError(f'No best-validation checkpoint in {workdir}/best.')
  best_step, best_params, _ = best_restored
  if best_step == final_step:
    # Saved from the final parameters at this step: the same test pass.
    best_test = final_test
  else:
    best_test = evaluator(best_params, data.test, -1,
                          'test, best-validation parameters')
  return run_record.FinalEvaluation(
      final_step=final_step, final_val=last_val, final_test=final_test,
      best_step=best_step, best=loop.best, best_test=best_test,
      label_counts=final_test['label_counts'])
