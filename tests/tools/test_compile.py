"""The compile targets and the compile command (lra_msmra_tools).

Parsing, the error lines and the report's pieces are plain Python. The
compile-only devices need the optional compile packages
(requirements-compile.txt); without them those tests skip and say so.
tests/conftest.py sets JAX_PLATFORMS=cpu for every test process, which is
what the compile-only devices need, so the device tests run in this
process. The compiles run the command itself in a subprocess, as a user runs
it (their environment without the tests' CPU compile settings), with
`runlocal` shapes:

* `configs/listops/cst.py:runlocal` for a v5e 2x2 slice and 8 H200s in one
  command: both steps compile, memory figures present, fits (about 1 min of
  CPU for the TPU cell, 20 s for the GPU one);
* the same on one H100 at a global batch of 262,144: does NOT fit, exit
  status 3 with --require_fit, and the bisection finds a batch that
  compiles and fits (about 1 min of CPU);
* the errors (target, missing package, config) without compiling.
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
import types

import pytest

from lra_msmra import hardware
from lra_msmra_tools import compile as compile_lib
from lra_msmra_tools import fits
from lra_msmra_tools import targets
from tests import helpers

ROOT = helpers.ROOT



def _installed(target):
  try:
    targets.parse(target).check_packages()
    return True
  except targets.MissingPackage:
    return False


HAS_LIBTPU = _installed('v5e-4')
HAS_CUDA = _installed('h100')


def _needs(installed, reason):
  """Marks a test `extras` (pytest.ini) and skips it, naming `reason`,
  where its package is not installed."""
  def mark(test):
    return pytest.mark.extras(pytest.mark.skipif(not installed,
                                                 reason=reason)(test))
  return mark


NEEDS_TPU = _needs(HAS_LIBTPU, 'libtpu not installed: pip install -r '
                   'requirements-compile.txt for the TPU compile tests')
NEEDS_GPU = _needs(HAS_CUDA, 'the CUDA plugin is not installed: pip install '
                   '-r requirements-compile.txt for the GPU compile tests')


# ---------------------------------------------------------------- targets


@pytest.mark.parametrize('name, canonical, platform, chip, hosts, devices', [
    ('v5e:2x2', 'v5e:2x2', 'tpu', 'v5e', 1, 4),
    ('v5e-4', 'v5e:2x2', 'tpu', 'v5e', 1, 4),
    ('v5litepod-8', 'v5e:2x4', 'tpu', 'v5e', 1, 8),
    ('v5e-1', 'v5e:1x1', 'tpu', 'v5e', 1, 1),
    ('v5e:16x16', 'v5e:16x16', 'tpu', 'v5e', 64, 256),
    ('v6e:2x2', 'v6e:2x2', 'tpu', 'v6e', 1, 4),
    ('v6e-32', 'v6e:4x8', 'tpu', 'v6e', 8, 32),
    ('v4:2x2x1', 'v4:2x2x1', 'tpu', 'v4', 1, 4),
    ('v4-8', 'v4:2x2x1', 'tpu', 'v4', 1, 4),
    ('v4-32', 'v4:2x2x4', 'tpu', 'v4', 4, 16),
    ('v4:4x4x4', 'v4:4x4x4', 'tpu', 'v4', 16, 64),
    ('v4-128', 'v4:4x4x4', 'tpu', 'v4', 16, 64),
    ('v5p-8', 'v5p:2x2x1', 'tpu', 'v5p', 1, 4),
    ('v5p:2x2x1', 'v5p:2x2x1', 'tpu', 'v5p', 1, 4),
    ('h100', 'h100', 'cuda', 'h100', 1, 1),
    ('h100:8', 'h100:8', 'cuda', 'h100', 1, 8),
    ('H200:2x8', 'h200:2x8', 'cuda', 'h200', 2, 16),
    ('h200:4', 'h200:4', 'cuda', 'h200', 1, 4),
])
def test_target_names(name, canonical, platform, chip, hosts, devices):
  t = targets.parse(name)
  assert (t.name, t.platform, t.chip, t.num_hosts, t.num_devices) == (
      canonical, platform, chip, hosts, devices)
  assert t.label == (name.strip() if name.lower() != canonical else canonical)
  # One table of peaks: lra_msmra.hardware's.
  bf16 = hardware.peak(t.device_kind, 'bfloat16')
  f32 = hardware.peak(t.device_kind, 'float32')
  assert (t.peak_bf16_flops, t.peak_f32_flops, t.hbm_bytes_per_s) == (
      bf16.flops_per_s, f32.flops_per_s, bf16.bytes_per_s)
  assert t.peak_flops('bfloat16') == bf16.flops_per_s
  assert t.peak_flops('float32') == f32.flops_per_s
  assert (t.vmem_bytes is not None) == (platform == 'tpu')


def test_memory_per_device():
  gib = 1 << 30
  assert targets.parse('v5e-4').hbm_bytes == 16 * gib
  assert targets.parse('v4-8').hbm_bytes == 32 * gib
  assert targets.parse('v5p-8').hbm_bytes == 95 * gib
  assert targets.parse('v6e:2x2').hbm_bytes == 32 * gib
  # What the driver reports, a little under the marketed size.
  assert 79 * gib < targets.parse('h100:8').hbm_bytes < 80 * gib
  assert 140 * gib < targets.parse('h200:8').hbm_bytes < 141 * gib


def test_vmem_agrees_with_jax():
  pltpu = pytest.importorskip('jax.experimental.pallas.tpu')
  if not hasattr(pltpu, 'get_tpu_info_for_chip'):
    pytest.skip('this JAX has no pallas.tpu.get_tpu_info_for_chip')
  for chip, facts in targets.TPU_CHIPS.items():
    info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(chip),
                                       2 if facts.megacore else 1)
    assert facts.vmem_bytes == info.vmem_capacity_bytes, chip


@pytest.mark.parametrize('name, problem', [
    ('v7:2x2', "unknown chip 'v7'"),
    ('a100:8', "unknown chip 'a100'"),
    ('', "unknown chip ''"),
    ('v4:2x2', 'v4 slices have 3 axes (v4:2x2x1), not 2'),
    ('v5e:2x2x1', 'v5e slices have 2 axes (v5e:2x2), not 3'),
    ('v5e:3x3', 'a v5e slice of several hosts (2x2 chips each) needs its '
     'first two axes even'),
    ('v5e:0x2', 'every axis needs at least one chip'),
    ('v4-6', 'v4-N counts TensorCores (two per chip)'),
    ('v5p-4', 'v5p-N counts TensorCores (two per chip)'),
    ('v5e-2', 'v5e-N counts chips'),
    ('h100:9', 'a host holds 1 to 8 GPUs'),
    ('h100:0', 'a host holds 1 to 8 GPUs'),
    ('h200:2x', 'not a GPU count (h100:8) or hosts x GPUs (h200:2x8)'),
    ('v5e', 'not a slice shape'),
])
def test_wrong_target_is_one_line_with_the_valid_forms(name, problem):
  with pytest.raises(ValueError) as e:
    targets.parse(name)
  text = str(e.value)
  assert '\n' not in text
  assert text.startswith(f'target {name!r}: {problem}')
  assert 'valid: TPU slices CHIP:TOPOLOGY' in text
  assert 'v5e-4' in text and 'h200:2x8' in text


@pytest.mark.parametrize('name, package', [('v5e-4', 'libtpu'),
                                           ('h100:8', 'CUDA plugin')])
def test_missing_package_is_one_line(monkeypatch, name, package):
  real = importlib.util.find_spec

  def find_spec(module, *args):
    if module in ('libtpu', 'jax_plugins.xla_cuda12', 'jax_cuda12_plugin'):
      return None
    return real(module, *args)

  monkeypatch.setattr(targets.importlib.util, 'find_spec', find_spec)
  t = targets.parse(name)
  with pytest.raises(targets.MissingPackage) as e:
    t.check_packages()
  text = str(e.value)
  assert '\n' not in text and package in text
  assert 'pip install -r requirements-compile.txt' in text
  assert 'pip install -e .[compile]' in text
  with pytest.raises(targets.MissingPackage):
    targets._devices(t)  # pylint: disable=protected-access


def test_gpu_target_description_is_our_own():
  text = targets.gpu_target_config('h200')
  assert 'core_count: 132' in text
  assert f'shared_memory_per_block_optin: {227 * 1024}' in text
  assert f'shared_memory_per_core: {228 * 1024}' in text
  assert 'registers_per_core_limit: 65536' in text
  assert 'memory_bandwidth: 4800000000000' in text
  assert f'device_memory_size: {143771 << 20}' in text
  assert 'cuda_compute_capability { major: 9 minor: 0 }' in text
  assert 'device_description_str: "NVIDIA H200"' in text
  # jaxlib 0.10.2 rejects it.
  assert 'collective_memory_granularity' not in text
  assert 'memory_bandwidth: 3350000000000' in targets.gpu_target_config(
      'h100')


def test_compiler_options():
  assert targets.parse('v5e-4').compiler_options() is None
  assert targets.parse('h100:8').compiler_options() == {
      'xla_gpu_enable_triton_gemm': False,
      'xla_gpu_fail_ptx_compilation_on_register_spilling': True}
  assert not targets.parse('h200').compiler_options(spill_check=False)[
      'xla_gpu_fail_ptx_compilation_on_register_spilling']


@NEEDS_GPU
@pytest.mark.parametrize('name, kind, devices, hosts', [
    ('h200:8', 'NVIDIA H200', 8, 1),
    ('h100', 'NVIDIA H100 80GB HBM3', 1, 1),
    ('h100:2x8', 'NVIDIA H100 80GB HBM3', 16, 2),
])
def test_gpu_devices(name, kind, devices, hosts):
  found = targets.parse(name).devices()
  assert len(found) == devices
  assert {d.device_kind for d in found} == {kind}
  assert len({d.process_index for d in found}) == hosts
  assert hardware.peak(kind) is not None


@NEEDS_TPU
@pytest.mark.parametrize('name, kind', [
    ('v5e-4', 'TPU v5 lite'), ('v5e-8', 'TPU v5 lite'),
    ('v5e:4x4', 'TPU v5 lite'), ('v4-8', 'TPU v4'), ('v4:2x2x2', 'TPU v4'),
    ('v5p-8', 'TPU v5'), ('v6e:2x2', 'TPU v6 lite'), ('v5e-1', 'TPU v5 lite'),
])
def test_tpu_devices(name, kind):
  t = targets.parse(name)
  found = t.devices()
  # One device per chip (v4 and v5p in megacore mode, as on Cloud TPU VMs).
  assert len(found) == t.num_devices
  assert {d.device_kind for d in found} == {kind}
  assert len({d.process_index for d in found}) == t.num_hosts
  assert hardware.peak(kind) == hardware.peak(t.device_kind)


def _run_python(code, env=None):
  return subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                        capture_output=True, text=True, env=env,
                        check=False, timeout=300)


def test_importing_the_tools_imports_no_jax():
  run = _run_python('import sys, lra_msmra_tools, lra_msmra_tools.targets, '
                    'lra_msmra_tools.compile as c\n'
                    "print('jax' in sys.modules)\n")
  assert run.returncode == 0, run.stderr
  assert run.stdout.strip() == 'False'


def test_prepare_environment_refuses_jax_started_for_another_platform():
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  run = _run_python('import jax\n'
                    'from lra_msmra_tools import targets\n'
                    'try:\n'
                    '  targets.prepare_environment()\n'
                    'except RuntimeError as e:\n'
                    '  print(e)\n', env=env)
  assert run.returncode == 0, run.stderr
  line = run.stdout.strip()
  assert '\n' not in line
  assert line.startswith('JAX was imported before lra_msmra_tools.targets.'
                         'prepare_environment() without JAX_PLATFORMS=cpu')
  run = _run_python(
      'import os\n'
      "os.environ['XLA_FLAGS'] = '--xla_foo=1'\n"
      'from lra_msmra_tools import targets\n'
      'targets.prepare_environment()\n'
      'targets.prepare_environment()\n'
      'import jax\n'
      "print(os.environ['JAX_PLATFORMS'], "
      "os.environ['ALLOW_MULTIPLE_LIBTPU_LOAD'], os.environ['XLA_FLAGS'])\n",
      env=env)
  assert run.returncode == 0, run.stderr
  assert run.stdout.split() == [
      'cpu', '1', '--xla_foo=1',
      '--xla_gpu_fail_ptx_compilation_on_register_spilling=true']


def test_the_library_imports_no_tool():
  for folder, _, files in os.walk(os.path.join(ROOT, 'lra_msmra')):
    for name in files:
      if not name.endswith('.py'):
        continue
      path = os.path.join(folder, name)
      with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
      for node in ast.walk(tree):
        if isinstance(node, ast.Import):
          names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
          names = [node.module or '']
        else:
          continue
        assert not any(n.split('.')[0] == 'lra_msmra_tools' for n in names), (
            f'{os.path.relpath(path, ROOT)} imports {names}')


# ------------------------------------------------------ the batch search


def _affine(fixed, per_example):
  calls = []

  def measure(b):
    calls.append(b)
    return int(fixed + per_example * b)
  return measure, calls


@pytest.mark.parametrize('fixed, per_example, limit, start, unit', [
    (1e6, 1e5, 8e9, 4, 1),
    (1e9, 3e7, 15e9, 32, 1),
    (1e9, 3e8, 15e9, 64, 4),  # Gradient accumulation: multiples of 4.
    (2e9, 1e9, 15e9, 64, 1),  # The config's batch does not fit.
])
def test_search_finds_the_largest_fitting_batch(fixed, per_example, limit,
                                                start, unit):
  measure, calls = _affine(fixed, per_example)
  found = compile_lib.search_batch(measure, start, measure(start),
                                   int(limit), unit, budget=4,
                                   fixed_bytes=int(fixed))
  best = int((limit - fixed) // per_example) // unit * unit
  assert found.exact
  assert found.largest_fit == best
  assert found.smallest_no_fit == best + unit
  assert found.compiles == len(calls) - 1 <= 3
  assert all(b % unit == 0 for b in calls)


def test_search_on_tpu_like_refusals_keeps_a_fitting_batch():
  # The compiler rematerialises, then refuses above 300: not affine.
  def measure(b):
    return None if b > 300 else int(1e9 + 5e6 * b)
  found = compile_lib.search_batch(measure, 8, measure(8), int(15e9), 1,
                                   budget=3, fixed_bytes=int(1e9))
  assert not found.exact
  assert measure(found.largest_fit) is not None
  assert found.smallest_no_fit > 300
  assert compile_lib.largest_batch_text(
      {'search': vars(found)}).startswith(f'≥ {found.largest_fit} (<')
  found = compile_lib.search_batch(measure, 8, measure(8), int(15e9), 1,
                                   budget=16, fixed_bytes=int(1e9))
  assert (found.largest_fit, found.smallest_no_fit, found.exact) == (
      300, 301, True)


def test_search_when_nothing_fits():
  measure = lambda b: int(5e9 + 2e9 * b)
  found = compile_lib.search_batch(measure, 8, measure(8), int(4e9), 1,
                                   budget=4, fixed_bytes=int(5e9))
  assert found.largest_fit is None and found.smallest_no_fit == 1
  assert found.exact


# ------------------------------------------------------------ the report


def test_ptxas_output_is_read_per_kernel():
  text = '\n'.join([
      "ptxas info    : Compiling entry function 'flash_window_dq' for "
      "'sm_90a'",
      'ptxas info    : Function properties for flash_window_dq',
      '    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads',
      'ptxas info    : Used 56 registers, used 1 barriers',
      "ptxas info    : Compiling entry function 'fusion_3' for 'sm_90a'",
      'ptxas info    : Function properties for fusion_3',
      '    48 bytes stack frame, 44 bytes spill stores, 40 bytes spill loads',
      'ptxas info    : Used 255 registers'])
  assert compile_lib.parse_ptxas(text) == {
      'flash_window_dq': {'spill_stores': 0, 'spill_loads': 0,
                          'registers': 56},
      'fusion_3': {'spill_stores': 44, 'spill_loads': 40, 'registers': 255}}


def test_out_of_memory_lines():
  text = ('RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory '
          'required for HLO temporaries (82.68G) exceeds available HBM '
          '(15.75G).')
  assert compile_lib.is_out_of_memory(text)
  assert compile_lib.parse_oom(text) == int(82.68 * (1 << 30))
  assert not compile_lib.is_out_of_memory('INTERNAL: Mosaic failed')
  line = compile_lib.failure_line(RuntimeError(
      'CANCELLED: Compilation result discarded due to register spilling'))
  assert line.startswith('a kernel spills registers (compile fails under '
                         '--xla_gpu_fail_ptx_compilation_on_register_'
                         'spilling=true)')


def test_a_refused_step_keeps_its_compile_time(monkeypatch):
  """A step the TPU compiler refuses as too big still took compile time,
  and the cell's compile time counts it."""
  text = ('RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory '
          'required for HLO temporaries (72.11G) exceeds available HBM '
          '(15.75G).')

  def refuse(*args, **kwargs):
    del args, kwargs
    time.sleep(0.05)
    raise RuntimeError(text)

  monkeypatch.setattr(compile_lib, 'compile_once', refuse)
  program = types.SimpleNamespace(fn=None, args=(), name='train_step')
  step = compile_lib.compile_step(program, targets.parse('v5e-4'),
                                  kernel_stats=False)
  assert step['oom'] and step['total'] == int(72.11 * (1 << 30))
  assert step['seconds_total'] >= 0.05
  assert step['failures'] == [] and 'seconds' not in step


