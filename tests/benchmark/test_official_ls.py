"""The attention benchmark's comparison with the official Transformer-LS code.

The first tests need neither PyTorch nor the official code: a bad
`--official_ls` path fails in one line, knobs the official class lacks are
named, the commit of a git checkout is read.

The others load the official `AttentionLS` from a checkout of
NVIDIA/transformer-ls, which is not part of this project. They need PyTorch
(`pip install torch --index-url https://download.pytorch.org/whl/cpu`) and
the environment variable `LRA_MSMRA_OFFICIAL_LS` set to the checkout's
folder (the one holding `lra/attention_transformer_ls.py`), e.g.

  git clone https://github.com/NVIDIA/transformer-ls /tmp/transformer-ls
  LRA_MSMRA_OFFICIAL_LS=/tmp/transformer-ls \\
      pytest tests/benchmark/test_official_ls.py -n 0

and are skipped, with the reason, when either is missing. A variable that
points to an unusable folder fails them instead.
"""

import json
import os
import subprocess

import jax
import numpy as np
import pytest

from lra_msmra_tools.benchmark import attention
from lra_msmra_tools.benchmark import official_ls
from tests.benchmark import assert_check_failed
from tests.benchmark import random_layer
from tests.benchmark import run_attention_tiny

pytestmark = pytest.mark.xdist_group('benchmark_official_ls')

ENV_VAR = 'LRA_MSMRA_OFFICIAL_LS'
HEADS, FEATURES = 2, 16


def _bench(out, *args: str) -> subprocess.CompletedProcess:
  """Runs the attention benchmark on tiny shapes; returns the process."""
  return run_attention_tiny(out, '--torch_threads', '2', *args, heads=HEADS,
                            features=FEATURES)


# ------------------------------------------------ without torch or checkout


def test_missing_checkout_fails_in_one_line(tmp_path):
  done = _bench(tmp_path / 'out', '--mechanisms', 'long_short',
                '--lengths', '16', '--official_ls', '/nonexistent')
  assert done.returncode == 1
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1, done.stderr
  assert lines[0].startswith('error: --official_ls /nonexistent: ')
  assert 'lra/attention_transformer_ls.py' in lines[0]
  assert 'class AttentionLS' in lines[0]
  assert not (tmp_path / 'out').exists()


def test_checkout_without_the_file_or_the_class(tmp_path):
  with pytest.raises(official_ls.CheckoutError,
                     match=r'attention_transformer_ls\.py does not exist'):
    official_ls.validate_checkout(str(tmp_path))
  (tmp_path / 'lra').mkdir()
  file = tmp_path / 'lra' / 'attention_transformer_ls.py'
  file.write_text('class SomethingElse:\n  pass\n')
  with pytest.raises(official_ls.CheckoutError,
                     match='defines no class AttentionLS') as info:
    official_ls.validate_checkout(str(tmp_path))
  assert str(tmp_path) in str(info.value) and '\n' not in str(info.value)
  file.write_text('class AttentionLS:\n  pass\n')
  assert official_ls.validate_checkout(str(tmp_path)) == str(file)


def test_official_needs_long_short_in_the_mechanisms(tmp_path):
  (tmp_path / 'lra').mkdir()
  (tmp_path / 'lra' / 'attention_transformer_ls.py').write_text(
      'class AttentionLS:\n  pass\n')
  with pytest.raises(SystemExit, match='which --mechanisms does not list'):
    attention.parse_args(['--mechanisms', 'softmax', '--out', 'x',
                          '--official_ls', str(tmp_path)])


def test_knobs_the_official_code_lacks_are_named():
  official_ls.check_knobs({'window_size': 1, 'num_landmarks': 0,
                           'normalize_before_compress': True,
                           'conv_kernel_size': 0})
  for knob, value in (('normalize_before_compress', False),
                      ('conv_kernel_size', 3), ('chunk_size', 16),
                      ('not_a_knob', 1)):
    with pytest.raises(NotImplementedError, match=knob):
      official_ls.check_knobs({knob: value})


def test_commit_of_a_git_checkout(tmp_path):
  assert official_ls.checkout_commit(str(tmp_path)) is None
  git = ['git', '-C', str(tmp_path), '-c', 'user.name=t',
         '-c', 'user.email=t@example.com']
  subprocess.run(git + ['init', '-q'], check=True)
  (tmp_path / 'f').write_text('x\n')
  subprocess.run(git + ['add', 'f'], check=True)
  subprocess.run(git + ['commit', '-q', '-m', 'c'], check=True)
  head = subprocess.run(git + ['rev-parse', 'HEAD'], check=True,
                        capture_output=True, text=True).stdout.strip()
  assert official_ls.checkout_commit(str(tmp_path)) == head
  # A folder inside a repository is not a checkout of its own.
  (tmp_path / 'inner').mkdir()
  assert official_ls.checkout_commit(str(tmp_path / 'inner')) is None


# ------------------------------------------------ with torch and checkout


@pytest.fixture(scope='module')
def checkout():
  """The official checkout's path; skips without torch or the variable."""
  pytest.importorskip('torch', reason='needs PyTorch (pip install torch '
                      '--index-url https://download.pytorch.org/whl/cpu)')
  path = os.environ.get(ENV_VAR)
  if not path:
    pytest.skip(f'needs a checkout of NVIDIA/transformer-ls: set {ENV_VAR} '
                'to its folder')
  try:
    official_ls.validate_checkout(path)
  except official_ls.CheckoutError as e:
    pytest.fail(f'{ENV_VAR}: {e}')
  return path


