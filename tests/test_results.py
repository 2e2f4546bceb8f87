"""Results table, published numbers and the suite launcher (no training)."""

import json
import os
import subprocess
import sys

import pytest

from lra_msmra import published
from lra_msmra import results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(folder, task, attention, protocol, acc, seed, kw=None,
               steps_per_sec=10.0):
  """A results.json shaped like lra_msmra.train's."""
  os.makedirs(folder, exist_ok=True)
  reported = 'final' if protocol == 'lra' else 'best'
  data = {
      'task': task, 'attention': attention, 'protocol': protocol,
      'num_params': 1234,
      'final': {'step': 10, 'val_accuracy': acc, 'test_accuracy': acc},
      'best': {'step': 10, 'val_accuracy': acc, 'test_accuracy': acc},
      'reported': reported, 'test_accuracy': acc,
      'train_steps_per_sec': steps_per_sec,
      'config': {'seed': seed, 'model': {'attention': attention,
                                         'attention_kw': kw or {}}},
  }
  with open(os.path.join(folder, 'results.json'), 'w') as f:
    json.dump(data, f)


@pytest.fixture
def runs_dir(tmp_path):
  root = tmp_path / 'runs'
  _write_run(root / 'lra/listops/transformer/seed0', 'listops', 'softmax',
             'lra', 0.36, 0, steps_per_sec=10.0)
  _write_run(root / 'lra/listops/transformer/seed1', 'listops', 'softmax',
             'lra', 0.38, 1, steps_per_sec=10.0)
  _write_run(root / 'lra/text/transformer/seed0', 'text', 'softmax', 'lra',
             0.64, 0, steps_per_sec=5.0)
  _write_run(root / 'lra/listops/combiner_fixed/seed0', 'listops', 'combiner',
             'lra', 0.37, 0, {'variant': 'fixed'}, steps_per_sec=20.0)
  _write_run(root / 'lra/listops/combiner_axial/seed0', 'listops', 'combiner',
             'lra', 0.35, 0, {'variant': 'axial'}, steps_per_sec=15.0)
  for task, acc in zip(published.AVERAGE_TASKS,
                       (0.40, 0.68, 0.84, 0.46, 0.75)):
    _write_run(root / f'xiong/{task}/adamra/seed0', task, 'adamra', 'xiong',
               acc, 0, {'compression_rates': [0.5, 0.125, 0.03125]})
  return root


def _bench(tmp_path):
  records = [
      {'status': 'ok', 'attention': a, 'length': n, 'steps_per_s': s,
       'net_peak_bytes': m}
      for a, s, m in (('softmax', 1.0, 4e9), ('combiner', 4.0, 5e8),
                      ('adamra', 6.0, 3e8))
      for n in (1024, 4096)]
  path = tmp_path / 'train_step.json'
  path.write_text(json.dumps({'settings': {'task': 'text', 'batch': 4},
                              'records': records}))
  return path


def test_results_command(runs_dir, tmp_path):
  out = tmp_path / 'summary'
  results.main(['results', '--runs', str(runs_dir), '--out', str(out),
                '--benchmark', str(_bench(tmp_path))])
  text = (out / 'results.md').read_text()
  # Our rows, labelled by the knob that tells the Combiner configs apart.
  assert '**softmax** (ours)' in text
  assert '**combiner[variant=fixed]** (ours)' in text
  assert '**combiner[variant=axial]** (ours)' in text
  assert '**adamra** (ours)' in text
  # Seeds averaged: ListOps softmax 36 and 38 -> 37.00 ± 1.41 (n=2).
  assert '37.00 ± 1.41 (n=2)' in text
  # Protocol sections, each with its published rows and sources.
  assert '## Protocol: LRA official (`lra`)' in text
  assert '## Protocol: Xiong et al. (`xiong`)' in text
  assert '54.39' in text and 'LRA leaderboard' in text  # LRA Transformer.
  assert 'Combiner-Fixed' in text and '58.34' in text
  assert 'Nyströmformer paper Table 3' in text and '58.77' in text
  assert 'AdaMRA paper' in text and '63.09' in text
  assert 'CST paper' not in text  # no run under that protocol.
  # Full five-task average for AdaMRA, partial ones marked.
  assert '| 62.60 |' in text
  assert '(2/5 tasks)' in text
  data = json.loads((out / 'results_table.json').read_text())
  assert len(data['runs']) == 10
  bubbles = {b['label']: b for b in data['bubbles']}
  assert bubbles['adamra']['relative_speed'] == pytest.approx(6.0)
  assert bubbles['adamra']['memory_bytes'] == pytest.approx(3e8)
  png = (out / 'results_bubble.png').read_bytes()
  assert png[:4] == b'\x89PNG'
  # An output folder inside the runs' folder is not read back as a run.
  again = runs_dir / 'summary'
  results.main(['results', '--runs', str(runs_dir), '--out', str(again)])
  results.main(['results', '--runs', str(runs_dir), '--out', str(again)])
  assert len(json.loads((again / 'results_table.json').read_text())[
      'runs']) == 10


def test_bubble_speed_from_runs_without_benchmark(runs_dir, tmp_path):
  rows = results.aggregate(_labelled(runs_dir))
  points = results.bubble_chart(rows, str(tmp_path / 'b.png'))
  speed = {p['label']: p['relative_speed'] for p in points}
  # combiner fixed ran ListOps only, at 20 vs softmax's 10 steps/s there.
  assert speed['combiner[variant=fixed]'] == pytest.approx(2.0)
  assert speed['softmax'] == pytest.approx(1.0)
  assert 'adamra' not in speed  # no softmax run under its protocol.


def _labelled(runs_dir):
  runs = [results.load_run(p) for p in results.find_results([str(runs_dir)])]
  results.label_runs(runs)
  return runs


def test_bad_results_file(tmp_path):
  bad = tmp_path / 'results.json'
  bad.write_text('{"task": "listops"}')
  with pytest.raises(ValueError, match='lacks'):
    results.load_run(str(bad))


def test_published_averages_match_scores():
  for row in published.ALL_ROWS:
    assert row.protocol in published.PROTOCOL_TITLES
    assert set(row.scores) <= set(published.TASKS)
    mean = sum(row.scores.values()) / len(row.scores)
    if 'differs' not in row.note:
      assert mean == pytest.approx(row.avg, abs=0.006), row.model


def test_suite_dry_run(tmp_path):
  cmd = [sys.executable, 'launch/suite.py', '--protocol', 'xiong',
         '--mechanisms', 'softmax,combiner', '--tasks', 'listops',
         '--seeds', '0,1', '--options', 'runlocal', '--root', str(tmp_path),
         '--dry_run']
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  runs = [l for l in lines if 'lra_msmra.main' in l]
  assert len(runs) == 4
  assert any('configs/listops/transformer.py:xiong,runlocal' in l
             and 'seed1' in l and '--config.seed=1' in l for l in runs)
  assert any('configs/listops/combiner_fixed.py:xiong,runlocal' in l
             for l in runs)
  assert 'lra_msmra.results' in lines[-1]
  missing = subprocess.run(cmd[:5] + ['nope'] + cmd[6:], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
  assert missing.returncode != 0 and 'Missing config' in missing.stderr
