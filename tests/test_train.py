"""The trainer: smoke run, sharding, checkpoints, resume, failure modes."""

import asyncio
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lra_msmra
from lra_msmra import checkpoint as checkpoint_lib
from lra_msmra import data as data_lib
from lra_msmra import console
from lra_msmra import flops
from lra_msmra import hardware
from lra_msmra import records
from lra_msmra import sharding
from lra_msmra import steps
from lra_msmra import train
from lra_msmra.data import pipeline
from tests import helpers

# One test worker runs this file, so its module-scoped fixture is built
# once (pytest-xdist's `--dist loadgroup`, set in pytest.ini).
pytestmark = pytest.mark.xdist_group('train')


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('run'))
  config = helpers.tiny_listops_config()
  results = train.train_and_evaluate(config, workdir)
  return config, workdir, results


def test_smoke_run_writes_everything(finished_run):
  config, workdir, results = finished_run
  for name in ('results.json', 'config.json', 'model_spec.json'):
    assert os.path.exists(os.path.join(workdir, name))
  on_disk = json.load(open(os.path.join(workdir, 'results.json')))
  assert on_disk['final']['step'] == 4
  for key in ('final', 'best'):
    for metric in ('val_accuracy', 'test_accuracy', 'step'):
      assert metric in on_disk[key]
  assert on_disk['reported'] == 'final'
  assert on_disk['test_accuracy'] == on_disk['final']['test_accuracy']
  assert on_disk['test_examples'] == 16
  assert 0 < on_disk['test_majority_rate'] <= 1
  tb = os.listdir(os.path.join(workdir, 'tensorboard'))
  assert any(f.startswith('events.out.tfevents') for f in tb)
  records = _metrics(workdir)
  # One record per step, training and validation scalars together.
  assert [r['step'] for r in records] == [2, 4]
  assert all('train/grad_norm' in r and 'val/accuracy' in r for r in records)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '4']
  assert results['num_params'] > 0
  # Steady-state steps/s (steps after the compiling one, evaluations out).
  assert on_disk['train_steps_per_sec'] > 0
  assert on_disk['train_seconds'] > 0
  # A run at or below the majority class says so, and only then.
  below = on_disk['test_accuracy'] <= on_disk['test_majority_rate']
  assert bool(on_disk['warnings']) == below
  # The workdir is free again.
  assert not os.path.exists(os.path.join(workdir, checkpoint_lib.LOCK_FILE))


def test_model_flops_of_the_training_step(finished_run):
  """results.json and metrics.jsonl give the step's matmul FLOPs and model
  TFLOP/s per device; no MFU on the CPU, whose peak is not known."""
  config, workdir, _ = finished_run
  on_disk = json.load(open(os.path.join(workdir, 'results.json')))
  spec = data_lib.get_model_spec(config)
  model, tx, schedule = steps.build(config, spec)
  mesh = sharding.create_mesh()
  step = functools.partial(steps.train_step, model=model, tx=tx,
                           schedule=schedule, grad_accum_steps=1)
  expected = flops.matmul_flops(step, steps.abstract_train_state(config, spec),
                                steps.abstract_batch(spec, 8, mesh))['flops']
  assert expected > 0
  assert on_disk['train_flops_per_step'] == expected
  assert on_disk['train_tflops_per_device'] == pytest.approx(
      expected * on_disk['train_steps_per_sec'] / 8 / 1e12)
  assert hardware.peak(jax.devices()[0].device_kind) is None
  assert 'train_mfu' not in on_disk
  timed = [r for r in _metrics(workdir) if 'train/steps_per_sec' in r]
  assert timed
  for r in timed:
    assert r['train/tflops_per_device'] == pytest.approx(
        expected * r['train/steps_per_sec'] / 8 / 1e12)
  assert not any('train/mfu' in r for r in _metrics(workdir))


def test_flops_are_counted_with_the_xla_implementation():
  config = helpers.tiny_listops_config()
  assert train.flops_config(config) == (config, None)
  with config.unlocked():
    config.model.attention_kw.implementation = 'pallas'
  counted, replaced = train.flops_config(config)
  assert replaced == 'pallas'
  assert counted.model.attention_kw.implementation == 'xla'
  # Left as it was.
  assert config.model.attention_kw.implementation == 'pallas'
  # Performer's own `kernel` knob (its feature map) is not an implementation.
  with config.unlocked():
    config.model.attention_kw = {'kernel': 'relu'}
  assert train.flops_config(config) == (config, None)


