"""Every config validates and its training and evaluation steps lower for TPU
and GPU, at `runlocal` size.

Each config file of every task folder, with the `runlocal` option, is first
validated as a run validates it (`lra_msmra.validation.trace`; the other
option strings are validated in tests/test_configs.py), which traces the
shapes of its train state once. Then the trainer's jitted `train_step`
(forward, loss, backward, optimizer update, state donated) and `eval_step`
(`lra_msmra.steps.jit_steps`), in float32 and bfloat16, over a
data-parallel mesh of 8 (fake CPU) devices, are lowered for TPU and GPU in
one multi-platform lowering (`.trace(...).lower(lowering_platforms=('tpu',
'cuda'))`, what `jit` does on those platforms): nothing is compiled or
allocated. A failure names the config, the dtype, the step, the platform and
the operation that has no lowering there. The same check at full size
through `jax.export.export`, with memory figures: `python -m
lra_msmra_tools.scaling` (docs/scaling.md).

Cost: tracing and lowering are single-threaded Python, about 4 s of CPU per
config (both dtypes, both steps; the bfloat16 program is traced and lowered
on its own, since a lowering rule may accept one dtype and not the other).
The work is spread over one worker process per available core (each with 8
fake devices from the environment conftest.py sets), a few configs per
worker at least, and starts as soon as the first test that needs it runs;
the full-size figures are one more job of the same pool, submitted first as
the longest one. The main process only collects the results.
"""

import concurrent.futures
import multiprocessing
import os

import jax
from jax.extend.core import Primitive
from jax.interpreters import mlir
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import sharding
from lra_msmra import validation
from lra_msmra_tools import scaling

# One test worker runs this file, so its module-scoped fixture is built
# once (pytest-xdist's `--dist loadgroup`, set in pytest.ini).
pytestmark = pytest.mark.xdist_group('export')

CONFIGS = scaling.config_files()
NAMES = [scaling.config_name(p) for p in CONFIGS]
LOWERING_TEST = 'test_train_and_eval_steps_lower_for_tpu_and_gpu'
FULL_SIZE_TEST = 'test_report_at_full_size_without_allocating'
FULL_SIZE = 'full size'  # The job key of the full-size figures.
# Each worker pays its start (importing JAX, the first traces): give each at
# least this many jobs.
JOBS_PER_WORKER = 4


def _cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not on Linux.
    return os.cpu_count() or 1


def check_lowering(path, options='runlocal', dtypes=('float32', 'bfloat16'),
                   platforms=scaling.PLATFORMS, devices=8):
  """Validates a config, then lowers its train and eval steps in every dtype
  for `platforms` (run in a worker).

  The config is first checked as a run checks it before it starts
  (`lra_msmra.validation.trace`, which traces the train state's shapes;
  they do not depend on the dtype, so this is the only trace of the
  state). Then, over a mesh of the first `devices` devices, with the
  trainer's CPU-only Threefry lowering registered (it must leave other
  platforms alone), each step is lowered. Returns one line per failure,
  naming the config, options, dtype, step, platform and the operation; []
  when the config is valid and everything lowers.
  """
  one_line = scaling._one_line  # pylint: disable=protected-access
  name = scaling.config_name(path) + (f':{options}' if options else '')
  if jax.device_count() < devices:
    return [f'{name}: {jax.device_count()} devices, {devices} needed '
            f'(XLA_FLAGS=--xla_force_host_platform_device_count={devices})']
  mesh = sharding.create_mesh(jax.devices()[:devices])
  try:
    _, abstract = validation.trace(scaling.load_config(path, options))
  except Exception as e:  # pylint: disable=broad-except
    return [f'{name} not valid: {type(e).__name__}: {one_line(str(e))}']
  failures = []
  for dtype in dtypes:
    try:
      config = scaling.load_config(path, options)
      config.model.dtype = dtype
      steps = scaling.build_steps(config, mesh, abstract)
    except Exception as e:  # pylint: disable=broad-except
      failures.append(f'{name} ({dtype}) not built: {type(e).__name__}: '
                      f'{one_line(str(e))}')
      continue
    for program in (steps.train, steps.eval):
      failures += [f'{name} ({dtype}) {line}'
                   for line in scaling.lowering_failures(program, platforms)]
  return failures


def full_size_figures():
  """The figures of `listops/transformer.py` at full size on 8 and 2 devices
  (run in a worker)."""
  config = scaling.load_config(os.path.join(scaling.CONFIG_ROOT, 'listops',
                                            'transformer.py'))
  on_8 = scaling.figures(config, sharding.create_mesh(jax.devices()[:8]),
                         'listops/transformer.py')
  on_2 = scaling.figures(config, sharding.create_mesh(jax.devices()[:2]),
                         platforms=())
  return on_8, on_2


