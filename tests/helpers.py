"""Tiny configs shared by the trainer tests."""

import importlib.util
import os

from lra_msmra import config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# XLA CPU settings for the tests' many small programs, whose time is nearly
# all compilation: one LLVM module per program (not split for parallel code
# generation) and the loop emitters instead of the fusion emitters. Under
# `JAX_DISABLE_MOST_OPTIMIZATIONS=1` (tests/conftest.py sets both for the
# test processes and every process they start) the training step of
# tests/configs/tiny_listops.py compiles in about a third of the CPU time
# (1.2 against 3.7 s). They change how XLA generates code, not the
# operations it runs. The checks of the user's command with the user's
# settings (tests/test_runlocal.py, tests/test_reproducibility.py) leave both
# out (`user_env`).
FAST_COMPILE_XLA_FLAGS = ('--xla_cpu_parallel_codegen_split_count=1 '
                          '--xla_cpu_use_fusion_emitters=false')


# The optional compile packages (requirements-compile.txt): the compile
# matrices of tests/kernels/test_compile.py and tests/tools skip without them.
COMPILE_EXTRAS_MISSING = (importlib.util.find_spec('libtpu') is None
                          or importlib.util.find_spec('jax_cuda12_plugin')
                          is None)
COMPILE_EXTRAS_REASON = ('the compile extras are not installed '
                         '(pip install -r requirements-compile.txt)')

# The optional TensorFlow and TFDS packages (requirements-tfds.txt): the
# tests that compare with TensorFlow's PNG decoder and TFDS's own code, or
# read through `tfds.load`, skip without them (and are marked `extras`).
TFDS_EXTRA_MISSING = (importlib.util.find_spec('tensorflow') is None
                      or importlib.util.find_spec('tensorflow_datasets')
                      is None)
TFDS_EXTRA_REASON = ('the tfds extra (TensorFlow, TFDS) is not installed '
                     '(pip install -e .[tfds] or pip install -r '
                     'requirements-tfds.txt)')


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a test process with `devices` fake CPU devices."""
  return (f'--xla_force_host_platform_device_count={devices} '
          f'{FAST_COMPILE_XLA_FLAGS}')


def user_env() -> dict[str, str]:
  """This process's environment without the tests' XLA settings (fake
  devices, fast compiles), for a command run as a user runs it; TensorFlow's
  C++ logging stays quiet."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('XLA_FLAGS', 'JAX_DISABLE_MOST_OPTIMIZATIONS')}
  env['TF_CPP_MIN_LOG_LEVEL'] = '3'
  return env


def load_config(relpath, arg=None):
  path = os.path.join(ROOT, relpath)
  module = config_lib.load_sibling(path, os.path.basename(path)[:-3])
  return module.get_config(arg)


def mechanism_case(name, task='listops'):
  """How a test runs registered mechanism `name` on `task`: (config file,
  command-line overrides). Its task file when it has one (the file of the
  registry name or of its alias: softmax's is transformer.py); otherwise
  the task's base config with `--config.model.attention=NAME`, its knobs
  at their defaults, the route a new mechanism takes before it has config
  files (docs/adding_a_mechanism.md)."""
  path = f'configs/{task}/{config_lib.CONFIG_ALIASES.get(name, name)}.py'
  if os.path.exists(os.path.join(ROOT, path)):
    return path, ()
  return f'configs/{task}/base.py', (f'--config.model.attention={name}',)


def tiny_listops_config(**overrides):
  """ListOps runlocal shrunk to seconds (tests/configs/tiny_listops.py)."""
  c = load_config('tests/configs/tiny_listops.py')
  for key, value in overrides.items():
    target = c
    *path, last = key.split('.')
    for p in path:
      target = target[p]
    target[last] = value
  return c
