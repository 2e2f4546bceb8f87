"""The attention benchmark's comparison with the official Combiner code.

The first tests need no official code: a bad `--official_combiner` path
fails in one line, our knobs map to the official layer that computes the
same function (or are refused by name), the parameter mapping is strict,
and the loader imports the official file by path without leaving its
package names behind (on a stand-in checkout written by the test).

The others load the official Flax layers from a checkout of
google-research/google-research, which is not part of this project. They
need the environment variable `LRA_MSMRA_OFFICIAL_COMBINER` set to the
checkout's folder (the one holding `combiner/combiner/jax/model/layer.py`),
e.g.

  git clone --depth 1 --filter=blob:none --sparse \\
      https://github.com/google-research/google-research /tmp/google-research
  git -C /tmp/google-research sparse-checkout set combiner
  LRA_MSMRA_OFFICIAL_COMBINER=/tmp/google-research \\
      pytest tests/benchmark/test_official_combiner.py -n 0

and are skipped, with the reason, when it is not set. A variable that
points to an unusable folder fails them instead.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from lra_msmra_tools.benchmark import attention
from lra_msmra_tools.benchmark import official_combiner
from tests.benchmark import assert_check_failed
from tests.benchmark import random_layer
from tests.benchmark import run_attention_tiny

pytestmark = pytest.mark.xdist_group('benchmark_official_combiner')

ENV_VAR = 'LRA_MSMRA_OFFICIAL_COMBINER'
HEADS, FEATURES = 2, 16
MODEL_DIR = os.path.join('combiner', 'combiner', 'jax', 'model')
CLASSES = ('_SelfAttSqrtn', '_SelfAttLogn', '_SelfAttAxialRowmajor',
           '_AxialMixtureAtt')


def _bench(out, *args: str) -> subprocess.CompletedProcess:
  """Runs the attention benchmark on tiny shapes; returns the process."""
  return run_attention_tiny(out, '--torch', 'off', *args, heads=HEADS,
                            features=FEATURES)


def _stand_in(root, layer_text=None):
  """A folder laid out like the checkout, with stand-in files: `layer.py`
  imports its siblings by package name, as the official one does."""
  model = root / MODEL_DIR
  model.mkdir(parents=True)
  (model / 'util.py').write_text('ANSWER = 42\n')
  (model / 'transformer_base.py').write_text(
      'class TransformerConfig:\n  pass\n')
  if layer_text is None:
    layer_text = ('from combiner.jax.model.util import ANSWER\n'
                  'from combiner.jax.model.transformer_base import '
                  'TransformerConfig\n'
                  + ''.join(f'class {c}:\n  pass\n' for c in CLASSES))
  (model / 'layer.py').write_text(layer_text)
  return model


# ------------------------------------------------------ without the checkout


def test_missing_checkout_fails_in_one_line():
  with pytest.raises(SystemExit) as info:
    attention.parse_args(['--mechanisms', 'combiner:causal=true',
                          '--out', 'x', '--official_combiner',
                          '/nonexistent'])
  message = str(info.value)
  assert '\n' not in message
  assert message.startswith('error: --official_combiner /nonexistent: ')
  assert 'combiner/combiner/jax/model' in message
  assert '_SelfAttSqrtn' in message


def test_checkout_without_the_files_or_the_classes(tmp_path):
  with pytest.raises(official_combiner.CheckoutError,
                     match=r'util\.py does not exist'):
    official_combiner.validate_checkout(str(tmp_path))
  model = _stand_in(tmp_path, layer_text='class _SelfAttSqrtn:\n  pass\n')
  with pytest.raises(official_combiner.CheckoutError,
                     match='defines no _AxialMixtureAtt, '
                           '_SelfAttAxialRowmajor, _SelfAttLogn') as info:
    official_combiner.validate_checkout(str(tmp_path))
  assert str(tmp_path) in str(info.value) and '\n' not in str(info.value)
  (model / 'layer.py').write_text(
      ''.join(f'class {c}:\n  pass\n' for c in CLASSES))
  (model / 'transformer_base.py').write_text('x = 1\n')
  with pytest.raises(official_combiner.CheckoutError,
                     match='defines no TransformerConfig'):
    official_combiner.validate_checkout(str(tmp_path))
  (model / 'transformer_base.py').write_text('class TransformerConfig:\n'
                                             '  pass\n')
  files = official_combiner.validate_checkout(str(tmp_path))
  assert files['layer.py'] == str(model / 'layer.py')
  described = official_combiner.describe_checkout(str(tmp_path))
  assert described['commit'] is None and described['commit_note']
  assert set(described['files_sha256']) == {'util.py', 'transformer_base.py',
                                            'layer.py'}


def test_official_needs_combiner_in_the_mechanisms(tmp_path):
  _stand_in(tmp_path)
  with pytest.raises(SystemExit, match='which --mechanisms does not list'):
    attention.parse_args(['--mechanisms', 'softmax', '--out', 'x',
                          '--official_combiner', str(tmp_path)])
  args = attention.parse_args(['--mechanisms', 'combiner:causal=true',
                               '--out', 'x', '--official_combiner',
                               str(tmp_path)])
  assert set(args.official) == {'combiner'}
  assert args.official['combiner']['tolerance'] == (
      official_combiner.DEFAULT_TOLERANCE)


def test_loader_imports_by_path_and_leaves_no_package_names(tmp_path):
  _stand_in(tmp_path)
  module = official_combiner.load_module(str(tmp_path))
  assert module.ANSWER == 42
  assert all(isinstance(getattr(module, c), type) for c in CLASSES)
  assert not [name for name in sys.modules
              if name == 'combiner' or name.startswith('combiner.')]


@pytest.mark.parametrize('kw,official', [
    ({'causal': True}, '_SelfAttSqrtn'),
    ({'causal': True, 'variant': 'fixed', 'block_size': 8,
      'abstraction': 'max'}, '_SelfAttSqrtn'),
    ({'causal': True, 'variant': 'logsparse'}, '_SelfAttLogn'),
    ({'causal': True, 'variant': 'axial'}, '_SelfAttAxialRowmajor'),
    ({'causal': True, 'variant': 'axial', 'axial_plan': 'rowmajor',
      'row_length': 4}, '_SelfAttAxialRowmajor'),
    ({'causal': True, 'variant': 'mixture', 'mixture_mode': 'joint_softmax'},
     '_AxialMixtureAtt'),
])
def test_knobs_map_to_the_official_layer(kw, official):
  assert official_combiner.check_knobs(kw) == official


@pytest.mark.parametrize('kw,named', [
    ({}, 'causal'),
    ({'causal': False}, 'causal'),
    ({'causal': True, 'abstraction': 'mean'}, 'abstraction'),
    ({'causal': True, 'abstraction': 'deepset-max'}, 'abstraction'),
    ({'causal': True, 'variant': 'axial', 'num_prefix_tokens': 1},
     'num_prefix_tokens'),
    ({'causal': True, 'variant': 'axial', 'axial_plan': 'vertical'},
     'axial_plan'),
    ({'causal': True, 'variant': 'axial', 'axial_plan': 'horizontal'},
     'axial_plan'),
    ({'causal': True, 'variant': 'mixture'}, 'mixture_mode'),
    ({'causal': True, 'variant': 'learnable'}, 'learnable'),
    ({'causal': True, 'not_a_knob': 1}, 'not_a_knob'),
])
def test_knobs_the_official_code_lacks_are_named(kw, named):
  with pytest.raises(NotImplementedError, match=named):
    official_combiner.check_knobs(kw)


def test_lengths_and_segment_sizes():
  config = official_combiner.official_config
  # Our default block size and row length (the power of two nearest sqrt N)
  # become the official max_seg_len.
  assert config({'causal': True}, 256) == ('_SelfAttSqrtn', 16)
  assert config({'causal': True, 'variant': 'axial'}, 2048) == (
      '_SelfAttAxialRowmajor', 64)
  assert config({'causal': True, 'variant': 'mixture',
                 'mixture_mode': 'joint_softmax', 'row_length': 8}, 24) == (
                     '_AxialMixtureAtt', 8)
  assert config({'causal': True, 'variant': 'logsparse'}, 100) == (
      '_SelfAttLogn', None)
  with pytest.raises(NotImplementedError, match='multiple of its '
                     'max_seg_len, our block_size'):
    config({'causal': True, 'block_size': 48}, 256)
  with pytest.raises(NotImplementedError, match='our row_length'):
    config({'causal': True, 'variant': 'axial', 'row_length': 5}, 32)
  # Its Logsparse layer is one level short when N - 1 is a power of two.
  for length in (2, 3, 5, 17, 1025):
    with pytest.raises(NotImplementedError, match='power of two'):
      config({'causal': True, 'variant': 'logsparse'}, length)


def _shapes(tree):
  return {m: {leaf: np.zeros(shape, np.float32)
              for leaf, shape in leaves.items()} for m, leaves in tree.items()}


def test_parameter_mapping_is_strict():
  d, h, k = 8, 2, 4
  ours = {'query': {'kernel': np.ones((d, h, k))},
          'key': {'kernel': 2 * np.ones((d, h, k))},
          'value': {'kernel': 3 * np.ones((d, h, k))},
          'out': {'kernel': 4 * np.ones((h, k, d))}}
  theirs = _shapes({'query': {'kernel': (d, h, k)},
                    'key': {'kernel': (d, h, k)},
                    'value': {'kernel': (d, h, k)},
                    'DenseGeneral_0': {'kernel': (h, k, d)}})
  mapped = official_combiner.official_params(ours, theirs, '_SelfAttSqrtn')
  assert float(mapped['DenseGeneral_0']['kernel'][0, 0, 0]) == 4
  assert float(mapped['value']['kernel'][0, 0, 0]) == 3
  # Biases (use_bias) have no official counterpart.
  with_bias = dict(ours, out={'kernel': ours['out']['kernel'],
                              'bias': np.zeros(d)})
  with pytest.raises(ValueError, match='out/bias has no counterpart'):
    official_combiner.official_params(with_bias, theirs, '_SelfAttSqrtn')
  with pytest.raises(ValueError, match='shape'):
    official_combiner.official_params(
        dict(ours, key={'kernel': np.ones((d, k, h))}), theirs,
        '_SelfAttSqrtn')
  with pytest.raises(ValueError, match='DenseGeneral_0/kernel'):
    official_combiner.official_params(
        {n: p for n, p in ours.items() if n != 'out'}, theirs,
        '_SelfAttSqrtn')
  # Row-major: the summary projections and LayerNorm, in creation order.
  rowmajor = dict(ours, row_summary_out={'kernel': np.ones((h, k, d))},
                  row_summary_norm={'scale': np.ones(d), 'bias': np.ones(d)},
                  row_summary_key={'kernel': np.ones((d, h, k))})
  theirs = _shapes({'query': {'kernel': (d, h, k)},
                    'key': {'kernel': (d, h, k)},
                    'value': {'kernel': (d, h, k)},
                    'DenseGeneral_0': {'kernel': (h, k, d)},
                    'LayerNorm_0': {'scale': (d,), 'bias': (d,)},
                    'DenseGeneral_1': {'kernel': (d, h, k)},
                    'DenseGeneral_2': {'kernel': (h, k, d)}})
  mapped = official_combiner.official_params(rowmajor, theirs,
                                             '_SelfAttAxialRowmajor')
  assert float(mapped['DenseGeneral_2']['kernel'][0, 0, 0]) == 4


def test_causal_is_the_layers_form_not_a_knob():
  assert attention._split_causal({'variant': 'fixed', 'causal': True}) == (
      {'variant': 'fixed'}, True)
  assert attention._split_causal({'block_size': 4}) == ({'block_size': 4},
                                                        False)
  # PyTorch code, which has no causal form, sees causal=true and refuses it.
  assert attention._port_knobs({'causal': False, 'a': 1}) == {'a': 1}
  assert attention._port_knobs({'causal': True}) == {'causal': True}
  with pytest.raises(SystemExit):
    attention.parse_args(['--mechanisms', 'combiner:causal=yes',
                          '--out', 'x'])


# ---------------------------------------------------------- with the checkout


@pytest.fixture(scope='module')
def checkout():
  """The official checkout's path; skips without the variable."""
  path = os.environ.get(ENV_VAR)
  if not path:
    pytest.skip(f'needs a checkout of google-research/google-research: set '
                f'{ENV_VAR} to its folder')
  try:
    official_combiner.validate_checkout(path)
  except official_combiner.CheckoutError as e:
    pytest.fail(f'{ENV_VAR}: {e}')
  return path


