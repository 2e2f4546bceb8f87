"""One trainer for every task and mechanism: `train_and_evaluate(config, workdir)`.

Order of operations: check the config, build its model and optimizer and
`jax.eval_shape` the train state, once (`validation.build`); lock the
workdir, build the mesh, load the task data, derive the state's shardings,
restore the newest readable checkpoint or initialise under `jit` with those
shardings, then run `jit(train_step, donate_argnums=0)`. The train state and
the step functions are `lra_msmra.steps`.

The trainer is four modules, each with one job: this one (setup, the loop,
the evaluations, preemption), `lra_msmra.records` (what the run writes
down: metrics.jsonl, the run history, results.json, provenance; the loop
touches it through one `records.Logbook`), `lra_msmra.console` (progress
lines, process 0's messages) and `lra_msmra.checkpoint` (the workdir: its
lock and checkpoints). The code follows the order above: `_setup`
(everything up to the first step), `_train` (the steps, their records,
validations and checkpoints), `_final_evaluation` (the test passes) and
`records.RunRecord` (results.json). A step touches three objects: the
`Logbook`, the `checkpoint.Checkpointer` and `Preemption`, the one place
that handles signals.

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
  (`checkpoint.lock_workdir`). A run that fails before it trains (missing
  or bad data, a refused resume) removes the workdir if it created it.
* Progress: the compilation of the training step is reported as its own
  phase; steps/s and the ETA leave out the first step of a process (it
  waits for that compilation) and the evaluations, which the ETA adds back
  at their measured speed; long evaluations report batches done. Before
  the first line of `log_every_steps`, lines also come after the process's
  steps 1, 10, 100, ... and every `console.EARLY_LINE_SECONDS`.
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
from lra_msmra import console
from lra_msmra import data as data_lib
from lra_msmra import errors
from lra_msmra import fingerprint as fingerprint_lib
from lra_msmra import flops as flops_lib
from lra_msmra import hardware
from lra_msmra import models
from lra_msmra import records
from lra_msmra import sharding
from lra_msmra import steps as steps_lib
from lra_msmra import validation
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
      evaluations print batches done every console.EVAL_PROGRESS_SECONDS.
    compiling: the first batch compiles `eval_fn`: say so and time it.
    num_classes: also count the labels of the examples evaluated, per class
      and over all processes (`label_counts`, the majority-class rate of a
      split in the same pass).
  """
  start = time.time()
  total = num_eval_batches(source, batch_size, num_steps)
  progress = console.EvalProgress(label, total) if label else None
  totals = None
  steady_start = None
  counts = np.zeros(num_classes or 0, np.int64)
  if compiling and label:
    console.log('Compiling the evaluation step ...')
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
        console.log(f'Compiled the evaluation step in '
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
    console.log(f'Resuming with changed {describe_changes(old, new, diff)}.')


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


class Preemption:
  """Tells every process to stop at the same step after SIGTERM (or Ctrl-C).

  One process: a Python handler sets a flag instead of dying at once (main
  thread only); Ctrl-C (SIGINT) is handled the same way, and a second Ctrl-C
  stops at once (KeyboardInterrupt, no checkpoint of the current step). A
  closed stdout (`main ... | head`: SIGPIPE, which Python turns into a
  broken pipe error; see `console.stdout_closed`) stops the run the same
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

  def requested(self, step: int) -> bool:
    """Whether to checkpoint and exit after `step`; call it at every step."""
    if self._multiprocess:
      # Only process 0 prints, and only SIGTERM is agreed on: a closed
      # stdout there just drops its lines.
      self.raised = multihost_utils.reached_preemption_sync_point(step)
    elif not self.raised and console.stdout_closed():
      self.raised = True
      self.signum = signal.SIGPIPE
    return self.raised

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, signal.SIG_DFL if previous is None else previous)


# ------------------------------------------------------------------- the run


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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       launch: Optional[Mapping[str, Any]] = None
                       ) -> dict[str, Any]:
  """Trains, evaluates and tests one config; returns the results dict.

  Re-running in the same workdir resumes from the newest readable checkpoint.
  A workdir that another run is using is refused
  (`checkpoint.WorkdirLocked`).

  Args:
    config: the run config.
    workdir: folder for checkpoints, metrics and results.json.
    launch: how the run was launched (config file and command-line
      overrides), recorded in results.json.
  """
  start_time = time.time()
  with errors.input_errors():
    # The one build and trace of the model: checks every knob against the
    # task's length and gives the train state's shapes, before any data is
    # read.
    built = validation.build(config)
    # Fails here, before anything runs, if the config names no data source.
    data_lib.data_source(config)
  workdir = os.path.abspath(workdir)
  created = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  lock = checkpoint_lib.lock_workdir(workdir)
  cleared = False
  try:
    run, state = _setup(config, workdir, built)
    return _train_and_evaluate(config, workdir, launch, start_time, run,
                               state)
  except BaseException:
    # A run that fails before it starts (missing or bad data, a refused
    # resume, Ctrl-C while data is generated) leaves no workdir it created.
    cleared = created and checkpoint_lib.clear_unstarted_workdir(workdir,
                                                                 lock)
    raise
  finally:
    lock.release()
    if cleared:
      try:
        os.rmdir(workdir)
      except OSError:  # Something else appeared there meanwhile.
        pass


@dataclasses.dataclass
class _Run:
  """What `_setup` builds for the training loop and the final evaluation.

  `abstract` is the train state's shapes with their shardings; `start` the
  step training resumes from (0 for a new run) and `meta` the resumed
  checkpoint's meta (None for a new run); `eval_compiled` whether this
  process has run the evaluation step yet.
  """
  config: ml_collections.ConfigDict
  workdir: str
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
  eval_compiled: bool = False


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        launch: Optional[Mapping[str, Any]],
                        start_time: float, run: _Run, state: Any
                        ) -> dict[str, Any]:
  """The training loop, the final evaluation and results.json, once the
  run is set up."""
  progress = console.Progress(
      config.num_train_steps, run.start,
      flops_per_step=run.step_flops['flops'],
      num_devices=int(run.mesh.devices.size),
      peak_flops_per_s=run.peak.flops_per_s if run.peak else None)
  log = records.Logbook(
      config, workdir, run.start, run.meta, progress,
      records.devices(run.mesh),
      eval_batches=(num_eval_batches(run.data.eval, config.eval_batch_size,
                                     config.num_eval_steps),
                    num_eval_batches(run.data.test, config.eval_batch_size,
                                     -1)))
  try:
    state = _train(run, state, log)
    tests = _final_evaluation(run, state, log)
  finally:
    log.close()
    run.ckpt.close()
  return records.RunRecord(
      config=config, workdir=workdir, launch=launch, start_time=start_time,
      data_notes=run.data.notes or {}, data_record=run.data_record,
      mesh=run.mesh, num_params=run.num_params, step_flops=run.step_flops,
      peak=run.peak, log=log).write(tests)


def _setup(config: ml_collections.ConfigDict, workdir: str,
           built: validation.Built) -> tuple[_Run, Any]:
  """Mesh, data, the restored or new train state, the jitted steps and
  their FLOPs, from the model and optimizer `built` once; returns the run
  and its train state."""
  mesh = sharding.create_mesh()
  data, data_record = _load_data(config, workdir, built.spec, mesh)
  checkpoint_lib.write_json(os.path.join(workdir, checkpoint_lib.CONFIG_FILE),
                            json.loads(config.to_json()))
  checkpoint_lib.write_json(
      os.path.join(workdir, checkpoint_lib.MODEL_SPEC_FILE), built.spec)

  state_sharding = jax.tree.map(lambda _: sharding.replicated(mesh),
                                built.abstract)
  abstract = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      built.abstract, state_sharding)
  ckpt = checkpoint_lib.Checkpointer(workdir, config.max_checkpoints_to_keep)
  init_fn = functools.partial(steps_lib.create_train_state, model=built.model,
                              tx=built.tx,
                              batch=steps_lib.example_batch(built.spec))
  start, state, meta = _restore_or_init(config, ckpt, abstract,
                                        state_sharding, init_fn)
  if start == 0 and config.init_from:
    state = _start_from(config.init_from, state, built.tx, state_sharding)
  num_params = models.count_params(state.params)
  console.log(
      f'{config.task} / {config.model.attention} / protocol '
      f'{config.protocol}: {num_params:,} parameters, {mesh.devices.size} '
      f'device(s), train {len(data.train)}, val {len(data.eval)}, test '
      f'{len(data.test)} examples.')

  jit_train_step, jit_eval_step = steps_lib.jit_steps(
      config, built.model, built.tx, built.schedule, mesh, state_sharding)
  run = _Run(
      config=config, workdir=workdir, mesh=mesh, data=data, data_record=data_record,
      abstract=abstract, ckpt=ckpt, start=start, meta=meta,
      num_params=num_params, jit_train_step=jit_train_step,
      jit_eval_step=jit_eval_step,
      step_flops=train_step_flops(config, built.spec, jit_train_step,
                                  abstract, mesh),
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
  console.log(describe_data_source(
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
  console.log(f'Resumed from step {start} ({ckpt.latest.directory}).')
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
  console.log(
      f"Started the encoder from {record['workdir']} ({record['objective']}"
      f", {record['steps']} steps, final validation loss "
      f"{record['final_val_loss']:.4f}); new head and optimizer state.")
  return state


# ------------------------------------------------------------------ the loop


def _evaluate(run: _Run, params: Any, source: pipeline.Source,
              num_steps: int, label: str, **kwargs: Any) -> dict[str, Any]:
  """`evaluate` with the run's jitted evaluation step; the first call of
  the process compiles it."""
  result = evaluate(run.jit_eval_step, params, source,
                    batch_size=run.config.eval_batch_size,
                    num_steps=num_steps, mesh=run.mesh, label=label,
                    compiling=not run.eval_compiled, **kwargs)
  run.eval_compiled = True
  return result


def _train(run: _Run, state: Any, log: records.Logbook) -> Any:
  """The training steps from the resumed one to the last, with their
  records, validations, best-validation checkpoints and checkpoints (see the
  module docstring); returns the final train state. Raises `Preempted`
  once a stop signal's checkpoint is saved."""
  config = run.config
  batches = pipeline.TrainBatches(
      run.data.train, config.batch_size, config.seed, jax.process_index(),
      jax.process_count())
  in_flight = None
  log.history.start()
  with Preemption() as preemption:
    for k in range(run.start, config.num_train_steps):
      state, m = _train_step(run, state, batches.get(k), k, log.progress)
      log.add(k, m)
      # At most two steps in flight: enough to keep the device busy, and a
      # SIGTERM (preemption) is answered within a step or two instead of
      # after every queued step.
      if in_flight is not None:
        jax.block_until_ready(in_flight)
      in_flight = m
      step = k + 1
      is_last = step == config.num_train_steps
      stop = preemption.requested(step)
      do_eval = step % config.eval_every_steps == 0 or is_last
      do_ckpt = step % config.checkpoint_every_steps == 0 or is_last
      do_log = step % config.log_every_steps == 0 or is_last
      if do_log or do_eval or do_ckpt or stop:
        log.check()
      if do_log:
        log.record(step)
      else:
        log.early(step)
      if do_eval:
        val = _evaluate(run, state.params, run.data.eval,
                        config.num_eval_steps, f'validation at step {step}')
        if log.validation(step, val):
          run.ckpt.save_best(step, state.params, log.best)
      log.writer.flush()
      if do_ckpt or stop:
        run.ckpt.save(step, state, log.checkpoint_meta(step))
      if stop and not is_last:
        run.ckpt.wait()
        console.log(f'{preemption.name}: saved step {step} in '
                    f'{log.ckpt_dir}; rerun the same command to resume.')
        raise Preempted(step, preemption.signum)
  run.ckpt.wait()
  log.history.stop()
  return state


def _train_step(run: _Run, state: Any, batch: Mapping[str, np.ndarray],
                k: int, progress: console.Progress
                ) -> tuple[Any, dict[str, jax.Array]]:
  """Training step k + 1; the first one of the process compiles."""
  batch = sharding.to_global(batch, run.mesh)
  if k != run.start:
    return run.jit_train_step(state, batch)
  console.log('Compiling the training step ...')
  compile_start = time.time()
  state, m = run.jit_train_step(state, batch)
  # The call returns once compiled; the step itself runs after.
  compile_seconds = time.time() - compile_start
  jax.block_until_ready(m)
  console.log(f'Compiled the training step in {compile_seconds:.1f} s; '
              'training.')
  progress.compiled(k + 1)
  return state, m


def _final_evaluation(run: _Run, state: Any, log: records.Logbook
                      ) -> records.FinalEvaluation:
  """Tests the final and the best-validation parameters: once, when they
  are those of the same step. The test pass of the final parameters also
  counts the test labels (the majority-class rate)."""
  config, data = run.config, run.data
  last_val = log.last_val
  if last_val is None:  # Resumed after the last step: evaluate again.
    last_val = _evaluate(run, state.params, data.eval, config.num_eval_steps,
                         'validation')
  final_step = int(jax.device_get(state.step))
  final_test = _evaluate(run, state.params, data.test, -1,
                         'test, final parameters',
                         num_classes=data.num_classes)
  best_restored = run.ckpt.restore_best(run.abstract.params)
  if best_restored is None:
    raise RuntimeError(f'No best-validation checkpoint in {run.workdir}/best.')
  best_step, best_params, _ = best_restored
  if best_step == final_step:
    # Saved from the final parameters at this step: the same test pass.
    best_test = final_test
  else:
    best_test = _evaluate(run, best_params, data.test, -1,
                          'test, best-validation parameters')
  return records.FinalEvaluation(
      final_step=final_step, final_val=last_val, final_test=final_test,
      best_step=best_step, best=log.best, best_test=best_test,
      label_counts=final_test['label_counts'])