def test_step_time_is_an_estimate_or_a_lower_bound():
  tpu = {'step_s': 0.0134, 'compute_s': 4.5e-5, 'memory_s': 0.0134}
  gpu = {'step_s': 9.06e-6, 'compute_s': 9.06e-6, 'memory_s': None}
  assert compile_lib.step_text(tpu) == '~13.4 ms'
  assert compile_lib.step_text(tpu, long=True) == '~13.4 ms (memory)'
  assert compile_lib.step_text(gpu) == '≥ 9.06 µs'
  assert compile_lib.step_text(gpu, long=True) == '≥ 9.06 µs (FLOPs only)'


def test_fits_cells_are_cached_and_resumed(tmp_path):
  """A cell already in the cache is not compiled again; its text is in the
  section, the rest of the table is left out and counted."""
  settings = {'dtype': None, 'implementation': None, 'max_batch_search': 1,
              'usable': 0.9}
  cell = {'config': 'listops/cst.py', 'target': 'h100:8', 'label': 'h100:8',
          'batch_size': 32, 'per_device_batch': 4, 'hbm_bytes': 1 << 36,
          'usable_bytes': 1 << 35, 'failures': [], 'notes': [],
          'peak_bytes': 3 << 30, 'fits': True, 'compile_seconds': 41.7,
          'estimate': {'step_s': 2.5e-3, 'compute_s': 2.5e-3,
                       'memory_s': 1e-3},
          'search': {'largest_fit': 37, 'smallest_no_fit': 38, 'exact': True}}
  cache = tmp_path / 'cache.json'
  key = fits.cell_key('listops/cst.py', 'h100:8', settings)
  cache.write_text(json.dumps({key: cell}))
  out = tmp_path / 'fits.md'
  run = subprocess.run(
      [sys.executable, '-m', 'lra_msmra_tools.fits',
       '--tasks', 'listops', '--mechanisms', 'cst', '--columns', 'h100:8',
       '--max_batch_search', '1', '--cache', str(cache), '--out', str(out)],
      cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
      env=_user_env())
  assert run.returncode == 0, run.stderr
  assert '1 of 1 cells in' in run.stderr and 'compiling 0' in run.stderr
  text = out.read_text()
  assert text.startswith('## Where it fits\n')
  assert '1 of 1 cells compiled' in text
  assert ('| `listops/cst.py` (32) | 3,072 MiB, fits · batch ≤ 37 · '
          '~2.5 ms · 42 s |') in text
  assert '| config (global batch) | 8×H100 |' in text
  assert json.loads((tmp_path / 'fits.json').read_text())[0]['fits'] is True