def _layer_and_params(kw, length):
  """Our causal layer and its parameters, every one drawn at random."""
  return random_layer('combiner', kw, length, heads=HEADS, features=FEATURES,
                      causal=True)


def _mask(length):
  # Row 0 real, rows 1 and 2 padded at the end: the official code has no
  # padding, and in the causal form no real row sees the padded tail.
  mask = np.ones((3, length), bool)
  mask[1, length // 2:] = False
  mask[2, length - 3:] = False
  return mask


def _outputs(checkout, kw, length, edit=None):
  layer, params, x = _layer_and_params(kw, length)
  module, variables = official_combiner.build(
      checkout, dict(kw, causal=True), jax.device_get(params['params']),
      heads=HEADS, features=FEATURES, length=length)
  if edit:
    variables = edit(variables)
  mask = _mask(length)
  y_ours = np.array(layer.apply(params, x, padding_mask=mask))
  y_official = np.array(module.apply(variables, x))
  return y_ours, y_official, mask


@pytest.mark.parametrize('kw,length', [
    ({'variant': 'fixed', 'block_size': 4}, 16),
    ({'variant': 'fixed', 'block_size': 3}, 24),
    ({'variant': 'logsparse'}, 16),
    ({'variant': 'logsparse'}, 13),
    ({'variant': 'axial', 'row_length': 4}, 16),
    ({'variant': 'axial', 'axial_plan': 'rowmajor', 'row_length': 8}, 24),
    ({'variant': 'mixture', 'mixture_mode': 'joint_softmax',
      'row_length': 4}, 16),
    ({'variant': 'mixture', 'mixture_mode': 'joint_softmax',
      'row_length': 3}, 15),
])
def test_official_output_equals_ours(checkout, kw, length):
  y_ours, y_official, mask = _outputs(checkout, kw, length)
  result = official_combiner.compare(y_ours, y_official, mask,
                                     official_combiner.DEFAULT_TOLERANCE)
  assert result['passed'] and result['max_abs_diff'] < 1e-5, result
  assert result['max_abs_output'] > 0.1
  assert np.all(y_ours[~mask] == 0)


def test_a_wrong_mapping_fails_the_check(checkout):
  def swap_key_and_value(variables):
    p = dict(variables['params'])
    p['key'], p['value'] = p['value'], p['key']
    return {'params': p}
  y_ours, y_official, mask = _outputs(checkout, {'variant': 'axial',
                                                 'row_length': 4}, 16,
                                      edit=swap_key_and_value)
  result = official_combiner.compare(y_ours, y_official, mask,
                                     official_combiner.DEFAULT_TOLERANCE)
  assert not result['passed'] and result['max_abs_diff'] > 1e-2


def test_official_logsparse_misses_a_level_when_n_minus_1_is_a_power_of_two(
    checkout):
  """Why N = 2^k + 1 is refused: only the last query differs."""
  length = 17
  layer, params, x = _layer_and_params({'variant': 'logsparse'}, length)
  official = official_combiner.load_module(checkout)
  config = official.TransformerConfig(
      vocab_size=1, output_vocab_size=1, num_heads=HEADS,
      qkv_dim=FEATURES, max_len=length, dropout_rate=0.0,
      attention_dropout_rate=0.0, deterministic=True)
  module = official._SelfAttLogn(config=config)  # pylint: disable=protected-access
  shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)['params']
  variables = {'params': official_combiner.official_params(
      jax.device_get(params['params']['attention']), shapes,
      '_SelfAttLogn')}
  diff = np.abs(np.array(layer.apply(params, x))
                - np.array(module.apply(variables, x))).max(axis=(0, 2))
  assert diff[:-1].max() < 1e-5 and diff[-1] > 1e-2, diff