def _layer_and_params(kw, use_bias, length):
  """Our layer and its parameters, every one of them drawn at random."""
  return random_layer('long_short', kw, length, heads=HEADS,
                      features=FEATURES, use_bias=use_bias)


def _mask(length):
  # Row 0 real, row 1 padded over its second half, row 2 a padded stretch
  # inside the sequence (window tiles and landmarks both see padding).
  mask = np.ones((3, length), bool)
  mask[1, length // 2:] = False
  mask[2, 5:11] = False
  return mask


def _outputs(checkout, kw, use_bias, length, edit=None):
  import torch  # pylint: disable=g-import-not-at-top
  layer, params, x = _layer_and_params(kw, use_bias, length)
  module = official_ls.build(checkout, kw, jax.device_get(params['params']),
                             heads=HEADS, features=FEATURES, length=length)
  if edit:
    edit(module)
  mask = _mask(length)
  y_ours = np.array(layer.apply(params, x, padding_mask=mask))
  with torch.no_grad():
    y_official = module(torch.from_numpy(x), torch.from_numpy(mask)).numpy()
  return y_ours, y_official, mask, module


@pytest.mark.parametrize('kw,use_bias,length', [
    ({'window_size': 8, 'num_landmarks': 4}, False, 64),
    ({'window_size': 8, 'num_landmarks': 4}, True, 64),
    ({'window_size': 1, 'num_landmarks': 3}, True, 32),
    ({'window_size': 3, 'num_landmarks': 2}, False, 48),
    ({'window_size': 0, 'num_landmarks': 5}, False, 32),
    ({'window_size': 4, 'num_landmarks': 0}, True, 32),
])
def test_official_output_equals_ours(checkout, kw, use_bias, length):
  y_ours, y_official, mask, module = _outputs(checkout, kw, use_bias, length)
  result = official_ls.compare(y_ours, y_official, mask,
                               official_ls.DEFAULT_TOLERANCE)
  assert result['passed'] and result['max_abs_diff'] < 1e-5, result
  assert result['max_abs_output'] > 0.1
  # Padded rows: ours zeros, the official code the output bias.
  assert np.all(y_ours[~mask] == 0)
  bias = module.W_o.bias.detach().numpy()
  np.testing.assert_allclose(y_official[~mask],
                             np.broadcast_to(bias, y_official[~mask].shape),
                             atol=1e-6)
  assert (result['max_abs_diff_padded_rows'] > 0) == use_bias


def test_a_wrong_mapping_fails_the_check(checkout):
  import torch  # pylint: disable=g-import-not-at-top
  kw = {'window_size': 8, 'num_landmarks': 4}

  def swap_layer_norms(module):
    with torch.no_grad():
      local = module.dual_ln_l.weight.clone()
      module.dual_ln_l.weight.copy_(module.dual_ln_s.weight)
      module.dual_ln_s.weight.copy_(local)
  y_ours, y_official, mask, _ = _outputs(checkout, kw, False, 64,
                                         edit=swap_layer_norms)
  result = official_ls.compare(y_ours, y_official, mask,
                               official_ls.DEFAULT_TOLERANCE)
  assert not result['passed'] and result['max_abs_diff'] > 1e-2


def test_benchmark_times_the_official_code(checkout, tmp_path):
  out = tmp_path / 'ok'
  done = _bench(out, '--mechanisms', 'long_short:window_size=4,num_landmarks=4'
                ',long_short:conv_kernel_size=3', '--lengths', '32',
                '--torch_check_length', '32', '--torch', 'off',
                '--official_ls', checkout)
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads((out / 'attention.json').read_text())
  info = report['settings']['official_ls']
  assert info['class'] == 'AttentionLS' and len(info['file_sha256']) == 64
  assert info['commit'] == official_ls.checkout_commit(checkout)
  good, conv = report['settings']['mechanisms']
  check = report['official_checks'][good]
  assert check['status'] == 'ok' and check['max_abs_diff'] < 1e-5, check
  assert check['check_length'] == 32
  assert report['official_checks'][conv]['status'] == 'unsupported'
  assert 'conv_kernel_size' in report['official_checks'][conv]['reason']
  records = {(r['mechanism'], r['backend'], r['mode']): r
             for r in report['records']}
  for mode in attention.MODES:
    rec = records[(good, 'official', mode)]
    assert rec['status'] == 'ok' and rec['time_s'] > 0, rec
    assert rec['torch_threads'] == 2
    assert rec['official_over_jax'] == pytest.approx(
        rec['time_s'] / records[(good, 'jax', mode)]['time_s'])
    assert records[(conv, 'official', mode)]['status'] == 'unsupported'
  text = (out / 'attention.md').read_text()
  assert '## Official Transformer-LS (`official_ls`)' in text
  assert '/ ours' in text

  # A tolerance below float32 rounding: the check fails loudly, the official
  # points are not timed, the report is still written, the exit status is 1.
  out = tmp_path / 'strict'
  done = _bench(out, '--mechanisms', 'long_short:window_size=4,num_landmarks=4',
                '--lengths', '32', '--torch_check_length', '32',
                '--modes', 'fwd', '--torch', 'off', '--official_ls', checkout,
                '--official_ls_tolerance', '1e-12')
  assert_check_failed(done, out, 'official AttentionLS output check failed')
  assert 'ERROR:' in done.stdout
