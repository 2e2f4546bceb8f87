"""Whole runs in separate processes: several hosts, preemption, crashes.

Each test drives `python -m lra_msmra.main` exactly as a user (or a cluster
scheduler) would, on the tiny ListOps config, and compares the final
parameters with those of an uninterrupted single-process run.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import lra_msmra
from tests import helpers

# One test worker runs this file, so its module-scoped fixture is built
# once (pytest-xdist's `--dist loadgroup`, set in pytest.ini).
# Whole runs in processes: under the `slow` marker (pytest.ini).
pytestmark = [pytest.mark.xdist_group('processes'), pytest.mark.slow]

CONFIG = 'tests/configs/tiny_listops.py'


def _env(devices):
  env = dict(os.environ)
  env['XLA_FLAGS'] = helpers.xla_flags(devices)
  env['TF_CPP_MIN_LOG_LEVEL'] = '3'
  env['PYTHONUNBUFFERED'] = '1'
  return env


def _cmd(workdir, steps, *extra):
  return [sys.executable, '-m', 'lra_msmra.main', '--config',
          f'{CONFIG}:{steps}', '--workdir', str(workdir),
          '--config.checkpoint_every_steps=1', *extra]


def run(workdir, steps, devices=1, *extra, timeout=300):
  proc = subprocess.run(_cmd(workdir, steps, *extra), cwd=helpers.ROOT,
                        env=_env(devices), capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  return proc


def final_params(workdir):
  return lra_msmra.load_checkpoint(str(workdir), 'latest')[2]


def results(workdir):
  with open(os.path.join(workdir, 'results.json')) as f:
    return json.load(f)


def assert_same_run(a, b, rtol=0.0):
  if rtol:
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol,
                                                         atol=1e-6),
                 final_params(a), final_params(b))
  else:
    jax.tree.map(np.testing.assert_array_equal, final_params(a),
                 final_params(b))
  ra, rb = results(a), results(b)
  for key in ('final', 'best'):
    assert ra[key]['step'] == rb[key]['step']
    np.testing.assert_allclose(ra[key]['test_accuracy'],
                               rb[key]['test_accuracy'])
  # Counted during the test pass, each process its part of each batch.
  for key in ('test_examples', 'test_majority_label', 'test_majority_rate'):
    assert ra[key] == rb[key]


STEPS = 12


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """An uninterrupted single-process run on 4 devices."""
  workdir = tmp_path_factory.mktemp('reference')
  proc = run(workdir, STEPS, 4)
  # Quiet by default: no library INFO logs (absl format `I<mmdd> ...`).
  assert not re.search(r'^I\d{4} ', proc.stderr, re.M), proc.stderr[:2000]
  assert 'Compiling the training step' in proc.stdout
  return workdir


def _wait_for_checkpoint(workdir, proc, min_step, timeout=240):
  ckpt = os.path.join(workdir, 'checkpoints')
  start = time.time()
  while time.time() - start < timeout:
    if proc.poll() is not None:
      raise AssertionError('run ended before it could be interrupted')
    if os.path.isdir(ckpt):
      steps = [int(s) for s in os.listdir(ckpt) if s.isdigit()]
      if steps and max(steps) >= min_step:
        return
    time.sleep(0.05)
  raise AssertionError('no checkpoint appeared')


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGKILL],
                         ids=['sigterm', 'sigkill'])
def test_killed_run_resumes_to_the_same_result(sig, tmp_path, reference):
  proc = subprocess.Popen(_cmd(tmp_path, STEPS), cwd=helpers.ROOT,
                          env=_env(4), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  _wait_for_checkpoint(tmp_path, proc, 3)
  proc.send_signal(sig)
  out, _ = proc.communicate(timeout=120)
  if sig == signal.SIGTERM:
    assert proc.returncode == 143, out[-3000:]
    assert 'SIGTERM: saved step' in out
  else:
    assert proc.returncode == -signal.SIGKILL
    # The killed run's lock is stale and must not block the resume.
    assert os.path.exists(tmp_path / 'lock')
  assert not os.path.exists(tmp_path / 'results.json')
  second = run(tmp_path, STEPS, 4)
  assert 'Resumed from step' in second.stdout
  assert ('Replaced a stale lock' in second.stdout) == (sig == signal.SIGKILL)
  assert not os.path.exists(tmp_path / 'lock')
  assert_same_run(tmp_path, reference)
  # Each step once in the metrics, whatever the killed run logged.
  with open(tmp_path / 'tensorboard' / 'metrics.jsonl') as f:
    steps = [json.loads(line)['step'] for line in f]
  assert steps == sorted(set(steps))


def test_corrupted_latest_checkpoint_falls_back(tmp_path, reference):
  run(tmp_path, STEPS // 2, 4)
  ckpt = tmp_path / 'checkpoints'
  latest = max(int(s) for s in os.listdir(ckpt))
  # Damage every array file of the newest checkpoint.
  for root, _, files in os.walk(ckpt / str(latest) / 'state'):
    for f in files:
      path = os.path.join(root, f)
      with open(path, 'r+b') as fh:
        fh.truncate(max(os.path.getsize(path) // 2, 1))
  second = run(tmp_path, STEPS, 4)
  assert 'Checkpoint' in second.stdout and 'falling back' in second.stdout
  # One line about it, no storage-layer tracebacks.
  assert 'Traceback' not in second.stderr, second.stderr[:3000]
  assert 'Resumed from step' in second.stdout
  assert_same_run(tmp_path, reference)


def _free_port():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _start_two_processes(workdir, logdir):
  """Starts a 2-process run (2 devices each); returns (procs, log files)."""
  port = _free_port()
  # Logs go to files: a full pipe would stall one process and, through the
  # collectives, both.
  logs = [open(logdir / f'log{i}', 'w+') for i in range(2)]
  procs = [subprocess.Popen(
      _cmd(workdir, STEPS, f'--coordinator_address=localhost:{port}',
           '--num_processes=2', f'--process_id={i}'),
      cwd=helpers.ROOT, env=_env(2), stdout=logs[i],
      stderr=subprocess.STDOUT, text=True) for i in range(2)]
  return procs, logs


def _finish(procs, logs):
  """Waits for both processes; returns their outputs."""
  try:
    for p in procs:
      p.wait(timeout=300)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  outs = []
  for log in logs:
    log.seek(0)
    outs.append(log.read())
    log.close()
  return outs


def test_two_processes_train_like_one(tmp_path, reference):
  workdir = tmp_path / 'run'
  procs, logs = _start_two_processes(workdir, tmp_path)
  outs = _finish(procs, logs)
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  assert '4 device(s)' in outs[0]
  assert 'Test accuracy' in outs[0] and 'Test accuracy' not in outs[1]
  assert_same_run(workdir, reference, rtol=1e-5)


def test_two_processes_stop_together_on_sigterm_at_different_steps(
    tmp_path, reference):
  """Hosts get the preemption signal at different steps, yet stop together.

  A host that stopped alone would leave the other waiting in the next
  collective; JAX's preemption service makes both save the same step.
  """
  workdir = tmp_path / 'run'
  procs, logs = _start_two_processes(workdir, tmp_path)
  try:
    _wait_for_checkpoint(workdir, procs[0], 3)
    procs[0].send_signal(signal.SIGTERM)
    time.sleep(0.3)
    procs[1].send_signal(signal.SIGTERM)
  finally:
    outs = _finish(procs, logs)
  for p, out in zip(procs, outs):
    assert p.returncode == 143, out[-3000:]
  assert 'SIGTERM: saved step' in outs[0]
  assert not os.path.exists(workdir / 'results.json')
  procs, logs = _start_two_processes(workdir, tmp_path)
  outs = _finish(procs, logs)
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  assert 'Resumed from step' in outs[0]
  assert_same_run(workdir, reference, rtol=1e-5)