def test_fits_section_goes_between_the_markers(tmp_path):
  doc = tmp_path / 'doc.md'
  doc.write_text(f'# Doc\n\nbefore\n{fits.START}\nold\n{fits.END}\nafter\n')
  fits.replace_in_doc(str(doc), '## Where it fits\n\nnew')
  assert doc.read_text() == (f'# Doc\n\nbefore\n{fits.START}\n## Where it '
                             f'fits\n\nnew\n{fits.END}\nafter\n')


def test_docs_scaling_has_the_markers():
  with open(os.path.join(ROOT, 'docs', 'scaling.md'), encoding='utf-8') as f:
    text = f.read()
  assert text.count(fits.START) == 1 and text.count(fits.END) == 1
  assert text.index(fits.START) < text.index(fits.END)


# ----------------------------------------------------------- the command


def _user_env():
  """The user's environment: no fake devices, fast-compile settings or
  shared compilation cache of the tests."""
  env = helpers.user_env()
  for key in ('JAX_COMPILATION_CACHE_DIR',
              'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', 'JAX_PLATFORMS'):
    env.pop(key, None)
  return env


def _compile(*args, timeout=900):
  return subprocess.run(
      [sys.executable, '-m', 'lra_msmra_tools.compile', *args], cwd=ROOT,
      capture_output=True, text=True, check=False, timeout=timeout,
      env=_user_env())


