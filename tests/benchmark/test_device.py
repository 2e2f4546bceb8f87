"""The GPU benchmark on the CPU: the whole pipeline at tiny sizes, the
roofline model against hand-computed bytes, the target verdicts, the
markdown and docs section, and launch/gpu_benchmark.sh in --dry_run mode."""

import concurrent.futures
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
import types

import pytest

from lra_msmra import hardware
from lra_msmra_tools.benchmark import device
from lra_msmra_tools.benchmark import device_report
from lra_msmra_tools.benchmark import roofline
from tests import helpers

# The pipeline fixture is built once, on one test worker.
pytestmark = pytest.mark.xdist_group('benchmark_device')

SCRIPT = os.path.join(helpers.ROOT, 'launch', 'gpu_benchmark.sh')
H100 = 'NVIDIA H100 80GB HBM3'


# ------------------------------------------------------------- roofline


def test_layer_bytes_by_hand():
  # B=2, N=8, D=E=4, bfloat16, four 4x4 float32 matrices (256 bytes): x, q,
  # k, v, the attention output and y are 16 tokens x 4 x 2 = 128 bytes
  # each; the mask 16 bytes.
  kw = dict(batch=2, length=8, features=4, qkv_features=4, param_nbytes=256,
            act_bytes=2)
  fwd = roofline.layer_bytes(mode='fwd', **kw)
  assert fwd['parts'] == {
      'read input and padding mask': 128 + 16, 'read parameters': 256,
      'write and read q, k, v': 768, 'write and read attention output': 256,
      'write output': 128}
  assert fwd['bytes'] == 1552
  both = roofline.layer_bytes(mode='fwd_bwd', **kw)
  # + cotangent 128, saved q/k/v/o/x 640, cotangents of o/q/k/v written and
  # read 1024, dx 128, parameters read and gradients written 512.
  assert both['bytes'] == 1552 + 128 + 640 + 1024 + 128 + 512
  assert sum(both['parts'].values()) == both['bytes']
  # Other widths: D=4 in, E=8 inside, 2 out, float32.
  odd = roofline.layer_bytes(batch=1, length=2, features=4, qkv_features=8,
                             out_features=2, param_nbytes=0, act_bytes=4,
                             mode='fwd')
  assert odd['bytes'] == (32 + 2) + 0 + 6 * 64 + 2 * 64 + 16
  with pytest.raises(ValueError, match='mode'):
    roofline.layer_bytes(mode='bwd', **kw)


def test_layer_bytes_docstring_figures():
  kw = dict(batch=4, length=16384, features=256, qkv_features=256,
            param_nbytes=4 * 256 * 256 * 4, act_bytes=2)
  assert round(roofline.layer_bytes(mode='fwd', **kw)['bytes'] / 1e9,
               2) == 0.34
  assert round(roofline.layer_bytes(mode='fwd_bwd', **kw)['bytes'] / 1e9,
               2) == 0.84


def test_roofline_time_and_rates():
  peak = hardware.Peak(1e15, 1e12, 'test')
  assert roofline.roofline_s(1e12, 2e9, 1e15, 1e12) == pytest.approx(2e-3)
  assert roofline.bound(1e12, 2e9, 1e15, 1e12) == 'memory'
  assert roofline.bound(4e12, 2e9, 1e15, 1e12) == 'compute'
  assert roofline.roofline_s(1e12, None, 1e15, 1e12) is None
  r = roofline.rates(flops=1e12, num_bytes=2e9, time_s=4e-3, peak=peak)
  assert r['tflops_per_s'] == pytest.approx(250)
  assert r['pct_peak_flops'] == pytest.approx(25)
  assert r['pct_peak_bandwidth'] == pytest.approx(50)
  assert r['roofline_s'] == pytest.approx(2e-3)
  assert r['over_roofline'] == pytest.approx(2)
  cpu = roofline.rates(flops=1e12, num_bytes=2e9, time_s=4e-3, peak=None)
  assert cpu['tflops_per_s'] == pytest.approx(250)
  assert cpu['pct_peak_flops'] is None and cpu['over_roofline'] is None


