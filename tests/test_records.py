"""What a run records: where a result comes from (also without a git
checkout), and metrics.jsonl across resumes."""

import json
import os
import shutil
import subprocess
import sys

from lra_msmra import records
from tests import helpers

PACKAGE = os.path.dirname(os.path.abspath(records.__file__))


def test_source_digest_names_the_code_without_git(tmp_path):
  copy = tmp_path / 'lra_msmra'
  shutil.copytree(PACKAGE, copy,
                  ignore=shutil.ignore_patterns('__pycache__'))
  # A copied tree (no git) has the package's digest, and no commit.
  assert records.source_digest(str(copy)) == records.source_digest()
  assert records.git_commit(str(copy)) == {}
  # Caches and other files do not count; any change to a source does.
  (copy / '__pycache__').mkdir(exist_ok=True)
  (copy / '__pycache__' / 'x.pyc').write_bytes(b'\0')
  (copy / 'notes.txt').write_text('not code')
  assert records.source_digest(str(copy)) == records.source_digest()
  models = copy / 'models.py'
  models.write_text(models.read_text() + '\n')
  assert records.source_digest(str(copy)) != records.source_digest()
  # A renamed file changes it too.
  models.rename(copy / 'models2.py')
  assert records.source_digest(str(copy)) != records.source_digest()


def test_history_entries_name_each_process_steps():
  cpu = {'platform': 'cpu', 'device_kind': 'cpu', 'num_devices': 1}
  gpu = {'platform': 'gpu', 'device_kind': 'H100', 'num_devices': 1}
  first = records.extend_history([], cpu, 0, 250)
  assert first == [dict(cpu, from_step=0, to_step=250)]
  both = records.extend_history(first, gpu, 250, 500)
  assert both == [dict(cpu, from_step=0, to_step=250),
                  dict(gpu, from_step=250, to_step=500)]
  assert first == [dict(cpu, from_step=0, to_step=250)]  # Not modified.


def test_results_record_the_provenance_and_the_removed_cpu_option_is_refused(
    tmp_path):
  """results.json records code, versions and devices, and no longer
  `cpu_unrolled_threefry` nor the host's huge page settings; the
  removed `--cpu_unrolled_threefry` (it patched JAX internals) is refused
  in one line, not ignored."""
  env = dict(os.environ, XLA_FLAGS=helpers.xla_flags(1),
             TF_CPP_MIN_LOG_LEVEL='3')
  command = [sys.executable, '-m', 'lra_msmra.main', '--config',
             'tests/configs/tiny_listops.py:1', '--workdir', str(tmp_path),
             '--config.eval_every_steps=1', '--config.num_eval_steps=1']
  refused = subprocess.run(command + ['--cpu_unrolled_threefry'],
                           cwd=helpers.ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
  assert refused.returncode != 0
  assert refused.stderr.strip().splitlines() == [
      "error: Unknown command line flag 'cpu_unrolled_threefry' "
      '(--helpshort lists the flags).']
  subprocess.run(command, cwd=helpers.ROOT, env=env, capture_output=True,
                 text=True, check=True, timeout=300)
  with open(tmp_path / 'results.json') as f:
    recorded = json.load(f)['provenance']
  assert set(recorded) == {'code', 'versions', 'devices', 'device_history'}


def test_resumed_writer_keeps_each_step_once(tmp_path):
  logdir = tmp_path / 'tensorboard'
  writer = records.Writer(str(logdir))
  for step in (1, 2, 3, 4):
    writer.write(step, {'train/loss': float(step)})
    writer.write(step, {'val/accuracy': 0.5})
  writer.close()
  path = logdir / records.METRICS_FILE
  with open(path, 'a') as f:
    f.write('{"step": 5, "train/lo')  # Cut short by a kill.
  # The checkpoint the run resumes from is step 2.
  writer = records.Writer(str(logdir), resume_step=2)
  for step in (3, 4):
    writer.write(step, {'train/loss': 10.0 + step})
  writer.close()
  lines = [json.loads(line) for line in open(path)]
  assert [r['step'] for r in lines] == [1, 2, 3, 4]
  assert lines[1] == {'step': 2, 'train/loss': 2.0, 'val/accuracy': 0.5}
  assert lines[3] == {'step': 4, 'train/loss': 14.0}