def _error_line(run):
  lines = [l for l in run.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, run.stderr
  assert lines[0].startswith('error: ')
  return lines[0]


def test_wrong_target_is_one_line_from_the_command():
  run = _compile('--config', 'configs/listops/cst.py:runlocal', '--target',
                 'v5e:2x2', '--target', 'v9:2x2', timeout=300)
  assert run.returncode == 1
  assert _error_line(run).startswith("error: target 'v9:2x2': unknown chip")


def test_missing_package_is_one_line_from_the_command():
  code = ('import importlib.util as u, runpy, sys\n'
          'real = u.find_spec\n'
          "u.find_spec = lambda n, *a: None if n == 'libtpu' else real(n, *a)\n"
          "sys.argv = ['compile', '--config', "
          "'configs/listops/cst.py:runlocal', '--target', 'v5e-4']\n"
          "runpy.run_module('lra_msmra_tools.compile', run_name='__main__')\n")
  run = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                       capture_output=True, text=True, check=False,
                       timeout=300, env=_user_env())
  assert run.returncode == 1
  assert _error_line(run) == (
      'error: target v5e-4 needs libtpu (jax[tpu]), which is not installed: '
      'pip install -r requirements-compile.txt (or pip install -e '
      '.[compile]).')


def test_bad_config_override_is_one_line():
  run = _compile('--config', 'configs/listops/cst.py:runlocal', '--target',
                 'h100', '--config.no_such_key=1', timeout=300)
  assert run.returncode == 1
  assert 'no_such_key' in _error_line(run)


