"""What a run writes down about itself, each in one place.

* `Logbook`: what the training loop records as it goes: metrics.jsonl and
  TensorBoard (`Writer`, one record per `log_every_steps`, averaging the
  steps since the previous one: `MetricsWindow`), the progress line
  (`console.Progress`), the best validation so far, the run's timing and
  device history (`RunHistory`), and what each checkpoint carries of them
  (`Logbook.checkpoint_meta`), so a resumed run writes the records and
  reports the figures of an uninterrupted one.
* `RunRecord`: results.json, built when the run ends.
* Provenance: code commit, source digest, package versions and devices
  (`collect`).

results.json's fields (docs/protocol.md §4.3 for the protocol behind them):

* `final` and `best`: step, validation and test accuracy and loss of the
  final parameters and of the best-validation ones; `reported` names the
  one behind the headline `test_accuracy` (final under the LRA protocol,
  best-validation under the Xiong et al. and CST protocols, P17).
* `test_examples`, `test_majority_label`, `test_majority_rate`: the test
  split's size and its most frequent label, counted during the test pass of
  the final parameters; `warnings` says when the reported accuracy is no
  better than always guessing that label (`learning_warnings`).
* Speed: `train_steps_per_sec` (steady state over every process that
  trained), `train_seconds` (the training loop, evaluations included),
  `wall_seconds`, the model FLOPs of a training step, TFLOP/s per device and
  the MFU where the device's peak is known (`throughput`).
* `objective` (self-pretraining runs: accuracy and loss are per predicted
  token) and `pretraining` (runs that start from another run's encoder,
  `config.init_from`: its objective, masking, steps, workdir and final
  validation loss and accuracy).
* Where the numbers come from: `data_notes`, `data_source`,
  `setting_fingerprint`, `launch`, `provenance` (code, versions, devices,
  and which devices trained which steps) and the whole `config`.

Why not CLU's `metric_writers` (the flax examples' choice): they keep no
JSON-lines copy; `Writer` keeps metrics.jsonl, dropping the records of the
steps after the checkpoint a run resumes from, so that it holds each step
once, as an uninterrupted run writes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from typing import Any, Mapping, Optional, Sequence

import jax
import ml_collections
import numpy as np

from lra_msmra import checkpoint as checkpoint_lib
from lra_msmra import console
from lra_msmra import errors
from lra_msmra import fingerprint as fingerprint_lib
from lra_msmra import hardware

RESULTS_FILE = checkpoint_lib.RESULTS_FILE
METRICS_FILE = 'metrics.jsonl'


# ---------------------------------------------------------------- provenance


PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy',
            'ml_collections')


def git_commit(path: Optional[str] = None) -> dict[str, Any]:
  """Commit of the checkout holding `path` (default: this package), and
  whether tracked files differ from it; {} outside a git checkout."""
  path = path or os.path.dirname(os.path.abspath(__file__))

  def git(*args):
    return subprocess.run(['git', '-C', path, *args], capture_output=True,
                          text=True, timeout=30, check=False)

  try:
    head = git('rev-parse', 'HEAD')
  except (OSError, subprocess.SubprocessError):
    return {}
  if head.returncode != 0:
    return {}
  status = git('status', '--porcelain', '--untracked-files=no')
  return {'commit': head.stdout.strip(),
          'dirty': bool(status.stdout.strip())}


def source_digest(path: Optional[str] = None) -> str:
  """SHA-256 (first 16 hex digits) of the package's Python sources under
  `path` (default: this package): each file's path relative to `path` and
  its bytes, in sorted order. Names the code of a run where there is no git
  checkout (a copied tree, an installed package); equal digests mean equal
  package code."""
  root = path or os.path.dirname(os.path.abspath(__file__))
  files = []
  for folder, dirs, names in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d != '__pycache__')
    files += [os.path.join(folder, n) for n in names if n.endswith('.py')]
  digest = hashlib.sha256()
  for name in sorted(files, key=lambda f: os.path.relpath(f, root)):
    digest.update(os.path.relpath(name, root).encode() + b'\0')
    with open(name, 'rb') as f:
      digest.update(f.read() + b'\0')
  return digest.hexdigest()[:16]


def versions() -> dict[str, str]:
  out = {'python': platform.python_version()}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = 'not installed'
  return out


def devices(mesh: Optional[jax.sharding.Mesh] = None) -> dict[str, Any]:
  devs = list(mesh.devices.flat) if mesh is not None else jax.devices()
  return {'platform': devs[0].platform,
          'device_kind': devs[0].device_kind,
          'num_devices': len(devs),
          'num_processes': jax.process_count()}


def extend_history(history: Sequence[Mapping[str, Any]],
                   device: Mapping[str, Any], start: int, step: int
                   ) -> list[dict[str, Any]]:
  """`history` (the checkpoint's list of {devices, from_step, to_step}) with
  this process's steps `start`..`step` on `device` appended."""
  return [dict(h) for h in history] + [
      dict(device, from_step=int(start), to_step=int(step))]


def collect(mesh: Optional[jax.sharding.Mesh] = None) -> dict[str, Any]:
  """Code, versions and devices of this process, for results.json.

  Runs recorded before 2026-11-29 also hold `cpu_unrolled_threefry`, an
  option since removed that drew the same dropout bits faster on the CPU,
  and `host_memory`, the host's huge page settings (transparent huge page
  mode, glibc's `glibc.malloc.hugetlb` tunable, `MALLOC_*` variables),
  which changed the speed of XLA:CPU, never the numbers, and are no longer
  recorded (docs/benchmarks.md, "Page faults", keeps the advice)."""
  return {'code': dict(git_commit(), source_digest=source_digest()),
          'versions': versions(),
          'devices': devices(mesh)}


# ----------------------------------------------------- metrics.jsonl


def keep_steps_up_to(path: str, step: int) -> int:
  """Rewrites a metrics.jsonl keeping only records of steps <= `step`.

  A run resumed from the checkpoint of `step` writes the later steps again;
  the killed run's records of those steps would otherwise appear twice. A
  line cut short by the kill is dropped too. The file is replaced
  atomically. Returns the number of records dropped.
  """
  if not os.path.exists(path):
    return 0
  kept, dropped = [], 0
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
        keep = record['step'] <= step
      except (ValueError, KeyError, TypeError):
        keep = False
      if keep:
        kept.append(line if line.endswith('\n') else line + '\n')
      else:
        dropped += bool(line.strip())
  if dropped:
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
      f.writelines(kept)
    os.replace(tmp, path)
  return dropped


class Writer:
  """TensorBoard scalars plus a JSON-lines copy (`metrics.jsonl`).

  `metrics.jsonl` holds one record per step: the scalars written for one
  step (training, validation) are merged and written when `flush` is called
  or the next step begins. Opening it for a run that resumes from
  `resume_step` drops the records of later steps (see `keep_steps_up_to`).
  TensorBoard event files are left as they are: a resumed run adds a new
  event file starting at its first step, and TensorBoard, on finding steps
  that go back, drops the older events from that step on (its handling of
  restarts).
  """

  def __init__(self, logdir: str, resume_step: int = 0):
    self._tb = None
    self._jsonl = None
    self._pending: Optional[dict[str, Any]] = None
    if console.is_chief():
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      os.makedirs(logdir, exist_ok=True)
      path = os.path.join(logdir, METRICS_FILE)
      keep_steps_up_to(path, resume_step)
      self._tb = SummaryWriter(logdir)
      self._jsonl = open(path, 'a')

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if self._tb is None:
      return
    for k, v in scalars.items():
      self._tb.add_scalar(k, float(v), step)
    if self._pending is not None and self._pending['step'] != step:
      self.flush()
    if self._pending is None:
      self._pending = {'step': step}
    self._pending.update({k: float(v) for k, v in scalars.items()})

  def flush(self) -> None:
    """Writes the pending step's record."""
    if self._tb is None or self._pending is None:
      return
    self._jsonl.write(json.dumps(self._pending) + '\n')
    self._jsonl.flush()
    self._tb.flush()
    self._pending = None

  def close(self) -> None:
    if self._tb is not None:
      self.flush()
      self._tb.close()
      self._jsonl.close()
      self._tb = None


class MetricsWindow:
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


# ------------------------------------------------ the run history


class RunHistory:
  """Training time, steady-state speed and devices of a run, over every
  process that trained it.

  Each checkpoint carries them (`checkpoint`), so a resumed run reports
  the figures of the whole run:

  * `train_seconds`: seconds in the training loop, evaluations included;
  * `steady`: (steps, seconds) of steady-state training (see
    `console.Progress`: the first step of a process, which waits for the
    compilation, and the evaluations are left out), summed;
  * `devices`: which devices trained which steps, one entry per process
    (`extend_history`), so a run resumed on other hardware says
    so.

  `steady` and `devices` are those of the last checkpoint, this process's
  steps included: what results.json reports.
  """

  def __init__(self, meta: Optional[Mapping[str, Any]],
               devices: Mapping[str, Any], start_step: int):
    """`meta`: the resumed checkpoint's (None for a new run); `devices`:
    this process's (`devices`); `start_step`: its first step."""
    meta = meta or {}
    self._earlier_seconds = float(meta.get('train_seconds', 0.0))
    self._earlier_steady = tuple(meta.get('steady', (0, 0.0)))
    self._earlier_devices = list(meta.get('devices', []))
    self._devices = devices
    self._start_step = start_step
    self._loop_start = time.time()
    self.steady = self._earlier_steady
    self.devices = self._earlier_devices
    self.train_seconds: Optional[float] = None

  def start(self) -> None:
    """Starts this process's clock: call when the training loop begins."""
    self._loop_start = time.time()

  def _seconds(self) -> float:
    return self._earlier_seconds + time.time() - self._loop_start

  def checkpoint(self, step: int, progress: console.Progress
                 ) -> dict[str, Any]:
    """The checkpoint of `step`'s `train_seconds`, `steady` and `devices`."""
    steps, seconds = progress.steady(step)
    self.steady = (self._earlier_steady[0] + steps,
                   self._earlier_steady[1] + seconds)
    self.devices = extend_history(
        self._earlier_devices, self._devices, self._start_step, step)
    return {'train_seconds': self._seconds(), 'steady': self.steady,
            'devices': self.devices}

  def stop(self) -> None:
    """Ends the training time (`train_seconds`): call after the loop."""
    self.train_seconds = self._seconds()

  def steps_per_sec(self, workdir: str) -> Optional[float]:
    """Steady-state steps/s of the run. None if no such step was timed; a
    re-run that trained no step and finds no sums in its checkpoint keeps
    the figure measured before (the workdir's results.json)."""
    steps, seconds = self.steady
    if steps:
      return steps / seconds
    return _previous_result(workdir, 'train_steps_per_sec')


# ------------------------------------------------------------- the logbook


def evals_from(step: int, config: ml_collections.ConfigDict) -> int:
  """Validation evaluations the loop runs at steps `step`..the last one."""
  total, every = config.num_train_steps, config.eval_every_steps
  if step > total:
    return 0
  return total // every - (step - 1) // every + (1 if total % every else 0)


class Logbook:
  """What the training loop writes down as it goes, in one object.

  The loop hands it each step's metrics (`add`) and each validation
  (`validation`); it asks it for the record of a log step (`record`), an
  early progress line (`early`) and the meta of a checkpoint
  (`checkpoint_meta`). A resumed run's Logbook starts from that meta: the
  best validation so far, the metrics of the record in progress, the timing
  and device history.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str,
               start: int, meta: Optional[Mapping[str, Any]],
               progress: console.Progress, devices_now: Mapping[str, Any],
               eval_batches: tuple[int, int]):
    """`start`, `meta`: the step the run resumes from and its checkpoint's
    meta (0 and None for a new run); `devices_now`: this process's
    (`devices`); `eval_batches`: batches of a validation and of a test
    pass (the ETA's evaluations)."""
    self.config = config
    self.progress = progress
    self.history = RunHistory(meta, devices_now, start)
    self.writer = Writer(os.path.join(workdir, 'tensorboard'),
                         resume_step=start)
    resumed = meta is not None
    self.best = (meta['best'] if resumed else
                 {'step': None, 'val_accuracy': -1.0, 'val_loss': None})
    # The training metrics since the last metrics.jsonl record, as saved.
    saved_window = meta.get('metrics_window') if resumed else None
    self.window = MetricsWindow(saved_window)
    # A checkpoint written before the window was saved with it: the steps
    # before it are missing from the first record.
    self.partial_window = bool(resumed and saved_window is None and
                               start % config.log_every_steps)
    self.last_saved = start if resumed else None
    self.ckpt_dir = os.path.join(workdir, 'checkpoints')
    # The last validation this process ran (None: it trained no step).
    self.last_val: Optional[dict[str, Any]] = None
    self._val_batches, self._test_batches = eval_batches
    # Seconds per evaluation batch, once measured: the ETA's evaluation part.
    self._eval_batch_seconds: Optional[float] = None

  def add(self, step: int, m: Mapping[str, jax.Array]) -> None:
    """The metrics of training step `step` + 1, still on device."""
    self.window.add(step, m)

  def check(self) -> None:
    """Fetches the steps' metrics; raises on a non-finite one."""
    self.window.check(self.last_saved, self.ckpt_dir)

  def record(self, step: int) -> None:
    """The training record of `step` (metrics.jsonl, TensorBoard) and its
    progress line."""
    steps_averaged = len(self.window.host)
    summary = self.window.take()
    rate = self.progress.update(step, summary, self.eval_seconds_left(step))
    if rate is not None:
      summary['steps_per_sec'] = rate
      summary.update(self.progress.throughput(rate))
    if self.partial_window:
      summary['partial_window_steps'] = steps_averaged
      self.partial_window = False
    self.writer.write(step, {f'train/{n}': v for n, v in summary.items()})

  def early(self, step: int) -> None:
    """An early progress line after `step`, when one is due."""
    if self.progress.early_due(step):
      self.check()
      self.progress.note(step, self.window.summary(),
                         self.eval_seconds_left(step))

  def validation(self, step: int, val: Mapping[str, Any]) -> bool:
    """Records the validation at `step`; returns whether it is the best so
    far (the caller checkpoints its parameters)."""
    self.last_val = dict(val)
    if val['seconds_per_batch'] is not None:
      self._eval_batch_seconds = val['seconds_per_batch']
    self.progress.exclude(val['seconds'])
    self.writer.write(step, {'val/accuracy': val['accuracy'],
                             'val/loss': val['loss']})
    console.log(f'step {step}: val accuracy {val["accuracy"]:.4f}'
                f', loss {val["loss"]:.4f}')
    if val['accuracy'] <= self.best['val_accuracy']:
      return False
    self.best = {'step': step, 'val_accuracy': val['accuracy'],
                 'val_loss': val['loss']}
    return True

  def eval_seconds_left(self, step: int) -> Optional[float]:
    """Evaluation seconds from `step` on (None until a speed is measured):
    the validations, then the two test evaluations (one if the best
    validation turns out to be the last)."""
    if self._eval_batch_seconds is None:
      return None
    batches = (evals_from(step, self.config) * self._val_batches +
               2 * self._test_batches)
    return batches * self._eval_batch_seconds

  def checkpoint_meta(self, step: int) -> dict[str, Any]:
    """The meta of `step`'s checkpoint: the best validation, the timing and
    device history, the metrics of the record in progress and the data
    position. The metrics of `step` reach the disk first."""
    config = self.config
    meta = {'step': step, 'best': self.best,
            **self.history.checkpoint(step, self.progress),
            'metrics_window': self.window.state(),
            'data_position': {'next_train_batch': step, 'seed': config.seed,
                              'examples_consumed': step * config.batch_size}}
    self.writer.flush()
    self.last_saved = step
    return meta

  def close(self) -> None:
    self.writer.close()


@dataclasses.dataclass
class FinalEvaluation:
  """The evaluations behind results.json's `final` and `best`.

  `final_val`, `final_test` and `best_test` are `train.evaluate` results;
  `best` is the best validation as checkpointed ({'step', 'val_accuracy',
  'val_loss'}); `label_counts` counts the test split's labels per class.
  """
  final_step: int
  final_val: Mapping[str, Any]
  final_test: Mapping[str, Any]
  best_step: int
  best: Mapping[str, Any]
  best_test: Mapping[str, Any]
  label_counts: np.ndarray


@dataclasses.dataclass
class RunRecord:
  """A finished run's results.json: `results` builds it, `write` writes it
  to the workdir and prints the headline."""
  config: ml_collections.ConfigDict
  workdir: str
  launch: Optional[Mapping[str, Any]]
  start_time: float  # When `train_and_evaluate` was called.
  data_notes: Mapping[str, Any]
  data_record: Mapping[str, Any]  # `fingerprint.data_source_record`.
  mesh: jax.sharding.Mesh
  num_params: int
  step_flops: Mapping[str, Any]  # `train.train_step_flops`.
  peak: Optional[hardware.Peak]
  log: Logbook

  def results(self, tests: FinalEvaluation) -> dict[str, Any]:
    """results.json's fields (see the module docstring)."""
    config = self.config
    reported = 'final' if config.protocol == 'lra' else 'best'
    majority_label, majority = majority_class(tests.label_counts)
    config_dict = json.loads(config.to_json())
    pretraining = (checkpoint_lib.pretraining_record(config.init_from)
                   if config.get('init_from') else None)
    run_setting = fingerprint_lib.setting(config_dict, self.data_record,
                                          pretraining)
    results = {
        'task': config.task, 'attention': config.model.attention,
        'protocol': config.protocol, 'num_params': self.num_params,
        'final': {'step': tests.final_step,
                  'val_accuracy': tests.final_val['accuracy'],
                  'val_loss': tests.final_val['loss'],
                  'test_accuracy': tests.final_test['accuracy'],
                  'test_loss': tests.final_test['loss']},
        'best': {'step': tests.best_step,
                 'val_accuracy': tests.best['val_accuracy'],
                 'val_loss': tests.best['val_loss'],
                 'test_accuracy': tests.best_test['accuracy'],
                 'test_loss': tests.best_test['loss']},
        'reported': reported,
        'test_accuracy': (tests.final_test if reported == 'final' else
                          tests.best_test)['accuracy'],
        'test_examples': tests.final_test['examples'],
        'test_majority_label': majority_label,
        'test_majority_rate': majority,
        # Steady-state training speed (`RunHistory.steps_per_sec`);
        # train_seconds below is the whole loop, evaluations included.
        'train_steps_per_sec': self.log.history.steps_per_sec(self.workdir),
        'num_devices': int(self.mesh.devices.size),
        # Model FLOPs of one training step (all devices).
        'train_flops_per_step': self.step_flops['flops'],
        'train_flops_notes': self.step_flops['notes'],
        'data_notes': dict(self.data_notes),
        'data_source': self.data_record,
        'setting_fingerprint': fingerprint_lib.fingerprint(run_setting),
        'launch': dict(self.launch or {}),
        'provenance': dict(collect(self.mesh),
                           device_history=self.log.history.devices),
        'train_seconds': self.log.history.train_seconds,
        'wall_seconds': time.time() - self.start_time,
        'config': config_dict,
    }
    if config.get('objective', 'classify') != 'classify':
      # Accuracy and loss are per predicted token; no label is read.
      results['objective'] = config.objective
    if pretraining:
      results['pretraining'] = pretraining
    results.update(throughput(results, self.log.progress, self.peak,
                              self.log.history.devices))
    # A pretraining run predicts tokens: the label frequencies say nothing
    # of it.
    results['warnings'] = ([] if 'objective' in results else
                           learning_warnings(results))
    return results

  def write(self, tests: FinalEvaluation) -> dict[str, Any]:
    """Writes results.json, prints the headline and any warning; returns
    the results."""
    results = self.results(tests)
    path = os.path.join(self.workdir, RESULTS_FILE)
    checkpoint_lib.write_json(path, results)
    reported = results['reported']
    what = ('Test accuracy' if 'objective' not in results else
            f'Test token accuracy ({results["objective"]} objective)')
    console.log(
        f'{what} ({reported} checkpoint, step '
        f'{results[reported]["step"]}): {results["test_accuracy"]:.4f} '
        f'(final {tests.final_test["accuracy"]:.4f}, best-validation '
        f'{tests.best_test["accuracy"]:.4f}; majority-class rate '
        f'{results["test_majority_rate"]:.4f}). Results: {path}')
    for warning in results['warnings']:
      console.log(f'WARNING: {warning}')
    return results


def majority_class(counts: np.ndarray) -> tuple[int, float]:
  """Most frequent label (the smallest of a tie) and its frequency, from
  the examples per label; (0, nan) without examples."""
  counts = np.asarray(counts)
  if not counts.sum():
    return 0, float('nan')
  return int(np.argmax(counts)), float(counts.max() / counts.sum())


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


def throughput(results: Mapping[str, Any], progress: console.Progress,
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


def _previous_result(workdir: str, key: str) -> Any:
  """`key` of the workdir's existing results.json, or None."""
  path = os.path.join(workdir, RESULTS_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f).get(key)
