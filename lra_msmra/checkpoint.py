"""Orbax checkpoints of training runs, and loading them without the trainer.

Layout of a workdir::

  config.json          the run's config
  model_spec.json      what the model needs from the data (vocab, classes, ...)
  checkpoints/<step>/  latest states: params, optimizer state, step, RNG,
                       plus `meta` (data position, best validation so far)
  best/<step>/         parameters of the best-validation evaluation
  results.json         final report (see lra_msmra.train)
  tensorboard/         event files and metrics.jsonl (one record per step)
  lock                 held by the run using the workdir
                       (lra_msmra.workdir_lock)

Restoring walks the saved steps from the newest down: a checkpoint that fails
to restore (a partial or corrupted write) is reported and the previous one is
used, so a crash never silently restarts from scratch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Optional, Union

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from lra_msmra import metrics as metrics_lib
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
      metrics_lib.log('WARNING: ' + msg)
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
  if metrics_lib.is_chief():
    target.mkdir(parents=True, exist_ok=True)
    for step in steps:
      dest = target / f'{step}-{int(time.time())}'
      (directory / str(step)).rename(dest)
      metrics_lib.log(f'Moved unreadable checkpoint {step} to {dest}.')
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('lra_msmra_move_unreadable')
  manager.reload()


def write_json(path: str, obj: Any) -> None:
  if metrics_lib.is_chief():
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