def test_mfu_in_results_needs_a_known_peak_and_one_kind_of_device():
  progress = console.Progress(10, 0, flops_per_step=4e12, num_devices=2,
                              peak_flops_per_s=4e12)
  peak = hardware.Peak(4e12, 1e12, 'a datasheet')
  h100 = {'device_kind': 'NVIDIA H100', 'num_devices': 2}
  out = records.throughput({'train_steps_per_sec': 1.0}, progress, peak,
                           [h100, h100])
  assert out == {'train_tflops_per_device': 2.0, 'train_mfu': 0.5,
                 'peak_flops_per_device': {'flops_per_s': 4e12,
                                           'source': 'a datasheet'}}
  out = records.throughput({'train_steps_per_sec': 1.0}, progress, peak,
                           [h100, {'device_kind': 'cpu', 'num_devices': 1}])
  assert out == {'train_tflops_per_device': 2.0}
  assert records.throughput({'train_steps_per_sec': None}, progress, peak,
                            [h100]) == {}


def test_the_test_split_is_evaluated_once_when_the_best_is_the_last(
    tmp_path, monkeypatch):
  labels = []
  evaluate = train.evaluate

  def recording(*args, label, **kwargs):
    labels.append(label)
    return evaluate(*args, label=label, **kwargs)

  monkeypatch.setattr(train, 'evaluate', recording)
  passes = []
  eval_batches = pipeline.eval_batches

  def counting(source, *args, **kwargs):
    passes.append(len(source))
    return eval_batches(source, *args, **kwargs)

  monkeypatch.setattr(pipeline, 'eval_batches', counting)
  # One validation, at the last step: the best-validation parameters are the
  # final ones.
  config = helpers.tiny_listops_config(num_train_steps=2, eval_every_steps=2)
  train.train_and_evaluate(config, str(tmp_path))
  assert labels == ['validation at step 2', 'test, final parameters']
  # One pass over each split: the test pass counts the labels too.
  assert len(passes) == 2
  on_disk = json.load(open(tmp_path / 'results.json'))
  assert on_disk['best']['step'] == on_disk['final']['step'] == 2
  for key in ('test_accuracy', 'test_loss'):
    assert on_disk['best'][key] == on_disk['final'][key]


def _majority_of(labels):
  """Most frequent label (smallest of a tie) and its frequency, from the
  labels themselves: the oracle of `records.majority_class`."""
  values, counts = np.unique(np.asarray(labels), return_counts=True)
  return int(values[np.argmax(counts)]), float(counts.max() / counts.sum())


def test_the_majority_class_comes_from_the_test_pass(finished_run):
  """results.json's majority class and rate, counted during the test pass
  of the final parameters, are those of the test split's labels."""
  config, workdir, _ = finished_run
  on_disk = json.load(open(os.path.join(workdir, 'results.json')))
  data = data_lib.get_datasets(config, workdir)
  labels = np.concatenate([b['targets'][b['weights'] > 0]
                           for b in pipeline.eval_batches(data.test, 8)])
  assert (on_disk['test_majority_label'],
          on_disk['test_majority_rate']) == _majority_of(labels)
  # Ties go to the smallest label.
  for labels in ([2, 2, 0, 0, 1], [3], [1, 0]):
    counts = np.bincount(np.asarray(labels), minlength=4)
    assert records.majority_class(counts) == _majority_of(labels)
  label, rate = records.majority_class(np.zeros(4, np.int64))
  assert label == 0 and np.isnan(rate)