# ---------------------------------------------------- variants and flags


def test_variants_cover_the_issue():
  layers = {v.name: v.implementations for v in device.VARIANTS
            if v.kind == 'layer'}
  assert layers['softmax'] == ('xla', 'cudnn')
  for name in ('cst', 'long_short', 'adamra', 'combiner:variant=fixed',
               'combiner:variant=axial,axial_plan=vertical'):
    assert layers[name][0] == 'xla', name
  train = [v.name for v in device.VARIANTS if v.kind == 'train']
  assert train == ['transformer', 'cst', 'cst_l16', 'long_short', 'adamra',
                   'combiner_fixed', 'combiner_axial']
  for name in train:  # Every config file exists.
    assert os.path.exists(os.path.join(helpers.ROOT, 'configs', 'listops',
                                       name + '.py'))


def test_select_variants_and_settings():
  chosen = device.select_variants(
      'cst,combiner:variant=axial,axial_plan=vertical', 'none', 'xla')
  assert [(v.kind, v.name, v.implementations) for v in chosen] == [
      ('layer', 'cst', ('xla',)),
      ('layer', 'combiner:variant=axial,axial_plan=vertical', ('xla',))]
  assert len(device.select_variants('all', 'all', 'all')) == len(
      device.VARIANTS)
  with pytest.raises(ValueError, match='not in VARIANTS'):
    device.select_variants('performer', 'none', 'all')
  with pytest.raises(ValueError, match='in no variant'):
    device.select_variants('all', 'none', 'triton')
  with pytest.raises(ValueError, match='no variant'):
    device.select_variants('none', 'none', 'all')
  assert device.parse_settings('4:bfloat16:fwd_bwd, 32:float32:fwd') == [
      device.Setting(4, 'bfloat16', 'fwd_bwd'),
      device.Setting(32, 'float32', 'fwd')]
  for bad in ('4:bfloat16', 'x:bfloat16:fwd', '4:int8:fwd', '4:float32:bwd',
              '4:float32:fwd,4:float32:fwd', ''):
    with pytest.raises(ValueError):
      device.parse_settings(bad)


def test_implementation_kw():

  @dataclasses.dataclass
  class Old:  # A layer class from before the `implementation` field.
    num_heads: int = 1

  @dataclasses.dataclass
  class New:
    implementation: str = 'xla'
    IMPLEMENTATIONS = ('xla', 'pallas')

  assert device.implementation_kw(Old, 'xla') == {}
  with pytest.raises(device.NotAvailable, match='no `implementation` field'):
    device.implementation_kw(Old, 'pallas')
  assert device.implementation_kw(New, 'pallas') == {
      'implementation': 'pallas'}
  with pytest.raises(device.NotAvailable, match='IMPLEMENTATIONS'):
    device.implementation_kw(New, 'cudnn')
  device.check_dtype('cudnn', 'bfloat16')
  device.check_dtype('xla', 'float32')
  with pytest.raises(device.NotAvailable, match='bfloat16'):
    device.check_dtype('cudnn', 'float32')


def test_predict_seconds_and_oom():
  assert device.predict_seconds([], 2048) is None
  assert device.predict_seconds([(1024, 1.0)], 2048) == pytest.approx(4.0)
  # Linear growth from two points, continued.
  assert device.predict_seconds([(1024, 1.0), (2048, 2.0)],
                                4096) == pytest.approx(4.0)
  assert device.out_of_memory(RuntimeError('RESOURCE_EXHAUSTED: Out of '
                                           'memory while trying'))
  assert not device.out_of_memory(ValueError('shapes'))


class FakeCompiled:
  """What `_compile_phase` reads of a compiled program."""

  def __init__(self, peak):
    self.peak = peak

  def memory_analysis(self):
    return types.SimpleNamespace(
        argument_size_in_bytes=self.peak, output_size_in_bytes=0,
        temp_size_in_bytes=0, alias_size_in_bytes=0)

  def cost_analysis(self):
    return {}


