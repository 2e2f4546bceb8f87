"""A run's workdir: Orbax checkpoints, loading them without the trainer,
and the lock that keeps one run per workdir.

Layout of a workdir::

  config.json          the run's config
  model_spec.json      what the model needs from the data (vocab, classes, ...)
  checkpoints/<step>/  latest states: params, optimizer state, step, RNG,
                       plus `meta` (data position, best validation so far)
  best/<step>/         parameters of the best-validation evaluation
  results.json         final report (see lra_msmra.train)
  tensorboard/         event files and metrics.jsonl (one record per step)
  lock                 held by the run using the workdir (below)

Restoring walks the saved steps from the newest down: a checkpoint that fails
to restore (a partial or corrupted write) is reported and the previous one is
used, so a crash never silently restarts from scratch.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import sys
import time
import uuid
from typing import Any, Optional, Union

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from lra_msmra import console
from lra_msmra import errors
from lra_msmra import steps as steps_lib

CONFIG_FILE = 'config.json'
MODEL_SPEC_FILE = 'model_spec.json'


def _manager(directory: str, max_to_keep: int) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                           create=True),
      item_names=('state', 'meta'))


class Checkpointer:
  """Latest and best-validation checkpoints of one run."""

  def __init__(self, workdir: str, max_to_keep: int):
    self.latest = _manager(os.path.join(workdir, 'checkpoints'), max_to_keep)
    self.best = _manager(os.path.join(workdir, 'best'), 1)

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    # Orbax names its cross-process barriers after the step, so two managers
    # must not save the same step at once: finish the other one first.
    self.best.wait_until_finished()
    self.latest.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        force=True)

  def save_best(self, step: int, params: Any, meta: dict[str, Any]) -> None:
    self.latest.wait_until_finished()
    for old in self.best.all_steps():
      if old >= step:
        self.best.delete(old)
    self.best.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)),
        force=True)

  def wait(self) -> None:
    self.latest.wait_until_finished()
    self.best.wait_until_finished()

  def restore_latest(self, abstract_state: Any
                     ) -> Optional[tuple[int, Any, dict[str, Any]]]:
    """Returns (step, state, meta) of the newest readable checkpoint, or None."""
    return _restore_newest(self.latest, abstract_state)

  def restore_best(self, abstract_params: Any
                   ) -> Optional[tuple[int, Any, dict[str, Any]]]:
    return _restore_newest(self.best, abstract_params)

  def drop_best_after(self, step: int) -> None:
    """Deletes best checkpoints newer than a resumed step (they will be redone)."""
    for s in self.best.all_steps():
      if s > step:
        self.best.delete(s)

  def close(self) -> None:
    self.wait()
    self.latest.close()
    self.best.close()


class NoReadableCheckpoint(RuntimeError):
  """Checkpoints exist but none of them can be restored."""


def _first_line(error: BaseException, limit: int = 160) -> str:
  text = (str(error).strip().splitlines() or [''])[0]
  return text if len(text) <= limit else text[:limit - 3] + '...'


def _drop_late_callback_errors() -> None:
  """Silences the tracebacks that follow a failed restore.

  When a checkpoint fails to restore, the storage layer's reads that were
  still in flight finish afterwards and hand their results to an event loop
  orbax has already closed; each reports a `RuntimeError: Event loop is
  closed` through `sys.unraisablehook`, a traceback of a dozen lines that
  says nothing about the run. Those are logged at INFO; every other report
  reaches the previous hook unchanged. Installed once, after the first
  failure.
  """
  if getattr(sys.unraisablehook, '_lra_msmra', False):
    return
  previous = sys.unraisablehook

  def hook(u):
    tb = u.exc_traceback
    if (u.exc_type is RuntimeError and
        str(u.exc_value) == 'Event loop is closed' and tb is not None and
        tb.tb_frame.f_code.co_name == 'call_soon_threadsafe'):
      logging.info('Ignored after a failed restore: %r', u.exc_value)
      return
    previous(u)

  hook._lra_msmra = True  # pylint: disable=protected-access
  sys.unraisablehook = hook


def _restore_newest(manager: ocp.CheckpointManager, abstract: Any
                    ) -> Optional[tuple[int, Any, dict[str, Any]]]:
  manager.reload()
  steps = sorted(manager.all_steps(), reverse=True)
  unreadable = []
  for i, step in enumerate(steps):
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract),
          meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except
      older = steps[i + 1] if i + 1 < len(steps) else None
      # The storage layer's messages run to dozens of lines: the first one
      # here, all of them in the INFO log (`--verbose`).
      logging.info('Restoring %s/%s failed: %r', manager.directory, step, e)
      msg = (f'Checkpoint {manager.directory}/{step} could not be restored '
             f'({type(e).__name__}: {_first_line(e)}); ' +
             (f'falling back to step {older}.' if older is not None else
              'no older checkpoint is left.'))
      console.log('WARNING: ' + msg)
      _drop_late_callback_errors()
      unreadable.append(step)
      continue
    _move_aside(manager, unreadable)
    return step, restored.state, dict(restored.meta)
  if steps:
    raise NoReadableCheckpoint(
        f'No checkpoint in {manager.directory} could be restored (steps '
        f'{steps}). Move the folder away to start from scratch.')
  return None


def _move_aside(manager: ocp.CheckpointManager, steps: list[int]) -> None:
  """Moves unreadable checkpoints to `<dir>_unreadable/` (kept, not deleted).

  The run continues from an older step and will save these steps again.
  """
  if not steps:
    return
  directory = epath.Path(manager.directory)
  target = directory.parent / f'{directory.name}_unreadable'
  if console.is_chief():
    target.mkdir(parents=True, exist_ok=True)
    for step in steps:
      dest = target / f'{step}-{int(time.time())}'
      (directory / str(step)).rename(dest)
      console.log(f'Moved unreadable checkpoint {step} to {dest}.')
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('lra_msmra_move_unreadable')
  manager.reload()


def write_json(path: str, obj: Any) -> None:
  if console.is_chief():
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
      json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def read_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path} not found: {workdir} is not a workdir '
                            'written by lra_msmra.main.')
  with open(path) as f:
    return config_from_dict(json.load(f))


def config_from_dict(d: dict[str, Any]) -> ml_collections.ConfigDict:
  """Inverse of `config.to_dict()` after a JSON round trip (lists -> tuples)."""
  def fix(x):
    if isinstance(x, dict):
      return {k: fix(v) for k, v in x.items()}
    if isinstance(x, list):
      return tuple(fix(v) for v in x)
    return x
  return ml_collections.ConfigDict(fix(d))


def load_checkpoint(workdir: str, which: Union[str, int] = 'best'
                    ) -> tuple[ml_collections.ConfigDict, Any, Any]:
  """Loads a trained model for use in a notebook, without running the trainer.

  Args:
    workdir: a workdir written by `python -m lra_msmra.main`.
    which: 'best' (best-validation parameters), 'latest' (newest training
      checkpoint), or a step number of a training checkpoint.

  Returns:
    (config, model, params): call `model.apply({'params': params}, batch,
    deterministic=True)` with `batch = {'inputs': ids [batch, length]}` (plus
    `'inputs2'` for Retrieval) to get logits `[batch, num_classes]`.
  """
  config = read_config(workdir)
  with open(os.path.join(workdir, MODEL_SPEC_FILE)) as f:
    spec = json.load(f)
  model, _, _ = steps_lib.build(config, spec)
  # Restore onto this machine's first device, whatever topology saved it
  # (e.g. a TPU pod checkpoint opened in a notebook).
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
      steps_lib.abstract_train_state(config, spec))
  ckpt = Checkpointer(workdir, max_to_keep=1000)
  try:
    if which == 'best':
      found = ckpt.restore_best(abstract.params)
      if found is None:
        raise FileNotFoundError(f'No best-validation checkpoint in {workdir}.')
      return config, model, found[1]
    manager = ckpt.latest
    steps = manager.all_steps()
    step = max(steps, default=None) if which == 'latest' else int(which)
    if step not in steps:
      raise FileNotFoundError(
          f'No training checkpoint at step {step} in {manager.directory}; '
          f'available: {sorted(steps)}.')
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract)))
    return config, model, restored.state.params
  finally:
    ckpt.close()


# ------------------------------------------- starting from a pretrained run

RESULTS_FILE = 'results.json'


def pretraining_record(workdir: str) -> dict[str, Any]:
  """What a fine-tuning run records of the run it starts from
  (results.json's `pretraining`): objective, masking, steps, the source
  workdir and its final validation loss and accuracy (per token for a
  pretraining objective).

  Raises:
    ValueError: `workdir` holds no finished run.
  """
  path = os.path.join(workdir, RESULTS_FILE)
  if not os.path.exists(path):
    raise ValueError(
        f'config.init_from={workdir}: no {RESULTS_FILE} there, so no '
        'finished run to start from. Finish that run first (rerun its '
        'command: it resumes), or fix the path.')
  with open(path) as f:
    results = json.load(f)
  config = results.get('config', {})
  objective = config.get('objective', 'classify')
  record = {'objective': objective, 'workdir': os.path.abspath(workdir),
            'steps': results['final']['step'],
            'final_val_loss': results['final']['val_loss'],
            'final_val_accuracy': results['final']['val_accuracy']}
  if objective == 'masked':
    record['masking'] = dict(config.get('masking', {}))
  return record


def pretrained_encoder(workdir: str, target: Any
                       ) -> tuple[Any, dict[str, Any]]:
  """The encoder parameters of the finished run in `workdir` (its newest
  checkpoint), as a tree shaped like `target`, this run's encoder
  parameters, and that run's `pretraining_record`.

  A masked-objective run's token table has one row more, the mask token's;
  it is dropped. Any other difference of keys or shapes is refused.

  Raises:
    ValueError: one line naming the workdir and the keys that differ.
  """
  record = pretraining_record(workdir)  # A finished run, or one line.
  config, _, params = load_checkpoint(workdir, 'latest')
  if 'encoder' not in params:
    raise ValueError(f'config.init_from={workdir}: its parameters have no '
                     "'encoder' (top-level keys: {sorted(params)}).")
  flat = {'/'.join(str(getattr(k, 'key', k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(
              params['encoder'])}
  wanted = jax.tree_util.tree_leaves_with_path(target)
  names = ['/'.join(str(getattr(k, 'key', k)) for k in path)
           for path, _ in wanted]
  if config.get('objective', 'classify') == 'masked':
    embed = flat.get('embed/embedding')
    if embed is not None:
      flat['embed/embedding'] = embed[:-1]  # The mask token's row.
  missing = [n for n in names if n not in flat]
  unexpected = sorted(set(flat) - set(names))
  shapes = [f'{n} {tuple(flat[n].shape)} → {tuple(leaf.shape)}'
            for n, (_, leaf) in zip(names, wanted)
            if n in flat and tuple(flat[n].shape) != tuple(leaf.shape)]
  if missing or unexpected or shapes:
    parts = ([f'missing {missing}'] if missing else []) + (
        [f'not in this model {unexpected}'] if unexpected else []) + (
            [f'shapes (there → here) {shapes}'] if shapes else [])
    raise ValueError(
        f'config.init_from={workdir}: its encoder does not fit this '
        f'config\'s: {"; ".join(parts)}. Fine-tune with the same task and '
        'config.model as the pretraining run.')
  # On the host: the caller places them as its state is placed.
  leaves = [np.asarray(jax.device_get(flat[n]), leaf.dtype)
            for n, (_, leaf) in zip(names, wanted)]
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(target),
                                      leaves), record


# ------------------------------------------------------- the workdir lock
#
# One run per workdir: the `<workdir>/lock` file.
#
# Two runs writing the same checkpoints, metrics and results would corrupt each
# other's work without a sign, so a run takes the lock before it reads or
# writes anything else in its workdir and removes it when it ends (normally,
# on an error, on SIGTERM or Ctrl-C). With several processes only process 0
# takes it; the workdir sits on a filesystem they share.
#
# The lock is a small JSON file (process id, host, start time, command) created
# atomically (`O_CREAT | O_EXCL`): of two runs starting together exactly one
# gets it. A run that finds a lock
#
# * of a live process on this machine refuses, naming its process id and host;
# * of a process that no longer runs on this machine (a killed run: SIGKILL,
#   out of memory, a crash of the machine) replaces it, saying so in one line,
#   so the same command resumes as before;
# * written on another machine (or in another container, whose processes this
#   one cannot see) refuses too: whether that process still runs cannot be
#   checked from here. The message says which file to delete if the user
#   knows that run is gone.

LOCK_FILE = 'lock'
# An empty or unreadable lock younger than this may be one being written
# right now by a run that is starting; older, it is a leftover.
_UNREADABLE_GRACE_SECONDS = 30.0
# Tokens of the locks this process holds.
_HELD: set[str] = set()


class WorkdirLocked(RuntimeError):
  """Another run holds the workdir (the message names it and the fix)."""


def _process_start(pid: int) -> Optional[str]:
  """When `pid` started, in clock ticks since boot (Linux), else None."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      stat = f.read()
  except OSError:
    return None
  fields = stat[stat.rfind(')') + 2:].split()
  return fields[19] if len(fields) > 19 else None  # Field 22 of stat(5).


def _pid_namespace() -> Optional[str]:
  """Identifies the set of processes this one can see (its pid namespace)."""
  try:
    return os.readlink('/proc/self/ns/pid')
  except OSError:
    return None


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Someone else's process: it exists.
    return True
  except OSError:
    return True
  return True


def _describe(holder: dict[str, Any]) -> str:
  return (f'process {holder.get("pid", "?")} on host '
          f'{holder.get("host", "?")} (started {holder.get("started", "?")}'
          f': {holder.get("command", "?")})')


class WorkdirLock:
  """The lock of one workdir; `acquire()` then `release()`."""

  def __init__(self, workdir: str, command: Optional[str] = None):
    self.path = os.path.join(workdir, LOCK_FILE)
    self.workdir = workdir
    self._token = uuid.uuid4().hex
    self._held = False
    self._command = command or shlex.join([sys.executable] + sys.argv)

  def _record(self) -> dict[str, Any]:
    pid = os.getpid()
    return {'pid': pid, 'host': socket.gethostname(),
            'started': time.strftime('%Y-%m-%d %H:%M:%S %z'),
            'command': self._command, 'process_start': _process_start(pid),
            'pid_namespace': _pid_namespace(), 'token': self._token}

  def _stale_reason(self, holder: Optional[dict[str, Any]], age: float
                    ) -> Optional[str]:
    """Why a found lock is a leftover, or None if it may be held."""
    if holder is None:
      if age > _UNREADABLE_GRACE_SECONDS:
        return f'an unreadable lock file, {age:.0f} s old'
      return None
    if (holder.get('host') != socket.gethostname() or
        holder.get('pid_namespace') != _pid_namespace()):
      return None  # Not a process this one can see.
    pid = holder.get('pid')
    if not isinstance(pid, int):
      return 'a lock without a process id'
    if pid == os.getpid():
      if holder.get('token') in _HELD:
        return None  # Held by another run in this very process.
      # An earlier process had our process id (e.g. a restarted container).
      return f'left by an earlier process {pid}'
    if not _alive(pid):
      return f'process {pid} is no longer running'
    recorded, now = holder.get('process_start'), _process_start(pid)
    if recorded is not None and now is not None and recorded != now:
      return f'process id {pid} now belongs to another process'
    return None

  def _refusal(self, holder: Optional[dict[str, Any]]) -> str:
    if holder is None:
      return (f'{self.path} exists but is unreadable: another run may be '
              'starting in this workdir. If none is, delete that file and '
              'run again.')
    same_machine = (holder.get('host') == socket.gethostname() and
                    holder.get('pid_namespace') == _pid_namespace())
    if same_machine:
      return (f'Another run is using {self.workdir}: {_describe(holder)}. '
              'Wait for it to end or stop it (SIGTERM or Ctrl-C saves a '
              'checkpoint), or use another --workdir.')
    return (f'{self.workdir} is locked by {_describe(holder)}, which cannot '
            'be checked from this machine. If that run is over, delete '
            f'{self.path} and run again; otherwise use another --workdir.')

  def acquire(self) -> Optional[str]:
    """Takes the lock; returns a line saying a stale lock was replaced.

    Raises:
      WorkdirLocked: another run may hold it.
    """
    replaced = None
    for _ in range(3):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder, raw, age = self._read()
        if raw is None:  # Released meanwhile: try again.
          continue
        reason = self._stale_reason(holder, age)
        if reason is None:
          raise WorkdirLocked(self._refusal(holder)) from None
        if self._remove_if_unchanged(raw):
          replaced = (f'Replaced a stale lock in {self.workdir} ('
                      f'{reason}' + (f'; it was {_describe(holder)})'
                                     if holder else ')') + '.')
        continue
      with os.fdopen(fd, 'w') as f:
        json.dump(self._record(), f, indent=2)
        f.flush()
        os.fsync(f.fileno())
      self._held = True
      _HELD.add(self._token)
      return replaced
    raise WorkdirLocked(f'Could not take {self.path}: other runs keep '
                        'creating it. Is another run starting in this '
                        'workdir?')

  def _read(self) -> tuple[Optional[dict[str, Any]], Optional[bytes], float]:
    """(parsed lock or None, its bytes or None if there is no lock, its age
    in seconds)."""
    try:
      with open(self.path, 'rb') as f:
        raw = f.read()
      age = time.time() - os.path.getmtime(self.path)
    except FileNotFoundError:
      return None, None, 0.0
    try:
      holder = json.loads(raw)
    except ValueError:
      return None, raw, age
    return (holder if isinstance(holder, dict) else None), raw, age

  def _remove_if_unchanged(self, raw: bytes) -> bool:
    """Removes the lock if it still holds `raw` (not one another run just
    took); returns whether it was removed."""
    aside = f'{self.path}.stale.{os.getpid()}'
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:
      return False
    with open(aside, 'rb') as f:
      unchanged = f.read() == raw
    if unchanged:
      os.remove(aside)
      return True
    # Another run replaced the stale lock first: put its lock back.
    try:
      os.link(aside, self.path)
    except FileExistsError:
      pass
    os.remove(aside)
    return False

  def release(self) -> None:
    """Removes the lock if this object holds it (idempotent)."""
    if not self._held:
      return
    self._held = False
    _HELD.discard(self._token)
    holder, _, _ = self._read()
    if holder is not None and holder.get('token') == self._token:
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass


def lock_workdir(workdir: str) -> WorkdirLock:
  """Takes the workdir's lock on process 0; every process raises if it
  could not (all of them stop, none waits in a collective)."""
  lock = WorkdirLock(workdir)
  error = None
  if console.is_chief():
    try:
      note = lock.acquire()
    except WorkdirLocked as e:
      error = e
    else:
      if note:
        console.log(note)
  if jax.process_count() > 1:
    failed = int(multihost_utils.broadcast_one_to_all(
        np.int32(error is not None)))
    if failed and error is None:
      error = WorkdirLocked(
          f'Process 0 could not lock {workdir} (see its output).')
  if error is not None:
    raise errors.mark(error)
  return lock


def clear_unstarted_workdir(workdir: str,
                             lock: WorkdirLock) -> bool:
  """Deletes what a run wrote in `workdir` if it never started training
  (no config.json), except the lock it still holds; returns whether it did.
  Process 0 only."""
  if (not console.is_chief() or
      os.path.exists(os.path.join(workdir, CONFIG_FILE))):
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