def test_fits_table_flag_names_its_own_command():
  run = _compile('--fits_table', timeout=300)
  assert run.returncode == 1
  assert 'python -m lra_msmra_tools.fits' in _error_line(run)


def test_fits_command_refuses_an_unknown_task_in_one_line():
  run = subprocess.run(
      [sys.executable, '-m', 'lra_msmra_tools.fits', '--tasks', 'listops,cifar',
       '--cached_only'], cwd=ROOT, capture_output=True, text=True,
      check=False, timeout=300, env=_user_env())
  assert run.returncode == 1
  assert _error_line(run).startswith("error: --tasks: unknown ['cifar']")


@pytest.fixture(scope='module')
def runlocal(tmp_path_factory):
  """cst:runlocal compiled for a v5e 2x2 slice and 8 H200s (one command)."""
  if not (HAS_LIBTPU and HAS_CUDA):
    pytest.skip('needs libtpu and the CUDA plugin: pip install -r '
                'requirements-compile.txt')
  out = tmp_path_factory.mktemp('compile') / 'report.md'
  run = _compile('--config', 'configs/listops/cst.py:runlocal', '--target',
                 'v5e:2x2', '--target', 'h200:8', '--max_batch_search', '0',
                 '--jobs', '1', '--out', str(out))
  assert run.returncode == 0, run.stderr[-3000:]
  with open(str(out)[:-3] + '.json', encoding='utf-8') as f:
    return run, out.read_text(), {r['target']: r for r in json.load(f)}