class FakeLowered:

  def __init__(self, peak, seconds):
    self.peak, self.seconds = peak, seconds

  def compile(self):
    time.sleep(self.seconds)
    return FakeCompiled(self.peak)


def fake_point(chain, length, peak=1, seconds=0.0, error=None):
  rec = {'kind': 'layer', 'variant': 'v', 'implementation': chain,
         'setting': 's', 'length': length}

  def lower():
    if error:
      raise error
    return FakeLowered(peak, seconds), {}
  return device.Point(rec, chain, length, lower, None)


def test_compile_phase_memory_and_availability():
  gib = 2 ** 30
  points = [fake_point('a', 1024, 1 * gib), fake_point('a', 2048, 8 * gib),
            fake_point('a', 4096, 1 * gib), fake_point('a', 8192, 1 * gib)]
  points += [fake_point('b', n, error=device.NotAvailable('no kernel'))
             for n in (1024, 2048)]
  points += [fake_point('c', 1024, 20 * gib), fake_point('c', 2048)]
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    left = device._compile_phase(  # pylint: disable=protected-access
        points, pool, device._Chains(), threads=2,  # pylint: disable=protected-access
        deadline=time.time() + 60, grace=10, budget=10 * gib)
  assert left == 0
  got = [(p.record['implementation'], p.length, p.record.get('status'),
          p.record.get('reason')) for p in points]
  assert got[:2] == [('a', 1024, None, None), ('a', 2048, None, None)]
  # 8 GiB at 2K after 1 GiB at 1K: growth clipped to N^2.5, 45 GiB at 4K.
  assert got[2][2] == 'does not fit' and 'predicted peak 45.3 GiB' in got[2][3]
  assert got[3][2:] == ('does not fit', 'N=4096 was does not fit')
  assert got[4][2:] == got[5][2:] == ('not available', 'no kernel')
  assert got[6][2] == 'does not fit' and 'XLA assigns 20.0 GiB' in got[6][3]
  assert got[7][2:] == ('does not fit', 'N=1024 was does not fit')
  assert points[0].compiled is not None and points[6].compiled is None
  assert points[0].record['xla_peak_bytes'] == gib


def test_compile_phase_deadline():
  points = [fake_point('a', 1024, seconds=3.0), fake_point('a', 2048),
            fake_point('b', 1024)]
  pool = concurrent.futures.ThreadPoolExecutor(1)
  start = time.time()
  left = device._compile_phase(  # pylint: disable=protected-access
      points, pool, device._Chains(), threads=1,  # pylint: disable=protected-access
      deadline=start + 0.5, grace=0.3, budget=None)
  assert time.time() - start < 2.5  # The slow compile was left behind.
  pool.shutdown(wait=False)
  assert left == 1
  assert points[0].record['status'] == 'not run'
  assert 'had not ended 0 s after' in points[0].record['reason']
  # The rest of chain 'a', and chain 'b', which waited for the one thread.
  for p in points[1:]:
    assert p.record['status'] == 'not run'
    assert p.record['reason'] == device.NO_TIME_TO_COMPILE


# -------------------------------------------------------------- verdicts


def _layer(variant, impl, n, time_s, peak_bytes, status='ok', **extra):
  rec = {'kind': 'layer', 'variant': variant, 'mechanism': variant,
         'implementation': impl, 'setting': '4:bfloat16:fwd_bwd', 'batch': 4,
         'dtype': 'bfloat16', 'mode': 'fwd_bwd', 'length': n,
         'status': status, 'flops': 1e12 * n / 16384,
         'bytes': 1e9 * n / 16384, 'xla_peak_bytes': peak_bytes,
         'compile_s': 1.0}
  if status == 'ok':
    rec['time_s'] = time_s
  else:
    rec['reason'] = 'test'
  rec.update(extra)
  return rec


LENGTHS = [1024, 2048, 4096, 16384]


