"""Results table, published numbers and the suite launcher (no training)."""

import json
import math
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from lra_msmra import attention
from lra_msmra import config_lib
from lra_msmra_tools import published
from lra_msmra_tools import reporting
from lra_msmra_tools import results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(folder, task, config_name, protocol, acc, seed,
               steps_per_sec=10.0, overrides=None, source='release',
               extra_option=None, generator=None):
  """A results.json shaped like lra_msmra.train's, with the real config of
  configs/<task>/<config_name>.py under `protocol` (plus `extra_option`,
  e.g. 'runlocal') plus dotted overrides."""
  os.makedirs(folder, exist_ok=True)
  option = ','.join(o for o in (None if protocol == 'lra' else protocol,
                                extra_option) if o) or None
  module = config_lib.load_sibling(
      os.path.join(ROOT, 'configs', task, config_name + '.py'), config_name)
  config = module.get_config(option)
  config.seed = seed
  for key, value in (overrides or {}).items():
    *path, last = key.split('.')
    node = config
    for part in path:
      node = node[part]
    node[last] = value
  reported = 'final' if protocol == 'lra' else 'best'
  data_source = {'kind': source}
  if source == 'generated':
    data_source['generator'] = generator or {'seed': 0}
  data = {
      'task': task, 'attention': config.model.attention, 'protocol': protocol,
      'num_params': 1234,
      'final': {'step': 10, 'val_accuracy': acc, 'test_accuracy': acc},
      'best': {'step': 10, 'val_accuracy': acc, 'test_accuracy': acc},
      'reported': reported, 'test_accuracy': acc,
      'train_steps_per_sec': steps_per_sec, 'train_seconds': 3725.0,
      'data_source': data_source,
      'config': json.loads(config.to_json()),
  }
  with open(os.path.join(folder, 'results.json'), 'w') as f:
    json.dump(data, f)


@pytest.fixture
def runs_dir(tmp_path):
  root = tmp_path / 'runs'
  _write_run(root / 'lra/listops/transformer/seed0', 'listops', 'transformer',
             'lra', 0.36, 0, steps_per_sec=10.0)
  _write_run(root / 'lra/listops/transformer/seed1', 'listops', 'transformer',
             'lra', 0.38, 1, steps_per_sec=10.0)
  _write_run(root / 'lra/text/transformer/seed0', 'text', 'transformer',
             'lra', 0.64, 0, steps_per_sec=5.0)
  _write_run(root / 'lra/listops/combiner_fixed/seed0', 'listops',
             'combiner_fixed', 'lra', 0.37, 0, steps_per_sec=20.0)
  _write_run(root / 'lra/listops/combiner_axial/seed0', 'listops',
             'combiner_axial', 'lra', 0.35, 0, steps_per_sec=15.0)
  for task, acc in zip(published.AVERAGE_TASKS,
                       (0.40, 0.68, 0.84, 0.46, 0.75)):
    _write_run(root / f'xiong/{task}/adamra/seed0', task, 'adamra', 'xiong',
               acc, 0)
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
  # Our rows, labelled by the config file each run's setting equals.
  assert '**transformer** (ours)' in text
  assert '**combiner_fixed** (ours)' in text
  assert '**combiner_axial** (ours)' in text
  assert '**adamra** (ours)' in text
  assert 'changed settings' not in text and 'Mock' not in text
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
  cpu = {'platform': 'cpu', 'device_kind': 'cpu', 'num_devices': 1}
  for path in _results_files(runs_dir):
    _set_devices(path, [dict(cpu, from_step=0, to_step=10)])
  rows = results.aggregate(_labelled(runs_dir))
  points = results.bubble_chart(rows, str(tmp_path / 'b.png'))
  speed = {p['label']: p['relative_speed'] for p in points}
  # combiner fixed ran ListOps only, at 20 vs softmax's 10 steps/s there.
  assert speed['combiner_fixed'] == pytest.approx(2.0)
  assert speed['transformer'] == pytest.approx(1.0)
  assert 'adamra' not in speed  # no softmax run under its protocol.


