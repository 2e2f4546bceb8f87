"""Every config file loads, validates, names a registered attention, and keeps
the LRA parameter budget (docs/protocol.md §10.2, §11)."""

import glob
import os

import jax
import pytest

from lra_msmra import attention
from lra_msmra import config_lib
from lra_msmra import validation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# configs/common/ holds the settings a mechanism shares across tasks, no
# config files.
CONFIG_FILES = sorted(
    f for f in glob.glob(os.path.join(ROOT, 'configs', '*', '*.py'))
    if os.path.basename(f) != 'base.py'
    and os.path.basename(os.path.dirname(f)) != 'common')
IDS = [os.path.relpath(f, ROOT) for f in CONFIG_FILES]

# Parameters of the LRA Transformer of each task (docs/protocol.md §11).
LRA_BUDGET = {
    'listops': 8_948_746,
    'text': 3_486_722,
    'retrieval': 1_087_618,
    'image': 248_458,
    'pathfinder': 26_530,
    'pathx': 537_954,
}


def load(path, arg=None):
  module = config_lib.load_sibling(path, os.path.basename(path)[:-3])
  return module.get_config(arg)




def config_args(path):
  """Every combination of options the config's task base accepts."""
  base = config_lib.load_sibling(path, 'base')
  # `spt` (self-pretraining) is validated with runlocal for every config by
  # tests/test_pretraining.py, which also runs its steps.
  protocols = [p for p in base.OPTIONS if p not in ('runlocal', 'spt')]
  args = [None] + protocols
  if 'runlocal' in base.OPTIONS:
    args += ['runlocal'] + [f'{p},runlocal' for p in protocols]
  return args


# Validating traces the model (about a second each, most of this file's
# time), so each (file, options) pair is traced once: the default options
# here, together with the parameter budget, every other option string
# below, and `runlocal` in tests/test_export.py, which validates each
# config's runlocal form before lowering its steps.
CASES = [(p, a) for p in CONFIG_FILES for a in config_args(p)
         if a not in (None, 'runlocal')]


def check_loaded(config, arg):
  """Validates `config`; returns its abstract train state."""
  _, abstract = validation.trace(config)
  assert config.model.attention in attention.REGISTRY
  assert config.task in config_lib.TASKS
  protocols = config_lib.parse_arg(arg) & set(config_lib.PROTOCOLS)
  assert config.protocol == (protocols.pop() if protocols else 'lra')
  return abstract


@pytest.mark.parametrize('path,arg', CASES,
                         ids=[f'{os.path.relpath(p, ROOT)}:{a}' for p, a in CASES])
def test_config_loads_and_validates(path, arg):
  check_loaded(load(path, arg), arg)


@pytest.mark.parametrize('path', CONFIG_FILES, ids=IDS)
def test_lra_protocol_validates_within_parameter_budget(path):
  config = load(path)
  abstract = check_loaded(config, None)
  budget = LRA_BUDGET[config.task]
  n = sum(x.size for x in jax.tree_util.tree_leaves(abstract.params))
  if config.model.attention == 'softmax':
    assert n == budget
  assert n <= 1.1 * budget, f'{n} parameters > 110% of {budget}'


def test_unknown_option_is_an_error():
  with pytest.raises(ValueError, match='runlocal'):
    load(os.path.join(ROOT, 'configs', 'listops', 'transformer.py'),
         'runlcoal')
  with pytest.raises(ValueError, match='runlocal'):
    load(os.path.join(ROOT, 'configs', 'pathx', 'transformer.py'), 'xiong')