def synthetic_report(device_kind=H100):
  """cuDNN at 1/2/4/16 ms; 'fast' 4x faster everywhere, small and near
  its roofline; 'slow' behind at 2K; 'oom' out of memory at 16K."""
  cudnn = dict(zip(LENGTHS, (0.5e-3, 1e-3, 2e-3, 16e-3)))
  records = []
  for n in LENGTHS:
    records += [
        _layer('softmax', 'cudnn', n, cudnn[n], 1e8),
        _layer('softmax', 'xla', n, 2 * cudnn[n], 1e9 * (n / 1024) ** 2),
        _layer('fast', 'xla', n, cudnn[n] / 4, 1e7),
        _layer('slow', 'xla', n, cudnn[n] * (2 if n == 2048 else 0.2), 4e9),
        _layer('oom', 'xla', n, cudnn[n] / 2, 1e7,
               status='out of memory' if n == 16384 else 'ok'),
    ]
  records.append({'kind': 'train', 'variant': 'cst', 'config':
                  'configs/listops/cst.py:cst', 'implementation': 'xla',
                  'dtype': 'bfloat16', 'status': 'ok', 'time_s': 0.01,
                  'steps_per_s': 100.0, 'flops': 1e12,
                  'xla_peak_bytes': 1e9, 'compile_s': 30.0})
  return {
      'command': 'python -m lra_msmra_tools.benchmark.device --out X',
      'environment': {'date_utc': '2026-11-27T00:00:00+00:00', 'cpu': 'CPU',
                      'cores': '16 CPU cores',
                      'versions': {'jax': '0.11.2', 'torch': None}},
      'device': {'device_kind': device_kind, 'platform': 'gpu',
                 'jax_version': '0.11.2', 'jaxlib_version': '0.11.2'},
      'settings': {
          'variants': [['layer', 'softmax', ['xla', 'cudnn']],
                       ['layer', 'fast', ['xla']],
                       ['layer', 'slow', ['xla']],
                       ['layer', 'oom', ['xla']],
                       ['train', 'cst', ['xla']]],
          'settings': ['4:bfloat16:fwd_bwd'], 'lengths': LENGTHS,
          'features': 256, 'heads': 4, 'train_task': 'listops',
          'train_options': 'cst', 'repeats': 20, 'warmup': 2,
          'max_point_seconds': 1.0, 'budget_s': 440, 'reference': 'xla'},
      'records': records, 'workers': []}


def _verdicts(report):
  return {row['variant']: [str(v) for v in row['verdicts']]
          for row in device_report.verdicts(device_report.derive(report))}


def test_verdicts():
  v = _verdicts(synthetic_report())
  assert set(v) == {'fast', 'slow', 'oom'}  # Softmax is the reference.
  fast, slow, oom = v['fast'], v['slow'], v['oom']
  assert fast[0] == 'met (least 4.00×, at N=2048)'
  assert fast[1] == 'met (4.00× at N=16384)'
  # 16 ms / 4 against max(1 TFLOP / 989.4 TFLOP/s, 1 GB / 3.35 TB/s).
  roof = max(1e12 / 989.4e12, 1e9 / 3.35e12)
  assert fast[2] == f'not met ({16e-3 / 4 / roof:.3g}× at N=16384)'
  assert fast[3] == 'met (0.000625× at N=4096)'
  assert slow[0] == 'not met (least 0.50×, at N=2048)'
  assert slow[1] == 'met (5.00× at N=16384)'
  assert slow[3] == 'not met (0.25× at N=4096)'  # 4e9 / 1.6e10.
  assert oom[0] == 'not met (N=16384 out of memory)'
  assert oom[2] == 'not met (N=16384 out of memory)'