@pytest.mark.parametrize('target, devices', [('v5e:2x2', 4), ('h200:8', 8)])
@pytest.mark.slow  # The fixture's compile takes about two minutes.
@pytest.mark.extras
def test_runlocal_compiles_and_fits(runlocal, target, devices):
  _, _, results = runlocal
  r = results[target]
  assert not r.get('error') and r['failures'] == [], r
  assert r['devices'] == devices and r['batch_size'] == 32
  assert r['per_device_batch'] == 32 // devices
  assert r['fits'] is True
  for step in ('train', 'eval'):
    memory = r[step]
    assert memory['total'] > 0 and memory['argument'] > 0
    assert memory['total'] <= r['hbm_bytes']
  # The donated state is aliased to the new state.
  assert r['train']['alias'] > 0.9 * r['state_bytes']
  assert r['train']['temp'] > 0
  assert r['flops'] > 0 and r['flops_per_device'] == r['flops'] / devices
  assert r['estimate']['step_s'] > 0
  if r['platform'] == 'tpu':
    assert r['estimate']['bytes_accessed'] > 0
    assert r['train']['generated_code'] > 0


@pytest.mark.slow
@pytest.mark.extras
def test_runlocal_table(runlocal):
  run, text, _ = runlocal
  assert text.strip() == run.stdout.strip()
  assert text.startswith('`python -m lra_msmra_tools.compile --config '
                         'configs/listops/cst.py:runlocal --target v5e:2x2 '
                         '--target h200:8 --max_batch_search 0`')
  assert 'largest batch / device (bisection)' in text
  assert 'step time (roofline ESTIMATE)' in text
  rows = [l for l in text.splitlines()
          if l.startswith('| `configs/listops/cst.py:runlocal`')]
  assert len(rows) == 2
  assert all('| fits |' in l for l in rows)