def test_a_bubble_label_stands_above_its_bubble(tmp_path, monkeypatch):
  row = {'mechanism': 'transformer', 'protocol': 'lra', 'attention': 'softmax',
         'average': 33.8, 'average_tasks': 1}
  bench = {'records': [{'status': 'ok', 'attention': 'softmax',
                        'length': 1024, 'steps_per_s': 2.0,
                        'net_peak_bytes': 3e8}],
           'settings': {'task': 'listops', 'batch': 4}}
  figures = []
  plt = reporting.pyplot()
  monkeypatch.setattr(plt, 'close', figures.append)
  [point] = results.bubble_chart([row], str(tmp_path / 'b.png'), bench)
  [fig] = figures
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  [ax] = fig.axes
  [bubble] = ax.collections
  [label] = ax.texts
  assert label.get_text().startswith('transformer [lra] (1/5 tasks)')
  # The bubble's top: its centre plus its radius (sizes are areas in pt²).
  _, centre_y = ax.transData.transform(bubble.get_offsets()[0])
  radius = math.sqrt(bubble.get_sizes()[0] / math.pi) * fig.dpi / 72
  label_box = label.get_window_extent(renderer)
  assert label_box.y0 >= centre_y + radius  # Not through the bubble.
  assert label_box.y1 <= ax.get_window_extent(renderer).y1  # Inside.
  assert point['relative_speed'] == 1.0
  plt.close(fig)


def _set_devices(path, history=None, last=None):
  with open(path) as f:
    data = json.load(f)
  data['provenance'] = {'devices': last or history[-1]}
  if history is not None:
    data['provenance']['device_history'] = history
  with open(path, 'w') as f:
    json.dump(data, f)


def test_speeds_and_devices_of_runs_on_different_hardware(runs_dir, tmp_path):
  cpu = {'platform': 'cpu', 'device_kind': 'cpu', 'num_devices': 1}
  gpu = {'platform': 'gpu', 'device_kind': 'H100', 'num_devices': 1}
  seed0 = runs_dir / 'lra/listops/transformer/seed0/results.json'
  seed1 = runs_dir / 'lra/listops/transformer/seed1/results.json'
  fixed = runs_dir / 'lra/listops/combiner_fixed/seed0/results.json'
  axial = runs_dir / 'lra/listops/combiner_axial/seed0/results.json'
  _set_devices(seed0, [dict(gpu, from_step=0, to_step=10)])
  _set_devices(seed1, [dict(gpu, from_step=0, to_step=10)])
  # Resumed on other hardware: both kinds, in order, and no cell speed.
  _set_devices(fixed, [dict(cpu, from_step=0, to_step=6),
                       dict(gpu, from_step=6, to_step=10)])
  # Written before the history was kept: only the finishing process known,
  # so its speed is not compared either.
  _set_devices(axial, last=dict(gpu))
  runs = _labelled(runs_dir)
  by_label = {r['mechanism']: r for r in runs}
  assert results.device_kinds(by_label['combiner_fixed']) == ['cpu', 'H100']
  assert results.device_kinds(by_label['combiner_axial']) == [
      'H100 (last process)']
  rows = {r['mechanism']: r for r in results.aggregate(runs)}
  assert rows['transformer']['tasks']['listops']['device'] == 'H100'
  assert rows['transformer']['tasks']['listops']['steps_per_sec'] == 10.0
  assert rows['combiner_fixed']['tasks']['listops']['steps_per_sec'] is None
  assert rows['combiner_axial']['tasks']['listops']['steps_per_sec'] is None
  # A speed ratio needs both runs on the same kind of device.
  points = results.bubble_chart(list(rows.values()), str(tmp_path / 'b.png'))
  speed = {p['label']: p['relative_speed'] for p in points}
  assert 'combiner_fixed' not in speed and 'combiner_axial' not in speed
  table = results.markdown(list(rows.values()), runs)
  assert '| cpu → H100 |' in table and '| H100 (last process) |' in table


def _results_files(runs_dir):
  """The results.json files under `runs_dir`, as `results.main` finds them."""
  return [os.path.join(d, results.RESULTS_FILE)
          for d in results.find_run_dirs([str(runs_dir)])
          if os.path.exists(os.path.join(d, results.RESULTS_FILE))]