def test_verdicts_not_measured():
  report = synthetic_report(device_kind='cpu')
  for rec in report['records']:
    if rec['variant'] == 'softmax' and rec.get('implementation') == 'cudnn':
      rec.update(status='not available', reason='cuDNN needs a GPU')
      del rec['time_s']
    if rec['variant'] == 'softmax' and rec.get('length') == 4096:
      rec.update(status='does not fit')
  v = _verdicts(report)
  assert v['fast'][0] == 'not measured (softmax/cudnn at N=2048 not available)'
  # No peak for the CPU: no roofline time.
  assert v['fast'][2].startswith('not measured (N=16384: no over_roofline')
  # The XLA softmax layer did not fit where this one did.
  assert v['fast'][3] == 'met (the XLA softmax layer did not fit)'
  report['settings']['lengths'] = [1024]
  v = _verdicts(report)
  assert v['fast'][0].startswith('not measured (no N in [2048, ∞]')
  report['settings']['settings'] = ['4:float32:fwd']
  assert device_report.verdicts(device_report.derive(report)) == []


def test_markdown_and_docs_section(tmp_path):
  report = device_report.derive(synthetic_report())
  text = device_report.markdown(report, image='img/gpu.png', full=False)
  assert text.startswith('## GPU\n')
  assert '- Device: NVIDIA H100 80GB HBM3 (gpu)' in text
  assert 'jax 0.11.2, jaxlib 0.11.2' in text and 'torch' not in text
  assert 'bfloat16 989 TFLOP/s, 3.35 TB/s (NVIDIA H100 SXM datasheet)' in text
  assert '![GPU benchmark](img/gpu.png)' in text
  assert '| `fast` | xla | forward+backward, bfloat16, batch 4 | met (least 4.00×' in (
      text)
  # Time cells carry the speed-up over the cuDNN layer.
  assert '| `fast` | xla | 0.125 ms (4.00×) | 0.25 ms (4.00×) |' in text
  assert '| `oom` | xla |' in text and 'out of memory |' in text
  assert '| `configs/listops/cst.py:cst` | xla | bfloat16 | 100.0 | 10 ms' in (
      text)
  assert '- layer `oom` xla, out of memory: test (4:bfloat16:fwd_bwd ' \
         'N=16384)' in text
  # The CPU has no peak: '—' where a peak is needed.
  cpu = device_report.markdown(device_report.derive(
      synthetic_report(device_kind='cpu')))
  assert 'Peaks (`lra_msmra/hardware.py`): bfloat16 —' in cpu
  doc = ('# Benchmarks\n\nintro\n\n## GPU\n\nNo GPU yet.\n\n'
         '## After\n\nkept\n')
  new = device_report.replace_section(doc, text)
  assert new.startswith('# Benchmarks\n\nintro\n\n## GPU\n')
  assert 'No GPU yet' not in new and new.endswith('\n## After\n\nkept\n')
  assert device_report.replace_section(new, text) == new  # Idempotent.
  last = device_report.replace_section('# B\n\n## GPU\n\nold\n', text)
  assert last == '# B\n\n' + text.rstrip('\n') + '\n'
  assert device_report.replace_section('# B\n', text) == (
      '# B\n\n' + text.rstrip('\n') + '\n')