def _metrics(workdir):
  with open(os.path.join(workdir, 'tensorboard', 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def test_learning_warnings():
  results = {'test_accuracy': 0.46, 'test_majority_rate': 0.54,
             'test_majority_label': 1, 'reported': 'final'}
  [warning] = records.learning_warnings(results)
  assert '0.4600' in warning and 'majority-class rate 0.5400' in warning
  results['test_accuracy'] = 0.54  # At the majority rate: still nothing.
  assert len(records.learning_warnings(results)) == 1
  results['test_accuracy'] = 0.60
  assert not records.learning_warnings(results)


def _evaluate(model, params, source, batch_size=8):
  mesh = sharding.create_mesh()
  fn = jax.jit(functools.partial(steps.eval_step, model=model))
  params = jax.device_put(params, sharding.replicated(mesh))
  return train.evaluate(fn, params, source, batch_size, -1, mesh)


def test_checkpoint_round_trip_through_load_checkpoint(finished_run):
  config, workdir, results = finished_run
  data = data_lib.get_datasets(config, workdir)
  loaded_config, model, params = lra_msmra.load_checkpoint(workdir, 'best')
  assert loaded_config.to_dict() == config.to_dict()
  val = _evaluate(model, params, data.eval)
  assert val['accuracy'] == pytest.approx(results['best']['val_accuracy'])
  test = _evaluate(model, params, data.test)
  assert test['accuracy'] == pytest.approx(results['best']['test_accuracy'])
  _, model, params = lra_msmra.load_checkpoint(workdir, 'latest')
  test = _evaluate(model, params, data.test)
  assert test['accuracy'] == pytest.approx(results['final']['test_accuracy'])
  with pytest.raises(FileNotFoundError, match='step 3'):
    lra_msmra.load_checkpoint(workdir, 3)


def _final_params(workdir):
  return lra_msmra.load_checkpoint(workdir, 'latest')[2]


def test_resume_continues_at_the_right_step(tmp_path, finished_run):
  _, full_dir, full_results = finished_run
  workdir = str(tmp_path)
  train.train_and_evaluate(helpers.tiny_listops_config(num_train_steps=2),
                           workdir)
  assert os.listdir(os.path.join(workdir, 'checkpoints')) == ['2']
  # As if a killed run had logged steps after its last checkpoint, the last
  # line cut short by the kill.
  with open(os.path.join(workdir, 'tensorboard', 'metrics.jsonl'), 'a') as f:
    f.write(json.dumps({'step': 3, 'train/loss': -1.0}) + '\n')
    f.write(json.dumps({'step': 4, 'train/loss': -1.0}) + '\n')
    f.write('{"step": 4, "val/acc')
  resumed = train.train_and_evaluate(helpers.tiny_listops_config(), workdir)
  assert resumed['final']['step'] == 4
  # The resumed run is the uninterrupted run, bit for bit.
  jax.tree.map(np.testing.assert_array_equal, _final_params(workdir),
               _final_params(full_dir))
  assert resumed['final'] == full_results['final']
  # Each step once, with the resumed run's values.
  records = _metrics(workdir)
  assert [r['step'] for r in records] == [2, 4]
  assert records[1]['train/loss'] == _metrics(full_dir)[1]['train/loss']
  # Which devices trained which steps: one entry per process, here the
  # same CPU twice (steps 0-2, then 2-4); the uninterrupted run has one.
  history = resumed['provenance']['device_history']
  assert [(h['from_step'], h['to_step']) for h in history] == [(0, 2), (2, 4)]
  assert {h['platform'] for h in history} == {'cpu'}
  assert [(h['from_step'], h['to_step']) for h in
          full_results['provenance']['device_history']] == [(0, 4)]


def test_speed_survives_a_stop_between_last_checkpoint_and_results(
    tmp_path, finished_run):
  # As a run killed during its final test pass: every checkpoint written,
  # no results.json. The re-run trains no step; its speed figure is the
  # measured one, carried by the checkpoint, not a missing figure.
  _, full_dir, full_results = finished_run
  workdir = str(tmp_path / 'run')
  shutil.copytree(full_dir, workdir)
  os.remove(os.path.join(workdir, 'results.json'))
  rerun = train.train_and_evaluate(helpers.tiny_listops_config(), workdir)
  assert rerun['final'] == full_results['final']
  assert rerun['train_steps_per_sec'] == pytest.approx(
      full_results['train_steps_per_sec'], rel=1e-6)
  assert rerun['train_steps_per_sec'] > 0


def test_ctrl_c_saves_and_the_same_call_resumes_bit_exactly(
    tmp_path, finished_run, monkeypatch, capfd):
  _, full_dir, full_results = finished_run
  workdir = str(tmp_path)
  get = pipeline.TrainBatches.get
  # What the trainer must restore (SIG_IGN, not Python's default handler,
  # when the tests run in a background shell).
  before = signal.getsignal(signal.SIGINT)

  def get_and_interrupt(self, k):
    if k == 2:  # During step 3: the run saves step 3 and stops.
      os.kill(os.getpid(), signal.SIGINT)
    return get(self, k)

  monkeypatch.setattr(pipeline.TrainBatches, 'get', get_and_interrupt)
  with pytest.raises(train.Preempted) as stopped:
    train.train_and_evaluate(helpers.tiny_listops_config(), workdir)
  assert (stopped.value.step, stopped.value.signum) == (3, signal.SIGINT)
  out = capfd.readouterr()
  assert 'Ctrl-C again stops at once' in out.err
  assert 'SIGINT (Ctrl-C): saved step 3' in out.out
  assert '3' in os.listdir(os.path.join(workdir, 'checkpoints'))
  assert not os.path.exists(os.path.join(workdir, 'results.json'))
  assert not os.path.exists(os.path.join(workdir, checkpoint_lib.LOCK_FILE))
  assert signal.getsignal(signal.SIGINT) == before
  monkeypatch.setattr(pipeline.TrainBatches, 'get', get)
  resumed = train.train_and_evaluate(helpers.tiny_listops_config(), workdir)
  assert 'Resumed from step 3' in capfd.readouterr().out
  jax.tree.map(np.testing.assert_array_equal, _final_params(workdir),
               _final_params(full_dir))
  assert resumed['final'] == full_results['final']
  # The record of step 4 averages steps 3 and 4, as in the uninterrupted
  # run: step 3's metrics came back with the checkpoint.
  timing = ('train/steps_per_sec', 'train/tflops_per_device')
  strip = lambda records: [{k: v for k, v in r.items() if k not in timing}
                           for r in records]
  assert strip(_metrics(workdir)) == strip(_metrics(full_dir))


def test_a_checkpoint_without_the_metrics_window_marks_the_record_partial(
    tmp_path, monkeypatch):
  """A checkpoint written before the window was saved with it: the first
  record after the resume averages fewer steps, and says how many."""
  workdir = str(tmp_path)
  get = pipeline.TrainBatches.get

  def get_and_interrupt(self, k):
    if k == 2:  # Saves step 3, in the middle of the window of steps 3-4.
      os.kill(os.getpid(), signal.SIGINT)
    return get(self, k)

  monkeypatch.setattr(pipeline.TrainBatches, 'get', get_and_interrupt)
  with pytest.raises(train.Preempted):
    train.train_and_evaluate(helpers.tiny_listops_config(), workdir)
  monkeypatch.setattr(pipeline.TrainBatches, 'get', get)
  path = os.path.join(workdir, 'checkpoints', '3', 'meta', 'metadata')
  meta = json.load(open(path))
  assert meta['metrics_window']['steps'] == [2]  # Step 3 (0-based 2).
  del meta['metrics_window']
  with open(path, 'w') as f:
    json.dump(meta, f)
  train.train_and_evaluate(helpers.tiny_listops_config(), workdir)
  records = {r['step']: r for r in _metrics(workdir)}
  assert records[4]['train/partial_window_steps'] == 1
  assert 'train/partial_window_steps' not in records[2]


def test_second_ctrl_c_stops_at_once():
  before = signal.getsignal(signal.SIGINT)
  with train.Preemption() as flag:
    os.kill(os.getpid(), signal.SIGINT)
    assert flag.requested(1) and flag.signum == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGINT) == before


def _write_lock(workdir, **fields):
  os.makedirs(workdir, exist_ok=True)
  record = {'pid': os.getppid(), 'host': socket.gethostname(),
            'started': '2025-01-01 00:00:00', 'command': 'python -m x',
            'process_start': checkpoint_lib._process_start(os.getppid()),  # pylint: disable=protected-access
            'pid_namespace': checkpoint_lib._pid_namespace(),  # pylint: disable=protected-access
            'token': 'other'}
  record.update(fields)
  path = os.path.join(workdir, checkpoint_lib.LOCK_FILE)
  with open(path, 'w') as f:
    json.dump(record, f)
  return path


def test_a_workdir_in_use_is_refused(tmp_path):
  # A live process on this machine (the one that started the tests).
  path = _write_lock(str(tmp_path))
  before = open(path).read()
  with pytest.raises(checkpoint_lib.WorkdirLocked,
                     match=f'process {os.getppid()} on host '
                     f'{socket.gethostname()}'):
    train.train_and_evaluate(helpers.tiny_listops_config(), str(tmp_path))
  assert open(path).read() == before  # Left alone, nothing else written.
  assert os.listdir(tmp_path) == [checkpoint_lib.LOCK_FILE]
  # Written on another machine: cannot be checked, so refused, naming the
  # file to delete.
  path = _write_lock(str(tmp_path), host='elsewhere', pid=12345)
  with pytest.raises(checkpoint_lib.WorkdirLocked,
                     match=f'process 12345 on host elsewhere.*delete {path}'):
    train.train_and_evaluate(helpers.tiny_listops_config(), str(tmp_path))


def test_a_stale_lock_is_replaced(tmp_path):
  finished = subprocess.Popen([sys.executable, '-c', 'pass'])
  finished.wait()
  for fields in ({'pid': finished.pid}, {'pid': os.getpid()},
                 {'process_start': 'not-when-it-started'}):
    path = _write_lock(str(tmp_path), **fields)
    lock = checkpoint_lib.WorkdirLock(str(tmp_path))
    note = lock.acquire()
    assert note.startswith('Replaced a stale lock'), note
    assert json.load(open(path))['pid'] == os.getpid()
    # A second run now finds a live lock.
    with pytest.raises(checkpoint_lib.WorkdirLocked, match='Another run'):
      checkpoint_lib.WorkdirLock(str(tmp_path)).acquire()
    lock.release()
    assert not os.path.exists(path)
  # An unreadable lock: young, it may be one being written; old, a leftover.
  path = os.path.join(str(tmp_path), checkpoint_lib.LOCK_FILE)
  open(path, 'w').close()
  with pytest.raises(checkpoint_lib.WorkdirLocked, match='unreadable'):
    checkpoint_lib.WorkdirLock(str(tmp_path)).acquire()
  os.utime(path, (0, 0))
  lock = checkpoint_lib.WorkdirLock(str(tmp_path))
  assert 'unreadable lock file' in lock.acquire()
  lock.release()


def test_resume_with_a_different_config_is_refused(finished_run):
  _, workdir, _ = finished_run
  with pytest.raises(ValueError, match='different config') as e:
    train.train_and_evaluate(helpers.tiny_listops_config(seed=1), workdir)
  # Names each differing key with both values.
  assert '(recorded → now: seed: 0 → 1)' in str(e.value)
  # Leaf keys of nested sections, not the whole section.
  config = helpers.tiny_listops_config()
  config.model.attention = 'cst'
  config.model.num_heads = 4
  with pytest.raises(ValueError, match='different config') as e:
    train._check_resume_config(workdir, config)  # pylint: disable=protected-access
  assert ('(recorded → now: model.attention: softmax → cst; '
          'model.num_heads: 2 → 4)') in str(e.value)
  # A moved data folder gets the way to resume (the check that runs before
  # any data is read).
  config = helpers.tiny_listops_config()
  config.data_dir = '/elsewhere/listops'
  with pytest.raises(ValueError, match='symbolic link') as e:
    train._check_resume_config(workdir, config)  # pylint: disable=protected-access
  assert 'data_dir: "" → /elsewhere/listops' in str(e.value)


def test_a_run_that_fails_on_its_data_leaves_no_workdir(tmp_path):
  empty, garbled = tmp_path / 'empty', tmp_path / 'garbled'
  empty.mkdir()
  garbled.mkdir()
  for split in ('train', 'val', 'test'):
    (garbled / f'basic_{split}.tsv').write_text('Source\tTarget\n( 1\tx\n')
  for data_dir, error in ((empty, FileNotFoundError), (garbled, ValueError)):
    config = helpers.tiny_listops_config(data_dir=str(data_dir))
    config.data.generate = False
    workdir = tmp_path / 'new'
    with pytest.raises(error):
      train.train_and_evaluate(config, str(workdir))
    assert not workdir.exists()
    # A workdir that was there before is left as it was.
    workdir.mkdir()
    with pytest.raises(error):
      train.train_and_evaluate(config, str(workdir))
    assert os.listdir(workdir) == []
    workdir.rmdir()


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  config = helpers.tiny_listops_config(checkpoint_every_steps=1,
                                       log_every_steps=1)
  config.schedule.update(factors='constant', base_learning_rate=1e30)
  with pytest.raises(FloatingPointError, match='Non-finite') as err:
    train.train_and_evaluate(config, str(tmp_path))
  saved = sorted(int(s) for s in os.listdir(tmp_path / 'checkpoints'))
  assert saved and str(saved[-1]) in str(err.value)
  params = lra_msmra.load_checkpoint(str(tmp_path), saved[-1])[2]
  assert all(bool(jnp.all(jnp.isfinite(p)))
             for p in jax.tree_util.tree_leaves(params))


def test_batch_size_must_divide_devices(tmp_path):
  config = helpers.tiny_listops_config(batch_size=12)
  with pytest.raises(ValueError, match='divisible by 8 devices'):
    train.train_and_evaluate(config, str(tmp_path))
  # Released on errors too.
  assert not os.path.exists(tmp_path / checkpoint_lib.LOCK_FILE)


def _one_step(config, mesh, batch):
  spec = data_lib.get_model_spec(config)
  model, tx, schedule = steps.build(config, spec)
  state = steps.create_train_state(jax.random.PRNGKey(0), model, tx,
                                   steps.example_batch(spec))
  rep = sharding.replicated(mesh)
  state = jax.device_put(state, rep)
  step = jax.jit(functools.partial(
      steps.train_step, model=model, tx=tx, schedule=schedule,
      grad_accum_steps=config.grad_accum_steps),
                 out_shardings=(rep, rep))
  new_state, metrics = step(state, sharding.to_global(batch, mesh))
  return jax.device_get(new_state.params), jax.device_get(metrics)


@pytest.fixture(scope='module')
def listops_batch(tmp_path_factory):
  config = helpers.tiny_listops_config()
  data = data_lib.get_datasets(config, str(tmp_path_factory.mktemp('d')))
  return pipeline.TrainBatches(data.train, 8, seed=0).get(0)


def test_eight_devices_match_one_device(listops_batch):
  config = helpers.tiny_listops_config()
  config.schedule.update(factors='constant', base_learning_rate=1e-3)
  assert jax.device_count() == 8
  p8, m8 = _one_step(config, sharding.create_mesh(), listops_batch)
  p1, m1 = _one_step(config, sharding.create_mesh(jax.devices()[:1]),
                     listops_batch)
  np.testing.assert_allclose(m8['loss_sum'], m1['loss_sum'], rtol=1e-5)
  np.testing.assert_allclose(m8['grad_norm'], m1['grad_norm'], rtol=1e-4)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4,
                                 atol=1e-6), p8, p1)


