"""What a run records about itself: the checkpoints' timing and device
history (`RunHistory`) and results.json (`RunRecord`), built in one place.

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
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Mapping, Optional

import jax
import ml_collections
import numpy as np

from lra_msmra import checkpoint as checkpoint_lib
from lra_msmra import fingerprint as fingerprint_lib
from lra_msmra import hardware
from lra_msmra import metrics as metrics_lib
from lra_msmra import provenance as provenance_lib

RESULTS_FILE = checkpoint_lib.RESULTS_FILE


class RunHistory:
  """Training time, steady-state speed and devices of a run, over every
  process that trained it.

  Each checkpoint carries them (`checkpoint`), so a resumed run reports
  the figures of the whole run:

  * `train_seconds`: seconds in the training loop, evaluations included;
  * `steady`: (steps, seconds) of steady-state training (see
    `metrics.Progress`: the first step of a process, which waits for the
    compilation, and the evaluations are left out), summed;
  * `devices`: which devices trained which steps, one entry per process
    (`provenance.extend_history`), so a run resumed on other hardware says
    so.

  `steady` and `devices` are those of the last checkpoint, this process's
  steps included: what results.json reports.
  """

  def __init__(self, meta: Optional[Mapping[str, Any]],
               devices: Mapping[str, Any], start_step: int):
    """`meta`: the resumed checkpoint's (None for a new run); `devices`:
    this process's (`provenance.devices`); `start_step`: its first step."""
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

  def checkpoint(self, step: int, progress: metrics_lib.Progress
                 ) -> dict[str, Any]:
    """The checkpoint of `step`'s `train_seconds`, `steady` and `devices`."""
    steps, seconds = progress.steady(step)
    self.steady = (self._earlier_steady[0] + steps,
                   self._earlier_steady[1] + seconds)
    self.devices = provenance_lib.extend_history(
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
  progress: metrics_lib.Progress
  history: RunHistory

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
        'train_steps_per_sec': self.history.steps_per_sec(self.workdir),
        'num_devices': int(self.mesh.devices.size),
        # Model FLOPs of one training step (all devices).
        'train_flops_per_step': self.step_flops['flops'],
        'train_flops_notes': self.step_flops['notes'],
        'data_notes': dict(self.data_notes),
        'data_source': self.data_record,
        'setting_fingerprint': fingerprint_lib.fingerprint(run_setting),
        'launch': dict(self.launch or {}),
        'provenance': dict(provenance_lib.collect(self.mesh),
                           device_history=self.history.devices),
        'train_seconds': self.history.train_seconds,
        'wall_seconds': time.time() - self.start_time,
        'config': config_dict,
    }
    if config.get('objective', 'classify') != 'classify':
      # Accuracy and loss are per predicted token; no label is read.
      results['objective'] = config.objective
    if pretraining:
      results['pretraining'] = pretraining
    results.update(throughput(results, self.progress, self.peak,
                              self.history.devices))
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
    metrics_lib.log(
        f'{what} ({reported} checkpoint, step '
        f'{results[reported]["step"]}): {results["test_accuracy"]:.4f} '
        f'(final {tests.final_test["accuracy"]:.4f}, best-validation '
        f'{tests.best_test["accuracy"]:.4f}; majority-class rate '
        f'{results["test_majority_rate"]:.4f}). Results: {path}')
    for warning in results['warnings']:
      metrics_lib.log(f'WARNING: {warning}')
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


def throughput(results: Mapping[str, Any], progress: metrics_lib.Progress,
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