def test_report_command_writes_docs(tmp_path):
  path = tmp_path / 'device.json'
  path.write_text(json.dumps(synthetic_report()))
  docs = tmp_path / 'docs' / 'benchmarks.md'
  docs.parent.mkdir()
  docs.write_text('# B\n\n## GPU\n\nold\n\n## Z\n')
  image = tmp_path / 'docs' / 'img' / 'gpu.png'
  image.parent.mkdir()
  proc = subprocess.run(
      [sys.executable, '-m', 'lra_msmra_tools.benchmark.device_report', '--json',
       str(path), '--docs', str(docs), '--image', str(image)],
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  text = docs.read_text()
  assert '![GPU benchmark](img/gpu.png)' in text and 'old' not in text
  assert text.endswith('\n## Z\n') and image.stat().st_size > 0


# -------------------------------------------------------------- pipeline


def run_device(out, *flags, timeout=600):
  proc = subprocess.run(
      [sys.executable, '-m', 'lra_msmra_tools.benchmark.device', '--out', str(out),
       *flags], cwd=helpers.ROOT, capture_output=True, text=True,
      timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(os.path.join(out, 'device.json')) as f:
    return json.load(f)


@pytest.fixture(scope='module')
def pipeline(tmp_path_factory):
  out = tmp_path_factory.mktemp('device')
  report = run_device(
      out, '--layers', 'softmax,cst', '--train', 'cst', '--implementations',
      'xla,cudnn', '--lengths', '64,128', '--settings', '2:float32:fwd_bwd',
      '--features', '32', '--heads', '2', '--train_dtypes', 'float32',
      '--train_length', '32', '--train_batch', '2', '--repeats', '3',
      '--warmup', '1', '--compile_threads', '2', '--budget_s', '400')
  return out, report


def test_pipeline_layers(pipeline):
  _, report = pipeline
  layers = {(r['variant'], r['implementation'], r['length']): r
            for r in report['records'] if r['kind'] == 'layer'}
  assert set(layers) == {(m, i, n) for m in ('softmax', 'cst')
                         for i in (('xla', 'cudnn') if m == 'softmax'
                                   else ('xla',)) for n in (64, 128)}
  for (m, impl, n), rec in layers.items():
    if impl == 'cudnn':  # float32: cuDNN's attention runs in 16 bits only.
      assert rec['status'] == 'not available' and 'bfloat16' in rec['reason']
      continue
    assert rec['status'] == 'ok', rec
    assert rec['time_s'] > 0 and len(rec['times_s']) == 3
    assert rec['flops'] > 0 and rec['compile_s'] > 0
    assert rec['xla_peak_bytes'] > 0
    expected = roofline.layer_bytes(
        batch=2, length=n, features=32, qkv_features=32, act_bytes=4,
        param_nbytes=rec['param_bytes'], mode='fwd_bwd')
    assert rec['bytes'] == expected['bytes']
    # No peak on the CPU: rates without utilisation.
    assert rec['tflops_per_s'] > 0 and rec['pct_peak_flops'] is None
  # Softmax's four 32 x 32 projections (no biases).
  assert layers[('softmax', 'xla', 64)]['param_bytes'] == 4 * 32 * 32 * 4
  assert layers[('cst', 'xla', 64)]['memory_over_reference'] > 0
  assert report['device']['platform'] == 'cpu'
  assert report['peaks'] == {'float32': None}
  assert [w['state'] for w in report['workers']] == ['done'] * 3


def test_pipeline_training_step(pipeline):
  _, report = pipeline
  (rec,) = [r for r in report['records'] if r['kind'] == 'train']
  assert rec['status'] == 'ok', rec
  assert rec['config'] == 'configs/listops/cst.py:cst'
  assert rec['batch'] == 2 and rec['length'] == 32
  assert rec['attention'] == 'cst' and rec['steps_per_s'] > 0
  assert rec['flops'] > 0 and rec['mfu_pct'] is None


def test_pipeline_outputs(pipeline):
  out, report = pipeline
  assert sorted(os.listdir(out)) == ['device.json', 'device.md',
                                     'device.png']
  text = (out / 'device.md').read_text()
  assert '### Time, forward+backward, float32, batch 2' in text
  assert '### Training steps' in text
  assert 'not available' in text
  assert report['command'].startswith('python -m lra_msmra_tools.benchmark.device')
  assert set(report['phases']) >= {'compile', 'end'}


def test_budget_leaves_points_not_run(tmp_path):
  # No time to compile: every point is recorded, none measured.
  report = run_device(tmp_path, '--layers', 'softmax', '--train', 'none',
                      '--implementations', 'xla', '--lengths', '64',
                      '--settings', '2:float32:fwd', '--features', '8',
                      '--heads', '2', '--budget_s', '30', '--reserve_s', '5',
                      '--compile_share', '0.001')
  (rec,) = report['records']
  assert rec['status'] == 'not run' and 'compile' in rec['reason']
  assert (tmp_path / 'device.md').exists()


# ----------------------------------------------------------------- shell


def run_script(*args, **env):
  clean = {k: v for k, v in os.environ.items()
           if k not in ('BUDGET_S', 'WHEELS', 'SITE', 'INSTALL_WHEELS',
                        'PYTHON', 'PYTHONPATH')}
  clean.update(env)
  return subprocess.run(['bash', SCRIPT, *args], cwd='/', env=clean,
                        capture_output=True, text=True, timeout=60)


def test_script_syntax_and_usage():
  syntax = subprocess.run(['bash', '-n', SCRIPT], capture_output=True,
                          text=True)
  assert syntax.returncode == 0, syntax.stderr
  proc = run_script('--help')
  assert proc.returncode == 0
  assert 'Usage: launch/gpu_benchmark.sh' in proc.stdout
  assert '--dry_run' in proc.stdout and 'device_report' in proc.stdout


def test_script_dry_run(tmp_path):
  wheels = tmp_path / 'wheels'
  wheels.mkdir()
  for name in ('a-1-py3-none-any.whl', 'b-2-py3-none-any.whl'):
    (wheels / name).write_text('')
  out = str(tmp_path / 'out dir')
  proc = run_script('--dry_run', out, '--', '--layers', 'softmax',
                    INSTALL_WHEELS='yes', WHEELS=str(wheels),
                    SITE='/tmp/site', BUDGET_S='300')
  assert proc.returncode == 0, proc.stderr
  pip, mkdir, sweep, bench = proc.stdout.splitlines()
  assert shlex.split(pip) == [
      'python3', '-m', 'pip', 'install', '-q', '--no-index', '--no-deps',
      '--no-compile', '--no-cache-dir', '--upgrade', '--target', '/tmp/site',
      str(wheels / 'a-1-py3-none-any.whl'),
      str(wheels / 'b-2-py3-none-any.whl')]
  assert shlex.split(mkdir) == ['mkdir', '-p', out]
  # The tile sweep first, installing its table for the benchmark.
  command, tee = sweep.split(' 2>&1 | ')
  assert shlex.split(tee) == ['tee', os.path.join(out, 'tile_sweep.log')]
  assert shlex.split(command)[-8:] == [
      'python3', '-m', 'lra_msmra_tools.benchmark.tile_sweep', '--out', out,
      '--install', '--budget_s', '120']
  command, tee = bench.split(' 2>&1 | ')
  assert shlex.split(tee) == ['tee', os.path.join(out, 'device.log')]
  assert shlex.split(command) == [
      'env', 'XLA_PYTHON_CLIENT_PREALLOCATE=false', 'PYTHONUNBUFFERED=1',
      f'PYTHONPATH=/tmp/site:{helpers.ROOT}', 'timeout', '--kill-after=20',
      '360', 'python3', '-m', 'lra_msmra_tools.benchmark.device', '--out', out,
      '--budget_s', '300', '--layers', 'softmax']
  # Without wheels to install and without the sweep: no pip, the default
  # budget.
  proc = run_script('--dry_run', out, INSTALL_WHEELS='no', TILE_SWEEP='no')
  lines = proc.stdout.splitlines()
  assert len(lines) == 2 and '--budget_s 440' in lines[1]


def test_script_errors(tmp_path):
  assert run_script('--dry_run').returncode == 2
  proc = run_script('--dry_run', 'out', INSTALL_WHEELS='yes',
                    WHEELS=str(tmp_path))
  assert proc.returncode == 2 and 'no wheels' in proc.stderr
  assert run_script('--dry_run', 'out', BUDGET_S='5m').returncode == 2
  assert run_script('--dry_run', 'out', TILE_BUDGET_S='2m').returncode == 2
  assert run_script('--dry_run', 'out', TILE_SWEEP='maybe').returncode == 2
  assert run_script('--dry_run', 'a', 'b').returncode == 2
  assert run_script('--dry_run', 'out', '--nope').returncode == 2