@pytest.fixture(scope='module')
def jobs(request):
  """Job name -> future: the selected configs' lowering failures, and the
  full-size figures if their test is selected."""
  selected = [item for item in request.session.items
              if item.module is request.module]
  names = [FULL_SIZE] if any(getattr(item, 'originalname', None) ==
                             FULL_SIZE_TEST for item in selected) else []
  names += [item.callspec.params['path'] for item in selected
            if getattr(item, 'originalname', None) == LOWERING_TEST]
  workers = max(1, min(_cores(), -(-len(names) // JOBS_PER_WORKER)))
  with concurrent.futures.ProcessPoolExecutor(
      workers, mp_context=multiprocessing.get_context('spawn')) as pool:
    yield {name: pool.submit(full_size_figures) if name == FULL_SIZE else
           pool.submit(check_lowering, name) for name in names}


@pytest.fixture(scope='module')
def mesh():
  return sharding.create_mesh(jax.devices()[:8])


def test_every_task_and_mechanism_is_covered():
  tasks = {os.path.basename(os.path.dirname(p)) for p in CONFIGS}
  assert tasks == {'listops', 'text', 'retrieval', 'image', 'pathfinder',
                   'pathx'}
  from lra_msmra import attention  # pylint: disable=g-import-not-at-top
  names = {scaling.load_config(p).model.attention for p in CONFIGS}
  assert names == set(attention.REGISTRY)


# The export matrix: under the `slow` marker (pytest.ini).
@pytest.mark.slow
@pytest.mark.parametrize('path', CONFIGS, ids=NAMES)
def test_train_and_eval_steps_lower_for_tpu_and_gpu(path, jobs):
  failures = jobs[path].result()
  assert not failures, '\n'.join(failures)


def test_an_invalid_config_is_named_before_lowering():
  path = os.path.join(scaling.CONFIG_ROOT, 'pathx', 'transformer.py')
  failures = check_lowering(path, 'xiong')
  assert len(failures) == 1, failures
  assert failures[0].startswith(
      'pathx/transformer.py:xiong not valid: ValueError: '), failures


# A primitive with a CPU lowering only: what the test must catch.
_cpu_only_p = Primitive('cpu_only_op')
_cpu_only_p.def_abstract_eval(lambda x: x)
mlir.register_lowering(_cpu_only_p, lambda ctx, x: [x], platform='cpu')


def test_a_cpu_only_operation_is_named_with_its_platforms(mesh):
  rows = sharding.batch_sharding(mesh)
  fn = jax.jit(lambda x: _cpu_only_p.bind(x) * 2, in_shardings=rows,
               out_shardings=rows)
  x = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=rows)
  np.testing.assert_array_equal(fn(np.ones((8, 4), np.float32)), 2)
  program = scaling.Program('train_step', fn, (x,))
  for use_export in (False, True):
    assert scaling.lowering_failures(program, ('cpu',),
                                     use_export=use_export) == []
    failures = scaling.lowering_failures(program, use_export=use_export)
    assert [f.split(':')[0] for f in failures] == ['train_step on tpu',
                                                   'train_step on cuda']
    assert all('cpu_only_op' in f for f in failures), failures


def test_report_at_full_size_without_allocating(jobs):
  f, g = jobs[FULL_SIZE].result()
  assert f.failures == []
  assert f.params == 8_948_746  # The LRA Transformer (tests/test_configs.py).
  assert f.param_bytes == 4 * f.params
  # Adam's two moments plus its step count (and the schedule's).
  assert 2 * f.param_bytes <= f.opt_state_bytes < 2 * f.param_bytes + 64
  assert (f.length, f.batch_size, f.devices) == (2000, 32, 8)
  # One device's softmax scores: [32 / 8, 8 heads, N, N] with a CLS token.
  scores = 4 * 8 * 2001 ** 2 * 4
  assert f.largest_bytes == scores
  assert f.largest == 'float32[4, 8, 2001, 2001] (dot_general)'
  # Each of the 4 layers keeps at least its attention weights.
  assert f.activation_bytes > 4 * scores
  # Linear in the batch: 2 devices hold 4x what 8 do, the FLOPs are equal.
  assert g.train_flops == f.train_flops
  assert g.activation_bytes == pytest.approx(4 * f.activation_bytes,
                                             rel=0.01)
  table = scaling.markdown([f, ('x/y.py', 'ValueError: no')])
  assert '| `listops/transformer.py` | 2000 | 32 | 8,948,746 |' in table
  assert table.splitlines()[2].endswith('| yes |')
  assert '- `x/y.py`: ValueError: no' in table
