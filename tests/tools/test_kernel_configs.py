"""The kernel sweep's task-config cases (`kernels --configs`) are the layers
the models run.

`config_case` reads a task config and builds the one-layer case the
deviceless compile checks. These tests build each model the way
validation does and catch its attention layer's call
(`flax.linen.intercept_methods`): the case must have that layer's input
shape, heads, head dim, knobs, dtype, dropout and form, and `--configs all`
must hold the layer of every task config whose mechanism has a Pallas
implementation (and of its options).
The compiles themselves are in tests/kernels/test_compile.py (-m extras).
"""

import dataclasses
import glob
import os

import flax.linen as nn
import pytest

from lra_msmra import attention
from lra_msmra import validation
from lra_msmra_tools import fits
from lra_msmra_tools import kernels
from tests import helpers


def _pallas_configs_on_disk():
  """`task/x.py` of every task config file whose mechanism has 'pallas'."""
  found = []
  for task in fits.TASKS:
    for path in sorted(glob.glob(os.path.join(helpers.ROOT, 'configs', task,
                                              '*.py'))):
      if os.path.basename(path) == 'base.py':
        continue
      label = f'{task}/{os.path.basename(path)}'
      mechanism = kernels._load_config(label).model.attention  # pylint: disable=protected-access
      if 'pallas' in attention.REGISTRY[mechanism].IMPLEMENTATIONS:
        found.append(label)
  return found


def test_configs_all_has_every_task_config_with_a_pallas_mechanism():
  labels = kernels.task_configs()
  layers = [kernels.layer_of(kernels.config_case(label, ''))
            for label in labels]
  assert len(set(layers)) == len(layers), 'a layer listed twice'
  for label in _pallas_configs_on_disk():  # Each, or a layer like its own.
    assert kernels.layer_of(kernels.config_case(label, '')) in layers, label
  # With the options that change the layer, e.g. Transformer-LS's "best"
  # (w, r) of Xiong et al.: (1, 1) for Text.
  assert 'text/long_short.py:xiong,best' in labels
  case = kernels.config_case('text/long_short.py:xiong,best', '')
  assert kernels._variant(case.variant)[1] == {  # pylint: disable=protected-access
      'window_size': 1, 'num_landmarks': 1}
  mechanisms = {kernels._variant(label)[0] for label in labels}  # pylint: disable=protected-access
  assert mechanisms == {'cst', 'long_short', 'adamra', 'combiner'}


@pytest.mark.parametrize('label', kernels.task_configs())
def test_config_case_is_the_layer_the_model_runs(label):
  config = kernels._load_config(label)  # pylint: disable=protected-access
  layer_class = attention.REGISTRY[config.model.attention]
  calls = []

  def catch(next_fun, args, kwargs, context):
    module = context.module
    if isinstance(module, layer_class) and context.method_name == '__call__':
      calls.append((module, args[0]))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(catch):
    validation.build(config)
  assert calls, f'{label}: no {layer_class.__name__} call seen'
  case = kernels.config_case(label, 'h200')
  mechanism, kw = kernels._variant(label)  # pylint: disable=protected-access
  assert mechanism == config.model.attention
  for module, x in calls:
    assert x.shape[1:] == (case.length, case.features), label
    assert x.dtype.name == case.dtype
    assert module.num_heads == case.heads
    assert module.qkv_features == case.heads * case.head_dim
    assert module.dropout_rate == case.dropout
    assert module.causal == case.causal
    for knob, value in kw.items():
      assert getattr(module, knob) == value, (label, knob)


@pytest.mark.parametrize('argv, problem', [
    (['--configs', 'listops/nothing.py'], 'no config file'),
    (['--configs', 'all', '--lengths', '1K'], 'drop --lengths'),
    (['--configs=text/cst.py', '--head_dims=32', '--forms=causal'],
     'drop --head_dims, --forms'),
    (['--configs', 'all', '--heads', '3'], 'drop --heads'),
    (['--heads', '0'], 'each at least 1'),
])
def test_wrong_configs_flags_are_one_line(capsys, argv, problem):
  with pytest.raises(SystemExit) as e:
    kernels.parse_args(argv)
  assert e.value.code == 2
  assert problem in capsys.readouterr().err


def test_configs_summary_has_markers_of_its_own():
  assert kernels.CONFIGS_DOC_START != kernels.DOC_START
  text = open(os.path.join(helpers.ROOT, 'docs', 'scaling.md')).read()
  assert text.count(kernels.CONFIGS_DOC_START) == 1
  assert text.count(kernels.CONFIGS_DOC_END) == 1


def test_configs_take_their_own_dtype_or_those_of_dtypes():
  own = kernels.parse_args(['--configs', 'text/cst.py'])
  assert own.config_dtypes == [None]
  both = kernels.parse_args(['--configs', 'text/cst.py',
                             '--dtypes', 'bfloat16,float32'])
  assert both.config_dtypes == ['bfloat16', 'float32']
  case = kernels.config_case('text/cst.py', 'h200', 'bfloat16')
  assert case.dtype == 'bfloat16'
  assert kernels.config_case('text/cst.py', 'h200').dtype == 'float32'


def test_heads_and_batch_reach_the_cases(monkeypatch):
  # The sweep's cases take --heads and --batch (the compile itself is
  # stubbed: the cases it would compile are what is checked).
  seen = []
  monkeypatch.setattr(kernels, 'run', lambda cases, *a, **k: seen.extend(
      cases) or [dict(dataclasses.asdict(c), key=c.key, status='ok',
                      seconds=0.0) for c in cases])
  monkeypatch.setattr(kernels.targets_lib, 'prepare_environment',
                      lambda: None)
  monkeypatch.setattr(kernels.targets_lib.Target, 'check_packages',
                      lambda self: None)
  assert kernels.main(['kernels', '--targets', 'h200', '--variants', 'cst',
                       '--lengths', '100', '--head_dims', '16',
                       '--dtypes', 'float32', '--dropouts', '0',
                       '--heads', '3', '--batch', '5']) == 0
  assert [(c.heads, c.batch) for c in seen] == [(3, 5)]


def test_only_variants_with_a_causal_form_are_compiled_causal():
  # AdaMRA has none (its 'xla' layer raises too): a causal sweep leaves it
  # out, in a line, instead of failing its cases.
  assert not kernels.has_causal_form('adamra')
  for variant in ('cst', 'long_short', 'combiner_fixed'):
    assert kernels.has_causal_form(variant), variant