def _labelled(runs_dir):
  runs = [results.load_run(p) for p in _results_files(runs_dir)]
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
  assert 'lra_msmra_tools.results' in lines[-1]
  missing = subprocess.run(cmd[:5] + ['nope'] + cmd[6:], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
  assert missing.returncode != 0 and 'Missing config' in missing.stderr


def _sections(text):
  """{heading: body} of the markdown's ## sections."""
  out, name = {}, None
  for line in text.splitlines():
    if line.startswith('## '):
      name = line[3:]
      out[name] = []
    elif name is not None:
      out[name].append(line)
  return {k: '\n'.join(v) for k, v in out.items()}


def test_changed_settings_and_mock_data_never_join_the_official_rows(
    tmp_path):
  root = tmp_path / 'runs'
  _write_run(root / 'a', 'text', 'transformer', 'lra', 0.60, 0)
  _write_run(root / 'b', 'text', 'transformer', 'lra', 0.70, 0,
             overrides={'data.max_length': 4000})
  _write_run(root / 'c', 'text', 'transformer', 'lra', 0.99, 0,
             source='mock')
  out = tmp_path / 'out'
  results.main(['results', '--runs', str(root), '--out', str(out)])
  sections = _sections((out / 'results.md').read_text())
  official = sections['Protocol: LRA official (`lra`)']
  changed = sections['LRA official (`lra`), changed settings']
  mock = sections['Mock or unknown data: plumbing checks, not results']
  # Three rows, each labelled; only the official one beside the leaderboard.
  assert '**transformer** (ours)' in official and '60.00' in official
  assert '70.00' not in official and '99.00' not in official
  assert '64.27' in official  # LRA's Transformer on Text.
  assert '**transformer (data.max_length=4000)** (ours)' in changed
  assert '70.00' in changed and '64.27' not in changed
  assert '**transformer** (ours; mock data)' in mock and '99.00' in mock
  rows = json.loads((out / 'results_table.json').read_text())['rows']
  assert len(rows) == 3
  assert [r['official'] for r in rows].count(True) == 2  # official and mock
  assert sum(r['official'] and r['data_kind'] == 'release' for r in rows) == 1


def test_runs_are_averaged_only_with_equal_settings(tmp_path):
  root = tmp_path / 'runs'
  _write_run(root / 's0', 'listops', 'cst', 'xiong', 0.30, 0)
  _write_run(root / 's1', 'listops', 'cst', 'xiong', 0.40, 1)
  _write_run(root / 'lr', 'listops', 'cst', 'xiong', 0.50, 2,
             overrides={'schedule.max_learning_rate': 2e-4})
  runs = _labelled(root)
  rows = results.aggregate(runs)
  assert len(rows) == 2
  cell = {r['mechanism']: r['tasks']['listops'] for r in rows}
  assert cell['cst']['n'] == 2 and cell['cst']['mean'] == pytest.approx(35.0)
  assert cell['cst (schedule.max_learning_rate=0.0002)']['n'] == 1
  fingerprints = {r['fingerprint'] for r in runs}
  assert len(fingerprints) == 2  # seeds share one; the changed LR has its own


def test_generated_data_records_are_completed_before_comparing(tmp_path):
  # Runs of the same generated data that recorded the generator's settings
  # differently (the call's own, or all of them) are seeds of one setting;
  # data from other settings is another setting.
  from lra_msmra.data import listops  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'runs'
  _write_run(root / 's0', 'listops', 'cst', 'xiong', 0.30, 0,
             source='generated', generator=dict(listops.GENERATOR_DEFAULTS))
  _write_run(root / 's1', 'listops', 'cst', 'xiong', 0.40, 1,
             source='generated', generator={'num_train': 96000, 'seed': 0})
  _write_run(root / 'd4', 'listops', 'cst', 'xiong', 0.50, 0,
             source='generated', generator={'max_depth': 4, 'seed': 0})
  runs = _labelled(root)
  by_seed_dir = {os.path.basename(os.path.dirname(r['path'])): r
                 for r in runs}
  assert by_seed_dir['s0']['fingerprint'] == by_seed_dir['s1']['fingerprint']
  assert by_seed_dir['d4']['fingerprint'] != by_seed_dir['s0']['fingerprint']
  assert by_seed_dir['s1']['data_source']['generator']['max_depth'] == 10
  assert len(results.aggregate(runs)) == 2


def test_generated_listops_is_marked_and_options_are_recognised(tmp_path):
  root = tmp_path / 'runs'
  _write_run(root / 'g', 'listops', 'long_short', 'xiong', 0.37, 0,
             source='generated')
  runs = _labelled(root)
  assert runs[0]['official'] and runs[0]['mechanism'] == 'long_short'
  text = results.markdown(results.aggregate(runs), runs)
  assert '**long_short** (ours; generated data, generator seed 0)' in text
  assert '37.50' in text  # the Transformer-LS paper's ListOps number.


def test_runlocal_jobs_are_named_and_kept_from_every_protocol_table(
    tmp_path):
  root = tmp_path / 'runs'
  _write_run(root / 'quick', 'listops', 'cst', 'lra', 0.31, 0,
             source='generated', extra_option='runlocal')
  _write_run(root / 'quick_xiong', 'listops', 'cst', 'xiong', 0.29, 0,
             source='generated', extra_option='runlocal')
  _write_run(root / 'full', 'listops', 'cst', 'lra', 0.37, 0)
  runs = _labelled(root)
  by_path = {os.path.basename(os.path.dirname(r['path'])): r for r in runs}
  assert [(by_path[k]['mechanism'], by_path[k]['official'],
           by_path[k]['runlocal']) for k in ('quick', 'quick_xiong')] == [
               ('cst:runlocal', False, True)] * 2
  assert by_path['full']['official'] and not by_path['full']['runlocal']
  sections = _sections(results.markdown(results.aggregate(runs), runs))
  quick = sections['`runlocal` jobs: quick checks, not results']
  assert '31.00' in quick and '29.00' in quick and '37.00' not in quick
  assert '**cst:runlocal** (ours; generated data, generator seed 0)' in quick
  for title, text in sections.items():
    if title.startswith(('Protocol:', 'LRA official', 'Xiong')):
      assert '31.00' not in text and '29.00' not in text, title


def _write_metrics(folder, steps, repeat_from=None):
  os.makedirs(folder / 'tensorboard', exist_ok=True)
  lines = []
  for s in steps:
    lines.append({'step': s, 'train/loss': 2.0 - s / 100,
                  'train/accuracy': s / 100})
    lines.append({'step': s, 'val/loss': 2.1 - s / 100,
                  'val/accuracy': s / 110})
  if repeat_from is not None:  # a resumed run wrote these steps again
    lines += [l for l in lines if l['step'] >= repeat_from]
  (folder / 'tensorboard' / 'metrics.jsonl').write_text(
      ''.join(json.dumps(l) + '\n' for l in lines))


def test_curves_collect_and_rebuild(tmp_path):
  root = tmp_path / 'runs'
  done = root / 'xiong' / 'listops' / 'cst' / 'seed0'
  _write_run(done, 'listops', 'cst', 'xiong', 0.30, 0, source='generated')
  _write_metrics(done, [50, 100, 150], repeat_from=100)
  going = root / 'xiong' / 'listops' / 'transformer' / 'seed0'
  _write_metrics(going, [50, 100])
  (going / 'config.json').write_text(json.dumps(
      {'task': 'listops', 'protocol': 'xiong'}))
  out, copy = tmp_path / 'out', tmp_path / 'copy'
  results.main(['results', '--runs', str(root), '--out', str(out),
                '--collect', str(copy)])
  text = (out / 'results.md').read_text()
  assert 'transformer/seed0 (unfinished, step 100)' in text
  assert (out / 'results_curves.png').read_bytes()[:4] == b'\x89PNG'
  table = json.loads((out / 'results_table.json').read_text())
  assert {c['label']: c['finished'] for c in table['curves']} == {
      'cst s0': True, 'transformer/seed0 (unfinished, step 100)': False}
  # The copy: small files, each step once, no absolute paths.
  copied = copy / 'xiong' / 'listops' / 'cst' / 'seed0'
  metrics = [json.loads(l) for l in
             (copied / 'metrics.jsonl').read_text().splitlines()]
  assert [m['step'] for m in metrics] == [50, 50, 100, 100, 150, 150]
  assert str(tmp_path) not in (copied / 'results.json').read_text()
  # Rebuilding from the copy gives the same tables.
  again = tmp_path / 'again'
  results.main(['results', '--runs', str(copy), '--out', str(again)])
  assert (again / 'results.md').read_text() == text


def test_curves_tell_every_run_apart(tmp_path, monkeypatch):
  """Colour by mechanism, line style by seed, the legend beside the axes."""
  root = tmp_path / 'runs'
  # Eleven mechanisms (past tab10's ten colours), two seeds each, and an
  # unfinished run in the suite's layout.
  mechanisms = [f'mech{i:02d}' for i in range(11)]
  for name in mechanisms:
    for seed in (0, 1):
      folder = root / name / f'seed{seed}'
      _write_metrics(folder, [50, 100, 150])
      (folder / 'config.json').write_text(json.dumps(
          {'task': 'listops', 'protocol': 'xiong', 'seed': seed,
           'model': {'attention': 'softmax'}}))
  figures = []
  plt = reporting.pyplot()
  monkeypatch.setattr(plt, 'close', figures.append)
  series = results.curves_chart(results.find_run_dirs([str(root)]), {},
                                str(tmp_path / 'curves.png'))
  assert {(s['mechanism'], s['seed']) for s in series} == {
      (m, seed) for m in mechanisms for seed in (0, 1)}
  [fig] = figures
  fig.canvas.draw()
  for ax in fig.axes:
    looks = {}
    for line in ax.get_lines():
      look = (line.get_color(), line.get_marker(), line.get_linestyle())
      assert look not in looks.values(), line.get_label()
      # Labels name the unfinished runs' folders: 'mech03/seed1 (...)'.
      looks[line.get_label().split()[0]] = look
    assert len(looks) == 22
    # One colour and marker per mechanism, one line style per seed.
    colours, styles = {}, {}
    for label, (colour, marker, style) in looks.items():
      mechanism, seed = label.split('/')
      colours.setdefault(mechanism, set()).add((colour, marker))
      styles.setdefault(seed, set()).add(style)
    assert all(len(c) == 1 for c in colours.values())
    assert len(set().union(*colours.values())) == 11
    assert [len(s) for s in styles.values()] == [1, 1]
    assert styles['seed0'] != styles['seed1']
  [last] = [ax for ax in fig.axes if ax.get_legend() is not None]
  legend = last.get_legend()
  assert len(legend.get_texts()) == 22
  renderer = fig.canvas.get_renderer()
  assert (legend.get_window_extent(renderer).x0 >=
          max(ax.get_window_extent(renderer).x1 for ax in fig.axes))
  # Four panels in a 2 × 2 block, not a strip; every y axis says what it
  # shows, and accuracy is in %, as in the tables.
  width, height = fig.get_size_inches()
  assert len(fig.axes) == 4 and width / height < 2
  assert sorted(ax.get_ylabel() for ax in fig.axes) == [
      'accuracy (%)', 'accuracy (%)', 'loss', 'loss']
  accuracy = [ax for ax in fig.axes if ax.get_title().endswith(
      'training accuracy')][0]
  assert max(max(line.get_ydata()) for line in accuracy.get_lines()) == (
      pytest.approx(150.0))
  plt.close(fig)


def test_collect_never_replaces_another_run(tmp_path):
  def run(root, pos_emb, acc):
    folder = root / 'xiong' / 'listops' / 'cst' / 'seed0'
    _write_run(folder, 'listops', 'cst', 'xiong', acc, 0,
               overrides={'model.pos_emb': pos_emb})
    config = json.loads((folder / 'results.json').read_text())['config']
    (folder / 'config.json').write_text(json.dumps(config))
    return root
  official = run(tmp_path / 'runs', 'none', 0.17)
  diagnostic = run(tmp_path / 'diag', 'learned', 0.30)
  copy, out = tmp_path / 'copy', str(tmp_path / 'out')
  results.main(['results', '--runs', str(official), '--out', out,
                '--collect', str(copy)])
  copied = copy / 'xiong' / 'listops' / 'cst' / 'seed0' / 'results.json'
  first = copied.read_text()
  # The same run again (e.g. further on): its copy is updated.
  results.main(['results', '--runs', str(official), '--out', out,
                '--collect', str(copy)])
  assert copied.read_text() == first
  # Another run at the same path under its root: refused, copy unchanged.
  with pytest.raises(SystemExit, match=r'another config \(differs in '
                     r'model\.pos_emb\)'):
    results.main(['results', '--runs', str(diagnostic), '--out', out,
                  '--collect', str(copy)])
  assert copied.read_text() == first
  # Two roots of the same layout in one call: refused before writing.
  fresh = tmp_path / 'fresh'
  with pytest.raises(SystemExit, match='would both be copied'):
    results.main(['results', '--runs', str(official), str(diagnostic),
                  '--out', out, '--collect', str(fresh)])
  assert not fresh.exists()


def test_suite_without_data_stops_before_running(tmp_path):
  cmd = [sys.executable, 'launch/suite.py', '--protocol', 'xiong',
         '--mechanisms', 'cst', '--tasks', 'listops', '--root',
         str(tmp_path), '--dry_run']
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert done.returncode != 0
  assert 'lra_msmra.data.prepare' in done.stderr
  assert 'lra_msmra.main' not in done.stdout


@pytest.mark.parametrize('folder,doc_name', [
    ('listops_xiong', 'results.md'), ('listops_runlocal', 'runlocal.md'),
    ('listops_xiong/diag', None), ('listops_xiong/scale', None),
    ('spt_runlocal', 'pretraining.md')])
def test_committed_results_rebuild_from_their_copy(folder, doc_name,
                                                   tmp_path):
  """The tables of docs/results.md (full-size ListOps runs and their
  diagnostics) and docs/runlocal.md (the suite of runlocal jobs) are what
  their documented command builds from the committed run files."""
  committed = os.path.join(ROOT, 'docs', 'results', folder)
  runs = tmp_path / 'runs'
  shutil.copytree(os.path.join(committed, 'runs'), runs)
  args = ['results', '--runs', str(runs), '--out', str(tmp_path / 'o')]
  if doc_name:
    doc = tmp_path / doc_name
    shutil.copy(os.path.join(ROOT, 'docs', doc_name), doc)
    args += ['--doc', str(doc)]
  results.main(args)
  with open(os.path.join(committed, 'summary', 'results.md')) as f:
    assert (tmp_path / 'o' / 'results.md').read_text() == f.read()
  if doc_name:
    with open(os.path.join(ROOT, 'docs', doc_name)) as f:
      assert doc.read_text() == f.read()


def test_each_protocol_prints_its_whole_baseline_table():
  # The leaderboard's and Xiong et al.'s rows stand beside any run of their
  # protocol, also for models that are registry entries we did not run.
  for protocol, table in (('lra', published.LRA_LEADERBOARD),
                          ('xiong', published.XIONG),
                          ('cst', published.CST_PAPER)):
    rows = published.reference_rows(protocol, {'softmax'})
    assert all(r in rows for r in table), protocol
  assert any(r.mechanism not in (None, 'softmax')
             for r in published.LRA_LEADERBOARD)


def test_lra_table2_as_transcribed_agrees_with_its_printed_ratios():
  base = published.LRA_TABLE2['softmax']
  assert set(published.LRA_TABLE2) <= set(attention.REGISTRY)
  for name, row in published.LRA_TABLE2.items():
    assert min(row.steps_per_s + row.memory_gb) > 0, name
    if name == 'softmax':
      continue
    for i, printed in enumerate(row.printed_speedup):
      ratio = row.steps_per_s[i] / base.steps_per_s[i]
      assert abs(ratio - printed) <= 0.06, (name, i, ratio, printed)
  assert published.lra_table2_ratios('performer', 3072) == pytest.approx(
      (8.7 / 2.3, 0.82 / 5.51))
  assert published.lra_table2_ratios('cst', 1024) is None
  assert published.lra_table2_ratios('local', 1536) is None


def test_cells_on_the_majority_class_floor_are_marked():
  floor = {'test_accuracy': 0.1685, 'test_majority_rate': 0.1675}
  learned = {'test_accuracy': 0.2070, 'test_majority_rate': 0.1675}
  assert results.on_floor(floor) and not results.on_floor(learned)
  assert not results.on_floor({'test_accuracy': 0.17})  # Rate unknown.
  cell = {'mean': 16.85, 'std': 0.13, 'n': 3, 'floor': True}
  assert results._fmt_score(cell) == '16.85 ± 0.13 (n=3) floor'  # pylint: disable=protected-access
  assert results._fmt_score({**cell, 'floor': False}).endswith('(n=3)')  # pylint: disable=protected-access


def test_suite_learning_rate_bracket(tmp_path):
  cmd = [sys.executable, 'launch/suite.py', '--protocol', 'cst',
         '--mechanisms', 'cst', '--tasks', 'listops', '--seeds', '0',
         '--lr_bracket', '1,2,0.5', '--data_dir', str(tmp_path),
         '--root', str(tmp_path), '--dry_run']
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert done.returncode == 0, done.stderr
  runs = [shlex.split(l) for l in done.stdout.splitlines()
          if 'lra_msmra.main' in l]
  folders = [os.path.relpath(r[r.index('--workdir') + 1], str(tmp_path))
             for r in runs]
  assert folders == ['cst/listops/cst/seed0', 'cst/listops/cst_lr2x/seed0',
                     'cst/listops/cst_lr0.5x/seed0']
  # configs/listops/base.py sets l0 = 1e-5 for the `cst` protocol.
  rates = [[a for a in r if a.startswith('--config.schedule.')] for r in runs]
  assert rates == [[], ['--config.schedule.learning_rate=2e-05'],
                   ['--config.schedule.learning_rate=5e-06']]
  bad = subprocess.run(cmd[:9] + ['--lr_bracket', 'x'] + cmd[11:],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert bad.returncode != 0 and '--lr_bracket' in bad.stderr


def test_learning_rate_search_picks_the_best_validation_rate(tmp_path):
  # Two seeds of `cst:cst`, each at the config's own rate (1e-5) and at
  # 2x; the chosen run is the better one on validation, not on test.
  for seed, (own_val, own_test, x2_val, x2_test) in enumerate(
      [(0.30, 0.40, 0.35, 0.33), (0.36, 0.31, 0.20, 0.39)]):
    for rate, val, test in ((None, own_val, own_test),
                            (2e-5, x2_val, x2_test)):
      folder = tmp_path / ('cst' if rate is None else 'cst_lr2x') / str(seed)
      _write_run(str(folder), 'listops', 'cst', 'cst', test, seed,
                 overrides=({} if rate is None else
                            {'schedule.learning_rate': rate}))
      path = folder / 'results.json'
      record = json.loads(path.read_text())
      record['best']['val_accuracy'] = val
      path.write_text(json.dumps(record))
  runs = _labelled(str(tmp_path))
  picked = results.select_by_validation(runs)
  assert [p['mechanism'] for p in picked] == [
      'cst (learning rate by validation)'] * 2
  by_seed = {p['config']['seed']: p for p in picked}
  assert by_seed[0]['test_accuracy'] == 0.33  # 2x: validation 35 > 30
  assert by_seed[1]['test_accuracy'] == 0.31  # own rate: 36 > 20
  assert by_seed[0]['searched'][0] == 'schedule.learning_rate=2e-05'
  assert by_seed[1]['searched'][0] == "the config's own"
  assert all(p['official'] for p in picked)
  # Both seeds searched the same rates: one row, averaged over them.
  rows = [r for r in results.aggregate(runs + picked)
          if r['mechanism'].endswith('(learning rate by validation)')]
  assert len(rows) == 1 and rows[0]['tasks']['listops']['n'] == 2
  assert abs(rows[0]['tasks']['listops']['mean'] - 32.0) < 1e-9
  # A lone rate is no search.
  assert results.select_by_validation(
      [r for r in runs if r['official']]) == []


def test_a_run_with_nothing_logged_yet_gets_no_legend(tmp_path):
  run = tmp_path / 'runs' / 'xiong' / 'listops' / 'cst' / 'seed0'
  (run / 'tensorboard').mkdir(parents=True)
  (run / 'config.json').write_text(json.dumps(
      {'model': {'attention': 'cst'}, 'protocol': 'xiong',
       'task': 'listops', 'seed': 0}))
  (run / 'tensorboard' / 'metrics.jsonl').write_text('')
  results.main(['results', '--runs', str(tmp_path / 'runs'),
                '--out', str(tmp_path / 'out')])
  table = json.loads((tmp_path / 'out' / results.TABLE_FILE).read_text())
  assert table['rows'] == [] and [c['finished'] for c in
                                  table['curves']] == [False]


def _add_pretraining(folder, steps, workdir):
  path = os.path.join(folder, 'results.json')
  with open(path) as f:
    data = json.load(f)
  data['config']['init_from'] = workdir
  data['pretraining'] = {'objective': 'masked', 'workdir': workdir,
                         'steps': steps, 'masking': {'rate': 0.15, 'span': 1},
                         'final_val_loss': 2.0, 'final_val_accuracy': 0.3}
  with open(path, 'w') as f:
    json.dump(data, f)


def test_fine_tuned_runs_get_rows_of_their_own(tmp_path):
  root = tmp_path / 'runs'
  _write_run(root / 'scratch0', 'listops', 'cst', 'lra', 0.30, 0)
  for seed in (0, 1):
    folder = root / f'spt{seed}'
    _write_run(folder, 'listops', 'cst', 'lra', 0.40 + seed / 10, seed)
    # Each seed's own pretraining workdir: the path does not split the row.
    _add_pretraining(folder, 750, str(folder / 'pretrain'))
    _write_run(folder / 'pretrain', 'listops', 'cst', 'lra', 0.9, seed,
               overrides={'objective': 'masked'})
    with open(folder / 'pretrain' / 'results.json') as f:
      data = json.load(f)
    data['objective'] = 'masked'
    with open(folder / 'pretrain' / 'results.json', 'w') as f:
      json.dump(data, f)
  _write_run(root / 'spt_long', 'listops', 'cst', 'lra', 0.6, 0)
  _add_pretraining(root / 'spt_long', 1500, '/elsewhere')
  runs = [r for r in map(results.load_run, _results_files(root))
          if not results.is_pretraining(r)]
  assert len(runs) == 4  # The two pretraining runs have no row.
  results.label_runs(runs)
  rows = {r['mechanism']: r for r in results.aggregate(runs)}
  assert set(rows) == {'cst', 'cst + SPT masked 15%, 750 steps',
                       'cst + SPT masked 15%, 1500 steps'}
  spt = rows['cst + SPT masked 15%, 750 steps']
  assert spt['tasks']['listops']['n'] == 2 and not spt['official']
  assert spt['tasks']['listops']['mean'] == pytest.approx(45.0)
  assert rows['cst']['official'] and rows['cst']['tasks']['listops']['n'] == 1


def test_pretraining_runs_have_no_curve_and_no_row(tmp_path):
  root = tmp_path / 'runs'
  _write_run(root / 'spt0', 'listops', 'cst', 'lra', 0.4, 0)
  _add_pretraining(root / 'spt0', 10, str(root / 'spt0' / 'pretrain'))
  _write_metrics(root / 'spt0', [5, 10])
  pre = root / 'spt0' / 'pretrain'
  pre.mkdir()
  (pre / 'config.json').write_text(json.dumps({'objective': 'masked'}))
  _write_metrics(pre, [5])  # Unfinished: metrics only.
  assert results.pretraining_dir(str(pre))
  assert not results.pretraining_dir(str(root / 'spt0'))
  out = tmp_path / 'out'
  results.main(['results', '--runs', str(root), '--out', str(out)])
  table = json.loads((out / results.TABLE_FILE).read_text())
  assert [c['finished'] for c in table['curves']] == [True]
  assert 'Unfinished runs' not in (out / 'results.md').read_text()