def test_gradient_accumulation_equals_full_batch(listops_batch):
  config = helpers.tiny_listops_config()
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.schedule.update(factors='constant', base_learning_rate=1e-3)
  mesh = sharding.create_mesh(jax.devices()[:2])
  p_full, m_full = _one_step(config, mesh, listops_batch)
  config.grad_accum_steps = 4
  p_acc, m_acc = _one_step(config, mesh, listops_batch)
  np.testing.assert_allclose(m_acc['loss_sum'], m_full['loss_sum'], rtol=1e-5)
  np.testing.assert_allclose(m_acc['grad_norm'], m_full['grad_norm'],
                             rtol=1e-4)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4,
                                 atol=1e-6), p_acc, p_full)


def test_late_reads_of_a_failed_restore_are_silenced(monkeypatch):
  """After a failed restore, only the storage layer's reports of reads that
  end on orbax's closed event loop are dropped; other reports go through."""
  reported = []
  monkeypatch.setattr('sys.unraisablehook', reported.append)
  checkpoint_lib._drop_late_callback_errors()  # pylint: disable=protected-access
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    closed = e
  late = types.SimpleNamespace(
      exc_type=RuntimeError, exc_value=closed,
      exc_traceback=closed.__traceback__.tb_next)  # From call_soon_threadsafe.
  other = types.SimpleNamespace(exc_type=ValueError, exc_value=ValueError(),
                                exc_traceback=None)
  sys.unraisablehook(late)
  sys.unraisablehook(other)
  assert reported == [other]
