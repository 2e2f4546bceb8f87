"""Training-step benchmark: a small end-to-end run and config resolution."""

import json
import os

import pytest

from lra_msmra_tools.benchmark import train_step
from tests.benchmark import run_benchmark

# One test worker runs this file, so its module-scoped fixture is built
# once (pytest-xdist's `--dist loadgroup`, set in pytest.ini).
pytestmark = pytest.mark.xdist_group('benchmark_train_step')

MECHANISMS = ['softmax', 'cst:slice_length=4']
LENGTHS = [16, 32]


@pytest.fixture(scope='module')
def bench_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp('train_step')
  run_benchmark('lra_msmra_tools.benchmark.train_step', MECHANISMS, LENGTHS, out,
                '--options', 'runlocal', '--batch', '2', '--repeats', '2')
  return out


def test_outputs_cover_every_mechanism_and_length(bench_dir):
  with open(bench_dir / 'train_step.json') as f:
    report = json.load(f)
  seen = {(r['mechanism'], r['length']): r for r in report['records']}
  assert set(seen) == {(m, n) for m in MECHANISMS for n in LENGTHS}
  for (m, n), rec in seen.items():
    assert rec['status'] == 'ok', rec
    assert rec['steps_per_s'] > 0 and rec['flops'] > 0
    assert rec['config'] == os.path.join(
        'configs', 'text', 'transformer.py' if m == 'softmax' else 'cst.py')
    # The Text config pools on a CLS token: the model sees N + 1 tokens.
    assert rec['model_length'] == n + 1
  assert seen[('cst:slice_length=4', 16)]['attention_kw']['slice_length'] == 4
  assert seen[('softmax', 16)]['attention'] == 'softmax'
  text = (bench_dir / 'train_step.md').read_text()
  for m in MECHANISMS:
    assert f'`{m}`' in text
  for n in LENGTHS:
    assert f' {n} |' in text
  data = (bench_dir / 'train_step.png').read_bytes()
  assert data[:4] == b'\x89PNG'


def test_config_names():
  root = train_step.CONFIG_ROOT
  assert train_step.config_path(root, 'text', 'softmax').endswith(
      os.path.join('text', 'transformer.py'))
  assert train_step.config_path(root, 'text', 'combiner').endswith(
      'combiner_fixed.py')
  assert train_step.config_path(root, 'text', 'cst_l16').endswith(
      'cst_l16.py')
  with pytest.raises(ValueError, match='choose one of'):
    train_step.config_path(root, 'text', 'nope')


def _report(task='text', baseline='softmax', lengths=(1024, 4096)):
  """A report of softmax, performer and cst (no Table 2 row) at `lengths`."""
  records = [
      {'mechanism': m, 'attention': m, 'kw': {}, 'length': n, 'status': 'ok',
       'steps_per_s': 1.0, 'net_peak_bytes': 1 << 20, 'flops': 1e9,
       'num_params': 10, 'device': {'device_kind': 'cpu', 'backend': 'cpu'}}
      for m in ('softmax', 'performer', 'cst') for n in lengths]
  return {
      'command': 'python -m lra_msmra_tools.benchmark.train_step ...',
      'settings': {'task': task, 'options': '', 'lengths': list(lengths),
                   'mechanisms': ['softmax', 'performer', 'cst'],
                   'baseline': baseline, 'batch': 4, 'repeats': 3,
                   'warmup': 1},
      'environment': {'date_utc': 'now', 'cpu': 'x', 'cpu_count': 2,
                      'versions': {}, 'load_average': [0.0, 0.0, 0.0]},
      'load_average_end': [0.0, 0.0, 0.0], 'records': records}


def test_text_runs_against_softmax_show_the_published_table2_ratios():
  text = train_step.markdown(_report())
  section = text[text.index('## Published: LRA paper, Table 2'):]
  # Performer at 1K and 4K: 9.5 and 8.0 steps/s against the Transformer's
  # 8.1 and 1.4; 0.37 and 1.06 GB against 0.85 and 9.48.
  assert '| `performer` | 1.17× / 0.44× | 5.71× / 0.11× |' in section
  assert '`cst`' not in section and '`softmax`' not in section
  for other in (_report(task='listops'), _report(baseline='performer'),
                _report(lengths=(512, 8192))):
    assert '## Published' not in train_step.markdown(other)