def test_benchmark_times_the_official_code(checkout, tmp_path):
  out = tmp_path / 'ok'
  good = 'combiner:variant=axial,row_length=4,causal=true'
  average = 'combiner:variant=mixture,row_length=4,causal=true'
  done = _bench(out, '--mechanisms', f'{good},{average}', '--lengths', '32',
                '--torch_check_length', '32',
                '--official_combiner', checkout)
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads((out / 'attention.json').read_text())
  info = report['settings']['official_combiner']
  assert info['file'] == os.path.join(MODEL_DIR, 'layer.py')
  assert len(info['file_sha256']) == 64
  assert report['settings']['official_ls'] is None
  good, average = report['settings']['mechanisms']
  check = report['official_checks'][good]
  assert check['status'] == 'ok' and check['max_abs_diff'] < 1e-5, check
  assert check['official_class'] == '_SelfAttAxialRowmajor'
  assert check['check_length'] == 32
  assert report['official_checks'][average]['status'] == 'unsupported'
  assert 'mixture_mode' in report['official_checks'][average]['reason']
  records = {(r['mechanism'], r['backend'], r['mode']): r
             for r in report['records']}
  for mode in attention.MODES:
    rec = records[(good, 'official', mode)]
    assert rec['status'] == 'ok' and rec['time_s'] > 0, rec
    assert rec['flops'] > 0 and rec['compile_s'] > 0
    assert rec['official_over_jax'] == pytest.approx(
        rec['time_s'] / records[(good, 'jax', mode)]['time_s'])
    assert records[(average, 'official', mode)]['status'] == 'unsupported'
    assert records[(average, 'jax', mode)]['status'] == 'ok'
  text = (out / 'attention.md').read_text()
  assert '## Official Combiner (`official_combiner`)' in text
  assert '`_SelfAttAxialRowmajor`' in text and '/ ours' in text
  # Times and memory against ours; no PyTorch port was timed, so none is
  # named.
  assert ('### Official Combiner: forward net peak memory (official / ours'
          in text)
  assert 'our PyTorch port:' not in text

  # A tolerance below float32 rounding: the check fails loudly, the official
  # points are not timed, the report is still written, the exit status is 1.
  out = tmp_path / 'strict'
  done = _bench(out, '--mechanisms', good, '--lengths', '32',
                '--torch_check_length', '32', '--modes', 'fwd',
                '--official_combiner', checkout,
                '--official_combiner_tolerance', '1e-12')
  assert_check_failed(done, out, 'official Combiner output check failed')
  assert 'official_combiner.py' in done.stderr
