"""Test-wide settings: 8 fake CPU devices and fast compiles.

XLA_FLAGS must be set before jax is imported anywhere, hence here.
"""

import atexit
import gc
import json
import os
import resource
import shutil
import tempfile

from tests import helpers  # Imports no JAX.

os.environ.setdefault('XLA_FLAGS', helpers.xla_flags(8))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# The tests run on the CPU. Saying so keeps JAX from looking for a TPU or a
# GPU when the optional compile packages (requirements-compile.txt: libtpu,
# the CUDA plugin) are installed, and is what their compile-only devices
# need (lra_msmra_tools.targets); several test processes may load libtpu.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
# XLA's cheapest optimisation level, in this process and every process the
# tests start: their programs are small, so compiling is nearly all of
# their time.
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')

# One on-disk JAX compilation cache per test session, shared by the test
# workers and every process the tests start (they inherit the environment):
# the command-line tests run the same small configs in many processes, and
# each program then compiles once. The process that creates the folder (the
# pytest process that starts the workers) removes it at exit, so every
# session starts empty and no result depends on an earlier run.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _cache = tempfile.mkdtemp(prefix='lra_msmra_tests_jax_cache_')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
# Every program, however quick to compile (JAX's default skips those under a
# second, which are nearly all of the tests' small programs): tests that
# build the same module at the same shapes, in any worker, compile it once.
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_threefry_partitionable', True)


# Workers for `-n auto` (pytest.ini): one per available core, at most 4. Each
# worker imports JAX with 8 fake devices and some tests start subprocesses, so
# more workers than cores only add memory.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
  del config
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # Not on Linux.
    cores = os.cpu_count() or 1
  return max(1, min(cores, MAX_WORKERS))


# Where the suite's time goes, in CPU seconds, which another load on the
# machine changes far less than wall time: `--cpu-times PATH` appends one
# JSON line per test phase, [test id, phase, seconds] (this process and the
# subprocesses it has waited for), from every worker. `python -m
# tests.cpu_times PATH` sums them per file and per test.
def pytest_addoption(parser):
  parser.addoption('--cpu-times', metavar='PATH', default=None,
                   help='append the CPU seconds of each test phase to PATH '
                   '(JSON lines; summary: python -m tests.cpu_times PATH)')


def _cpu_seconds() -> float:
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return (own.ru_utime + own.ru_stime + children.ru_utime +
          children.ru_stime)


def _timed_phase(item, phase):
  path = item.config.getoption('--cpu-times')
  if not path:
    yield
    return
  start = _cpu_seconds()
  yield
  with open(path, 'a') as f:  # One short append per line: workers share it.
    f.write(json.dumps([item.nodeid, phase,
                        round(_cpu_seconds() - start, 3)]) + '\n')


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
  yield from _timed_phase(item, 'setup')


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  yield from _timed_phase(item, 'call')


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
  yield from _timed_phase(item, 'teardown')


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
  """A test worker collects its garbage before it reports that it is done.

  After a worker's last test, pytest runs five full garbage collections
  (to find unraisable exceptions), each also freeing JAX's compiled
  programs; on a large heap and a busy machine they took more than the
  5 s that pytest-xdist's transport (execnet) waits before it interrupts
  the worker with SIGINT, which landed in JAX's gc callback and printed a
  `KeyboardInterrupt` warning after `[100%]`. Here, before the worker
  reports back (xdist sends `workerfinished` after every sessionfinish
  hook), one collection frees the garbage and `gc.freeze` leaves what
  remains out of pytest's later collections.
  """
  if hasattr(session.config, 'workerinput'):  # A pytest-xdist worker.
    gc.collect()
    gc.freeze()
