"""The official Transformer-LS attention, run on our `long_short` weights.

Optional, for the attention benchmark's `--official_ls PATH`: PATH is a
checkout of NVIDIA/transformer-ls (not part of this project; nothing of it
is copied here). Its bidirectional LRA layer, class `AttentionLS` in
`lra/attention_transformer_ls.py`, is imported from that file by path
(`load_class`), inside the benchmark's PyTorch worker processes only. The
file needs nothing but `torch` and the standard library, so nothing else
of the checkout is imported and it is not put on `sys.path`.

`build` makes an `AttentionLS` with the shapes and knobs of our layer and
loads our JAX parameters into it (`official_state_dict`; the mapping is
written out there and in docs/mechanisms/long_short.md §2.1), so the two
compute the same function: the benchmark checks that on a partly padded
batch (`compare`) before it times the official module.

`validate_checkout`, `describe_checkout` and `check_knobs` need neither
torch nor JAX: the benchmark's main process calls them to fail early, in one
line, on a bad PATH or a knob the official code lacks.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import subprocess
import types
import warnings
from typing import Any, Mapping, Optional, Sequence

import numpy as np

# Where the class lives in a checkout of NVIDIA/transformer-ls.
RELATIVE_FILE = os.path.join('lra', 'attention_transformer_ls.py')
CLASS_NAME = 'AttentionLS'
REPOSITORY = 'NVIDIA/transformer-ls'
# Default largest |ours - official| accepted on real rows (float32).
DEFAULT_TOLERANCE = 1e-4
# Our knobs the official class has no counterpart for (-> reason).
_UNSUPPORTED = {
    'normalize_before_compress': (
        'it always compresses the LN_L outputs (our True); it has no form '
        'that compresses the raw projections'),
    'chunk_size': ('it is bidirectional, and chunk_size belongs to our '
                   'causal form'),
    'conv_kernel_size': (
        'its convolution passes a 4-D value tensor to nn.Conv1d, which '
        'current PyTorch rejects (tested with 2.13: "Expected 2D '
        '(unbatched) or 3D (batched) input to conv1d")'),
}
# Values of those knobs that mean the same as the official code.
_NEUTRAL = {'normalize_before_compress': (None, True), 'chunk_size': (None,),
            'conv_kernel_size': (0,)}


class CheckoutError(ValueError):
  """PATH is not a usable checkout of the official code (here
  NVIDIA/transformer-ls; `official_combiner` raises it too)."""


def _expected() -> str:
  return (f'expected a checkout of {REPOSITORY} whose {RELATIVE_FILE} '
          f'defines class {CLASS_NAME} (e.g. git clone '
          f'https://github.com/{REPOSITORY} and pass that folder)')


def syntax_tree(file: str, where: str, expected: str) -> ast.Module:
  """The parsed `file` of a checkout, without running it.

  Raises:
    CheckoutError: one line, `where` (the option and its path) first, then
      why the file cannot be read and `expected`.
  """
  try:
    with open(file, encoding='utf-8') as f:
      return ast.parse(f.read(), filename=file)
  except (OSError, UnicodeDecodeError, SyntaxError) as e:
    detail = ' '.join(str(e).split())
    raise CheckoutError(f'{where}: cannot read {file} ({detail}); '
                        f'{expected}.') from None


def validate_checkout(path: str) -> str:
  """Returns the official file of checkout `path`; raises if it is unusable.

  Reads the file's syntax tree only (no torch): the class must be defined at
  the top level of the file.

  Raises:
    CheckoutError: one line naming the path, what is missing and what was
      expected.
  """
  if not os.path.isdir(path):
    what = 'is not a folder' if os.path.exists(path) else 'does not exist'
    raise CheckoutError(f'--official_ls {path}: {what}; {_expected()}.')
  file = os.path.join(path, RELATIVE_FILE)
  if not os.path.isfile(file):
    raise CheckoutError(f'--official_ls {path}: {file} does not exist; '
                        f'{_expected()}.')
  tree = syntax_tree(file, f'--official_ls {path}', _expected())
  if not any(isinstance(node, ast.ClassDef) and node.name == CLASS_NAME
             for node in tree.body):
    raise CheckoutError(f'--official_ls {path}: {file} defines no class '
                        f'{CLASS_NAME}; {_expected()}.')
  return file


def _git(path: str, *args: str) -> Optional[str]:
  """Output of `git -C path args`, or None if git fails."""
  try:
    done = subprocess.run(['git', '-C', path, *args], capture_output=True,
                          text=True, timeout=30, check=False)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return done.stdout if done.returncode == 0 else None


def checkout_commit(path: str) -> Optional[str]:
  """`git rev-parse HEAD` of checkout `path`, or None if it is not one.

  A folder that merely lies inside another repository (e.g. an archive
  unpacked into a project) is not a checkout: its top level must be `path`.
  """
  top = _git(path, 'rev-parse', '--show-toplevel')
  if not top or os.path.realpath(top.strip()) != os.path.realpath(path):
    return None
  commit = (_git(path, 'rev-parse', 'HEAD') or '').strip()
  return commit or None


def files_modified(path: str, files: Sequence[str]) -> Optional[bool]:
  """Whether git checkout `path` has local changes to `files` (relative
  paths); None if git cannot tell."""
  status = _git(path, 'status', '--porcelain', '--', *files)
  return None if status is None else bool(status.strip())


def describe_checkout(path: str) -> dict[str, Any]:
  """What the report records about the official code that was run."""
  file = validate_checkout(path)
  with open(file, 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  commit = checkout_commit(path)
  return {'repository': REPOSITORY, 'path': os.path.abspath(path),
          'file': RELATIVE_FILE, 'class': CLASS_NAME, 'commit': commit,
          'commit_note': None if commit else
                         'not a git checkout: no commit recorded',
          'file_modified': (files_modified(path, [RELATIVE_FILE])
                            if commit else None),
          'file_sha256': digest}


def check_knobs(kw: Mapping[str, Any]) -> None:
  """Raises NotImplementedError naming a knob the official code lacks.

  `window_size` and `num_landmarks` (any values our layer accepts) are the
  official `window_size` and `num_landmarks`; the other knobs must keep the
  values that mean what the official code does.
  """
  for key, value in kw.items():
    if key in ('window_size', 'num_landmarks'):
      continue
    if key not in _UNSUPPORTED:
      raise NotImplementedError(
          f'long_short knob {key!r} has no counterpart in the official '
          f'{CLASS_NAME}; leave it at its default to compare.')
    if value not in _NEUTRAL[key]:
      raise NotImplementedError(
          f'long_short knob {key}={value!r} is not supported by the '
          f'official {CLASS_NAME}: {_UNSUPPORTED[key]}. Use '
          f'{key}={_NEUTRAL[key][-1]!r} (the default) to compare.')


def load_class(path: str) -> type:
  """Imports `AttentionLS` from checkout `path` by file path (needs torch)."""
  file = validate_checkout(path)
  spec = importlib.util.spec_from_file_location(
      'lra_msmra_official_attention_transformer_ls', file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cls = getattr(module, CLASS_NAME, None)
  if not isinstance(cls, type):
    raise CheckoutError(f'--official_ls {path}: importing {file} gave no '
                        f'class {CLASS_NAME}; {_expected()}.')
  return cls


def official_config(*, heads: int, features: int, length: int,
                    window_size: int, num_landmarks: int
                    ) -> types.SimpleNamespace:
  """The config object `AttentionLS(config)` reads, for our layer's shapes.

  Bidirectional, mean pooling (so the first token is an ordinary token, not
  a CLS vector), no dropout, no convolution.
  """
  return types.SimpleNamespace(
      num_head=heads, head_dim=features // heads,
      transformer_dim=features, max_seq_len=length,
      window_size=window_size, num_landmarks=num_landmarks,
      attention_dropout=0.0, fp32_attn=False, pooling_mode='mean',
      cls_token=False, conv_kernel_size=-1)


def _linear(kernel: np.ndarray, out_axes: int) -> np.ndarray:
  """A flax kernel `[in..., out...]` as a torch `Linear.weight [out, in]`."""
  kernel = np.asarray(kernel, np.float32)
  in_size = int(np.prod(kernel.shape[:kernel.ndim - out_axes]))
  return kernel.reshape(in_size, -1).T


def official_state_dict(params: Mapping[str, Any], defaults: Mapping[str, Any]
                        ) -> dict[str, np.ndarray]:
  """Our `long_short` parameters as the official module's state dict.

  Heads are laid out the same way on both sides (feature h * d + i is
  channel i of head h; landmark j of head h is output h * r + j of
  `dconv_fc`), so every array is a reshape, plus a transpose for the
  torch `Linear` layout `[out, in]`:

  ours (under 'attention')           official `AttentionLS`
  query, key, value kernel [D, H, d] W_q, W_k, W_v .weight: [D, H d]^T
  query, key, value bias [H, d]      W_q, W_k, W_v .bias: flattened
  out kernel [H, d, D]               W_o.weight: [H d, D]^T
  out bias [D]                       W_o.bias
  landmark_scores kernel [D, H, r]   dconv_fc.weight: [D, H r]^T
  (none: cancels in P's softmax)     dconv_fc.bias: zeros
  ln_local scale, bias [H, d]        dual_ln_l.weight, .bias: flattened
  ln_global scale, bias [H, d]       dual_ln_s.weight, .bias: flattened

  Without `use_bias` our layer has no biases and the official ones are set
  to zero. DualLN: both sides normalise over all heads jointly (H d values)
  with epsilon 1e-5, `dual_ln_l` for the window keys and values, `dual_ln_s`
  for the projected ones.

  With `num_landmarks=0` our layer has no `landmark_scores` and `ln_global`;
  the official `dconv_fc` is then empty and `dual_ln_s` unused, and they keep
  their values from `defaults`.

  Args:
    params: our layer's parameters (the tree under 'attention').
    defaults: the official module's own state dict (numpy arrays), for the
      parameters that have no counterpart on our side.

  Returns:
    {name: float32 array}, with exactly the keys of `defaults`.

  Raises:
    ValueError: a parameter of ours that the mapping does not place, or a
      shape that does not match the official module's.
  """
  out = {name: np.asarray(value, np.float32)
         for name, value in defaults.items()}
  used = set()

  def put(name, value, source):
    value = np.asarray(value, np.float32)
    if name not in out:
      raise ValueError(f'The official module has no parameter {name!r} '
                       f'(for our {source}).')
    if value.shape != out[name].shape:
      raise ValueError(f'Our {source} maps to {name} with shape '
                       f'{value.shape}, but the official module has '
                       f'{out[name].shape}.')
    out[name] = value
    used.add(source)

  for ours, theirs in (('query', 'W_q'), ('key', 'W_k'), ('value', 'W_v'),
                       ('out', 'W_o'), ('landmark_scores', 'dconv_fc')):
    if ours not in params:
      continue
    outs = 1 if ours == 'out' else 2
    put(f'{theirs}.weight', _linear(params[ours]['kernel'], outs),
        f'{ours}/kernel')
    bias = params[ours].get('bias')
    put(f'{theirs}.bias', np.zeros_like(out[f'{theirs}.bias'])
        if bias is None else np.asarray(bias).reshape(-1), f'{ours}/bias')
  for ours, theirs in (('ln_local', 'dual_ln_l'), ('ln_global', 'dual_ln_s')):
    if ours in params:
      put(f'{theirs}.weight', np.asarray(params[ours]['scale']).reshape(-1),
          f'{ours}/scale')
      put(f'{theirs}.bias', np.asarray(params[ours]['bias']).reshape(-1),
          f'{ours}/bias')
  ours_all = set()
  for module, leaves in params.items():
    ours_all.update([f'{module}/{leaf}' for leaf in leaves]
                    if isinstance(leaves, Mapping) else [module])
  missed = sorted(ours_all - used)
  if missed:
    raise ValueError(f'Our parameters {missed} have no counterpart in the '
                     f'official {CLASS_NAME}.')
  return out


def build(path: str, kw: Mapping[str, Any], params: Mapping[str, Any], *,
          heads: int, features: int, length: int):
  """An official `AttentionLS` holding our layer's weights (needs torch).

  Args:
    path: the checkout of NVIDIA/transformer-ls.
    kw: our `long_short` knobs (`check_knobs` must accept them).
    params: our `StandaloneAttention` parameters (the tree holding
      'attention'), as numpy arrays.
    heads: number of heads H.
    features: model width D (= H d, as the official module requires).
    length: the sequence length it will be called with (its `max_seq_len`).

  Returns:
    The module in eval mode, float32, its parameters our weights.
  """
  import torch  # pylint: disable=g-import-not-at-top

  check_knobs(kw)
  from lra_msmra.attention import long_short  # pylint: disable=g-import-not-at-top
  defaults = long_short.LongShortAttention
  window = kw.get('window_size', defaults.window_size)
  if window and length % window:
    raise NotImplementedError(
        f'The official {CLASS_NAME} needs the length ({length}) to be a '
        f'multiple of window_size ({window}); our layer pads internally. '
        'Choose such lengths to compare.')
  cls = load_class(path)
  config = official_config(
      heads=heads, features=features, length=length, window_size=window,
      num_landmarks=kw.get('num_landmarks', defaults.num_landmarks))
  with warnings.catch_warnings():
    # With num_landmarks=0 the official `dconv_fc` has no outputs, and
    # PyTorch warns that initialising it does nothing.
    warnings.filterwarnings('ignore', message='Initializing zero-element')
    module = cls(config).float().eval()
  own = {k: v.detach().numpy() for k, v in module.state_dict().items()}
  state = official_state_dict(params['attention'], own)
  module.load_state_dict({k: torch.tensor(v) for k, v in state.items()},
                        strict=True)
  return module


def compare(y_ours: np.ndarray, y_official: np.ndarray, real: np.ndarray,
            tolerance: float) -> dict[str, Any]:
  """Differences of the two outputs, on real rows and on padded rows.

  Padded query rows are compared apart: ours outputs zeros there, the
  official code something else (`AttentionLS`: the output bias, zero unless
  `use_bias`; the official Combiner, which has no padding: the output for
  the padded tokens' content). `passed` is whether the real rows agree
  within `tolerance`.
  """
  real = np.asarray(real, bool)
  diff = np.abs(np.asarray(y_ours, np.float64) - y_official)
  on_real = float(diff[real].max()) if real.any() else 0.0
  on_padded = float(diff[~real].max()) if (~real).any() else None
  scale = float(np.abs(y_ours[real]).max()) if real.any() else 0.0
  return {'max_abs_diff': on_real, 'max_abs_output': scale,
          'relative_diff': on_real / max(scale, 1e-30),
          'max_abs_diff_padded_rows': on_padded,
          'padded_rows': int((~real).sum()), 'tolerance': tolerance,
          'passed': bool(on_real <= tolerance)}