@NEEDS_GPU
def test_over_memory_on_a_gpu_does_not_fit(tmp_path):
  """XLA compiles any size for a GPU: the command compares with the GPU's
  memory itself, and the bisection ends on a batch that compiled and fits."""
  out = tmp_path / 'over.md'
  run = _compile('--config', 'configs/listops/cst.py:runlocal', '--target',
                 'h100', '--config.batch_size=262144', '--max_batch_search',
                 '2', '--require_fit', '--out', str(out))
  assert run.returncode == 3, run.stderr[-3000:]
  lines = [l for l in run.stderr.splitlines() if 'does NOT fit:' in l]
  assert len(lines) == 1
  assert lines[0].startswith('configs/listops/cst.py:runlocal '
                             '--config.batch_size=262144 on h100 does NOT '
                             'fit: ')
  assert 'MiB usable of 81,559 MiB' in lines[0]
  (r,) = json.loads((tmp_path / 'over.json').read_text())
  assert r['fits'] is False
  assert r['train']['total'] > 0.9 * r['hbm_bytes']
  search = r['search']
  assert search['compiles'] <= 2
  assert search['largest_fit'] is not None
  fitting = dict(search['points'])[search['largest_fit']]
  assert fitting <= r['usable_bytes']
  assert '| does NOT fit |' in out.read_text()
