"""Transformer-LS: the invariants of docs/mechanisms/long_short.md §8.

The dense reference below is written independently of the module: plain
numpy in float64, explicit N x N window masks and one softmax per query over
[visible projected vectors | visible tokens], from the equations of the paper
(Eqs. 3, 5-7) and the official code's window and DualLN conventions.
"""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import config_lib
from lra_msmra import validation
from lra_msmra.attention import long_short
from lra_msmra.attention.long_short import LongShortAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _mask(length):
  """Row 0 all real; row 1 holes (leading, middle, trailing); row 2 one real."""
  m = np.ones((3, length), bool)
  m[1, [0, 3, 4, length - 1]] = False
  m[2] = False
  m[2, length // 2] = True
  return m


def _inputs(length, seed=0):
  x = np.asarray(jax.random.normal(jax.random.PRNGKey(seed),
                                   (3, length, FEATURES)))
  return x, _mask(length)


def _layer(**kw):
  return LongShortAttention(num_heads=HEADS, **kw)


def _init(layer, x, mask, seed=0):
  """Initialises, then makes every parameter non-trivial (LN, conv, biases)."""
  params = jax.jit(layer.init)(jax.random.PRNGKey(seed), jnp.asarray(x),
                               padding_mask=jnp.asarray(mask))['params']
  keys = iter(jax.random.split(jax.random.PRNGKey(seed + 100), 64))

  def perturb(path, p):
    name = '/'.join(str(getattr(k, 'key', k)) for k in path)
    noise = 0.3 * jax.random.normal(next(keys), p.shape)
    if name.endswith('scale'):
      return p + noise
    if name.endswith('bias') or 'value_conv' in name:
      return noise
    return p
  return {'params': jax.tree_util.tree_map_with_path(perturb, params)}


def _apply(layer, variables, x, mask, **kw):
  # Jitted: one compile is much cheaper than op-by-op dispatch on CPU.
  fn = jax.jit(lambda v, a, m: layer.apply(v, a, padding_mask=m, **kw))
  return fn(variables, jnp.asarray(x), jnp.asarray(mask))


def _sown(layer, variables, x, mask):
  y, state = _apply(layer, variables, x, mask, mutable=['intermediates'])
  return y, {k: np.asarray(v[0]) for k, v in state['intermediates'].items()}


# --------------------------------------------------------- dense reference


def _dense(p, name, x):
  kernel = np.asarray(p[name]['kernel'], np.float64)
  out = np.tensordot(x, kernel, axes=([-1], [0]))
  if 'bias' in p[name]:
    out = out + np.asarray(p[name]['bias'], np.float64)
  return out


def _layer_norm(p, name, a):
  """LayerNorm over the last two axes (heads x head_dim jointly), eps 1e-5."""
  mean = a.mean(axis=(-2, -1), keepdims=True)
  var = ((a - mean) ** 2).mean(axis=(-2, -1), keepdims=True)
  out = (a - mean) / np.sqrt(var + 1e-5)
  return (out * np.asarray(p[name]['scale'], np.float64)
          + np.asarray(p[name]['bias'], np.float64))


def _masked_softmax(logits, valid, axis):
  logits = np.where(valid, logits, -np.inf)
  top = np.max(logits, axis=axis, keepdims=True)
  top = np.where(np.isfinite(top), top, 0.0)
  e = np.where(valid, np.exp(logits - top), 0.0)
  total = e.sum(axis=axis, keepdims=True)
  return e / np.where(total > 0, total, 1.0)


def dense_long_short(variables, x, mask, *, window_size, num_landmarks,
                     causal=False, chunk_size=None, conv_kernel_size=0,
                     normalize_before_compress=None):
  """Transformer-LS written densely: [batch, N, features] -> same."""
  p = variables['params']
  x = np.asarray(x, np.float64)
  batch, n, _ = x.shape
  w, r = window_size, num_landmarks
  q = _dense(p, 'query', x)
  head_dim = q.shape[-1]
  q = q / math.sqrt(head_dim)
  k, v = _dense(p, 'key', x), _dense(p, 'value', x)
  k_loc, v_loc = _layer_norm(p, 'ln_local', k), _layer_norm(p, 'ln_local', v)
  normalize = (not causal) if normalize_before_compress is None else (
      normalize_before_compress)
  k_src, v_src = (k_loc, v_loc) if normalize else (k, v)

  pos = np.arange(n)
  if causal:
    win = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - w)
  else:
    e = max(w // 2, 1)
    start = (pos // max(w, 1)) * w - e
    win = (pos[None, :] >= start[:, None]) & (
        pos[None, :] < start[:, None] + w + 2 * e)
    win &= w > 0

  out = np.zeros(q.shape)
  for b in range(batch):
    real = mask[b]
    # Projected vectors: (keys [M, H, d], values [M, H, d], visible [N, M]).
    groups = []
    if r:
      scores = np.tensordot(x[b], np.asarray(p['landmark_scores']['kernel'],
                                             np.float64), axes=([-1], [0]))
      if causal:
        l = chunk_size or long_short.DEFAULT_CHUNK_SIZE
        spans = [(c, np.arange(c * l, min((c + 1) * l, n)))
                 for c in range(-(-n // l))]
      else:
        spans = [(None, pos)]
      for c, idx in spans:
        if not real[idx].any():
          continue
        proj = _masked_softmax(scores[idx], real[idx, None, None], axis=0)
        kb = _layer_norm(p, 'ln_global',
                         np.einsum('nhr,nhd->rhd', proj, k_src[b, idx]))
        vb = _layer_norm(p, 'ln_global',
                         np.einsum('nhr,nhd->rhd', proj, v_src[b, idx]))
        seen = np.ones(n, bool) if c is None else (pos // l > c)
        groups.append((kb, vb, np.repeat(seen[:, None], r, axis=1)))
    keys = np.concatenate([g[0] for g in groups] + [k_loc[b]], axis=0)
    vals = np.concatenate([g[1] for g in groups] + [v_loc[b]], axis=0)
    visible = np.concatenate([g[2] for g in groups] + [win & real[None, :]],
                             axis=1)
    logits = np.einsum('nhd,mhd->hnm', q[b], keys)
    probs = _masked_softmax(logits, visible[None], axis=-1)
    probs = probs * real[None, :, None]
    out[b] = np.einsum('hnm,mhd->nhd', probs, vals)
    if conv_kernel_size:
      kern = np.asarray(p['value_conv'], np.float64)
      half = conv_kernel_size // 2
      vm = v_loc[b] * real[:, None, None]
      for i in range(n):
        for j in range(conv_kernel_size):
          src = i + j - half
          if 0 <= src < n:
            out[b, i] += kern[j][:, None] * vm[src]
  y = np.tensordot(out, np.asarray(p['out']['kernel'], np.float64),
                   axes=([-2, -1], [0, 1]))
  if 'bias' in p['out']:
    y = y + np.asarray(p['out']['bias'], np.float64)
  return y * mask[..., None]


DENSE_CASES = [
    # Bidirectional: even/odd/unit windows, N % w != 0, each part alone.
    dict(n=16, window_size=4, num_landmarks=3),
    dict(n=13, window_size=3, num_landmarks=2, use_bias=True),
    dict(n=7, window_size=1, num_landmarks=2),
    dict(n=10, window_size=0, num_landmarks=3),
    dict(n=10, window_size=4, num_landmarks=0),
    dict(n=12, window_size=2, num_landmarks=2, conv_kernel_size=3),
    dict(n=11, window_size=4, num_landmarks=3, normalize_before_compress=False,
         conv_kernel_size=5),
    # Causal: chunk and window lengths that do not divide N, each part alone.
    dict(n=14, window_size=3, num_landmarks=2, causal=True, chunk_size=4),
    dict(n=16, window_size=4, num_landmarks=1, causal=True, chunk_size=2,
         use_bias=True),
    dict(n=11, window_size=0, num_landmarks=2, causal=True, chunk_size=3),
    dict(n=13, window_size=5, num_landmarks=0, causal=True),
    dict(n=12, window_size=2, num_landmarks=2, causal=True, chunk_size=4,
         normalize_before_compress=True),
]


@pytest.mark.parametrize('case', DENSE_CASES,
                         ids=[str(i) for i in range(len(DENSE_CASES))])
def test_matches_dense_reference(case):
  case = dict(case)
  n = case.pop('n')
  x, mask = _inputs(n)
  layer = _layer(**case)
  variables = _init(layer, x, mask)
  y = _apply(layer, variables, x, mask)
  case.pop('use_bias', None)
  expected = dense_long_short(variables, x, mask, **case)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('index', [1, 6, 8, 11])
def test_gradients_match_finite_differences_of_dense_reference(index):
  """Parameter and input gradients (recomputed core, DualLN backward)."""
  case = dict(DENSE_CASES[index])
  n = case.pop('n')
  x, mask = _inputs(n, seed=index)
  layer = _layer(**case)
  variables = _init(layer, x, mask)
  case.pop('use_bias', None)
  ref.check_gradients(
      layer, variables, x, mask,
      lambda v, a: dense_long_short(v, a, mask, **case), seed=index)


# ----------------------------------------------------- weights and support


def test_projection_columns_sum_to_one_and_vanish_at_padding():
  x, mask = _inputs(13)
  layer = _layer(window_size=4, num_landmarks=3)
  _, sown = _sown(layer, _init(layer, x, mask), x, mask)
  proj = sown['projection']  # [batch, 16 (padded), heads, r]
  real = np.pad(mask, [(0, 0), (0, 3)])
  np.testing.assert_allclose(proj.sum(axis=1), 1.0, rtol=1e-5)
  assert np.all(proj[~real] == 0.0)
  assert np.all(proj[real] > 0.0)


def test_causal_chunk_projection_sums_to_one_per_chunk():
  x, mask = _inputs(12)
  layer = _layer(window_size=2, num_landmarks=2, causal=True, chunk_size=4)
  _, sown = _sown(layer, _init(layer, x, mask), x, mask)
  proj = sown['projection']  # [batch, chunks, l, heads, r]
  chunk_real = mask.reshape(3, 3, 4)
  sums = proj.sum(axis=2)
  has_real = chunk_real.any(-1)
  np.testing.assert_allclose(sums[has_real], 1.0, rtol=1e-5)
  assert np.all(sums[~has_real] == 0.0)
  assert np.all(proj[~chunk_real] == 0.0)


def _effective_attention(probs, proj, w, r):
  """E [batch, heads, N, N] of the bidirectional form from sown weights."""
  batch, heads, n, _ = probs.shape
  eff = np.zeros((batch, heads, n, n))
  if r:
    eff += np.einsum('bhik,bjhk->bhij', probs[..., :r], proj)
  if w:
    e = long_short.window_extension(w)
    for i in range(n):
      for slot in range(w + 2 * e):
        j = (i // w) * w - e + slot
        if 0 <= j < n:
          eff[:, :, i, j] += probs[:, :, i, r + slot]
        else:
          assert np.all(probs[:, :, i, r + slot] == 0.0)
  return eff


@pytest.mark.parametrize('w,r', [(4, 3), (3, 0), (0, 2)])
def test_effective_attention_is_a_distribution_over_real_tokens(w, r):
  n = 12
  x, mask = _inputs(n)
  layer = _layer(window_size=w, num_landmarks=r)
  _, sown = _sown(layer, _init(layer, x, mask), x, mask)
  eff = _effective_attention(sown['probs'], sown.get('projection'), w, r)
  assert np.all(eff >= 0.0)
  sums = eff.sum(-1)  # [batch, heads, N]
  np.testing.assert_allclose(sums.transpose(0, 2, 1)[mask], 1.0, rtol=1e-5)
  assert np.all(sums.transpose(0, 2, 1)[~mask] == 0.0)
  assert np.all(eff.transpose(0, 3, 1, 2)[~mask] == 0.0)  # padded keys
  if r == 0:
    # Window support exactly [g w - e, (g + 1) w + e) intersected with real.
    e = long_short.window_extension(w)
    pos = np.arange(n)
    start = (pos // w) * w - e
    support = (pos[None] >= start[:, None]) & (pos[None] < start[:, None]
                                                + w + 2 * e)
    expected = support[None] & mask[:, None, :] & mask[:, :, None]
    got = (eff > 0).all(axis=1)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal((eff > 0).any(axis=1), expected)


def test_causal_weights_support():
  n, w, r, l = 12, 3, 2, 4
  x, mask = _inputs(n)
  layer = _layer(window_size=w, num_landmarks=r, causal=True, chunk_size=l)
  _, sown = _sown(layer, _init(layer, x, mask), x, mask)
  probs = sown['probs']  # [batch, heads, N, (N / l) r + 2w]
  n_comp = (n // l) * r
  pos = np.arange(n)
  chunk_real = mask.reshape(3, n // l, l).any(-1)
  seen = (np.arange(n_comp)[None] // r < pos[:, None] // l)
  expected_comp = (seen[None] & np.repeat(chunk_real, r, 1)[:, None, :]
                   & mask[:, :, None])
  np.testing.assert_array_equal((probs[..., :n_comp] > 0).all(1),
                                expected_comp)
  np.testing.assert_array_equal((probs[..., :n_comp] > 0).any(1),
                                expected_comp)
  # Window slot k of query t is position (t // w) w - w + k.
  win = probs[..., n_comp:]
  got = np.zeros((3, n, n), bool)
  for t in range(n):
    for slot in range(2 * w):
      j = (t // w) * w - w + slot
      if win[:, :, t, slot].any():
        assert 0 <= j < n
        got[:, t, j] = (win[:, :, t, slot] > 0).all(-1)
  band = (pos[None] <= pos[:, None]) & (pos[None] > pos[:, None] - w)
  np.testing.assert_array_equal(
      got, band[None] & mask[:, None, :] & mask[:, :, None])
  np.testing.assert_allclose(probs.sum(-1).transpose(0, 2, 1)[mask], 1.0,
                             rtol=1e-5)


# ------------------------------------------------------------- reductions


def _softmax_reference(variables, x, mask):
  """Full softmax attention over LN_L(K), LN_L(V), queries / sqrt(d)."""
  p = variables['params']
  x = np.asarray(x, np.float64)
  q = _dense(p, 'query', x)
  q = q / math.sqrt(q.shape[-1])
  k = _layer_norm(p, 'ln_local', _dense(p, 'key', x))
  v = _layer_norm(p, 'ln_local', _dense(p, 'value', x))
  logits = np.einsum('bnhd,bmhd->bhnm', q, k)
  probs = _masked_softmax(logits, mask[:, None, None, :], axis=-1)
  out = np.einsum('bhnm,bmhd->bnhd', probs, v)
  y = np.tensordot(out, np.asarray(p['out']['kernel'], np.float64),
                   axes=([-2, -1], [0, 1]))
  return y * mask[..., None]


def test_window_covering_everything_is_softmax_attention():
  x, mask = _inputs(12)
  layer = _layer(window_size=16, num_landmarks=0)
  variables = _init(layer, x, mask)
  np.testing.assert_allclose(np.asarray(_apply(layer, variables, x, mask)),
                             _softmax_reference(variables, x, mask),
                             rtol=2e-4, atol=2e-5)


def test_no_window_is_pure_dynamic_projection():
  x, mask = _inputs(10)
  layer = _layer(window_size=0, num_landmarks=3)
  variables = _init(layer, x, mask)
  p = variables['params']
  xd = np.asarray(x, np.float64)
  q = _dense(p, 'query', xd) / math.sqrt(FEATURES // HEADS)
  k = _layer_norm(p, 'ln_local', _dense(p, 'key', xd))
  v = _layer_norm(p, 'ln_local', _dense(p, 'value', xd))
  scores = np.tensordot(xd, np.asarray(p['landmark_scores']['kernel']),
                        axes=([-1], [0]))  # [b, n, h, r]
  proj = _masked_softmax(scores, mask[:, :, None, None], axis=1)
  k_bar = _layer_norm(p, 'ln_global', np.einsum('bnhr,bnhd->brhd', proj, k))
  v_bar = _layer_norm(p, 'ln_global', np.einsum('bnhr,bnhd->brhd', proj, v))
  probs = _masked_softmax(np.einsum('bnhd,brhd->bhnr', q, k_bar), True, -1)
  out = np.einsum('bhnr,brhd->bnhd', probs, v_bar)
  y = np.tensordot(out, np.asarray(p['out']['kernel']), axes=([-2, -1],
                                                              [0, 1]))
  np.testing.assert_allclose(np.asarray(_apply(layer, variables, x, mask)),
                             y * mask[..., None], rtol=2e-4, atol=2e-5)


def test_permutation_equivariance_without_window():
  x, mask = _inputs(10)
  layer = _layer(window_size=0, num_landmarks=3)
  variables = _init(layer, x, mask)
  perm = np.random.RandomState(0).permutation(10)
  y = np.asarray(_apply(layer, variables, x, mask))
  y_perm = np.asarray(_apply(layer, variables, x[:, perm], mask[:, perm]))
  np.testing.assert_allclose(y_perm, y[:, perm], rtol=1e-4, atol=1e-5)
  # The window breaks it: the same permutation changes the outputs.
  layer_w = _layer(window_size=2, num_landmarks=3)
  variables_w = _init(layer_w, x, mask)
  y_w = np.asarray(_apply(layer_w, variables_w, x, mask))
  y_w_perm = np.asarray(_apply(layer_w, variables_w, x[:, perm],
                               mask[:, perm]))
  assert np.abs(y_w_perm - y_w[:, perm]).max() > 1e-3


def test_dual_ln_is_joint_over_heads_and_normalises_projected_keys():
  x, mask = _inputs(12)
  layer = _layer(window_size=4, num_landmarks=3)
  variables = jax.jit(layer.init)(jax.random.PRNGKey(0), jnp.asarray(x),
                                  padding_mask=jnp.asarray(mask))
  p = variables['params']
  head_dim = FEATURES // HEADS
  for name in ('ln_local', 'ln_global'):
    assert p[name]['scale'].shape == (HEADS, head_dim)
    np.testing.assert_array_equal(p[name]['scale'], 1.0)
    np.testing.assert_array_equal(p[name]['bias'], 0.0)
  _, sown = _sown(layer, variables, x, mask)
  k_bar = sown['compressed_keys'].astype(np.float64)  # [batch, r, H, d]
  flat = k_bar.reshape(k_bar.shape[:2] + (-1,))
  np.testing.assert_allclose(flat.mean(-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(flat.var(-1), 1.0, rtol=1e-3)
  # Joint, not per head: single heads are not standardised on their own.
  assert np.abs(k_bar.mean(-1)).max() > 1e-2


# ---------------------------------------------------------------- causal


CAUSAL_CASES = [(3, 2, 4, 14), (4, 1, 2, 16), (0, 2, 3, 11), (5, 0, 16, 13),
                (1, 3, 5, 10)]


@pytest.mark.parametrize('w,r,l,n', CAUSAL_CASES)
def test_causal_jacobian_support(w, r, l, n):
  """d y_t / d x_j is non-zero exactly where the mechanism says."""
  x, _ = _inputs(n)
  mask = np.ones((1, n), bool)
  kw = dict(window_size=w, num_landmarks=r, causal=True)
  if r:
    kw['chunk_size'] = l
  layer = _layer(**kw)
  variables = _init(layer, x[:1], mask)
  jac = jax.jit(jax.jacrev(
      lambda a: layer.apply(variables, a[None], padding_mask=mask)[0]))(
          jnp.asarray(x[0]))  # [N, D, N, D]
  influence = np.abs(np.asarray(jac)).sum(axis=(1, 3))  # [t, j]
  pos = np.arange(n)
  expected = (pos[None] <= pos[:, None]) & (pos[None] > pos[:, None] - w)
  if r:
    # Earlier chunks, and the query itself once a chunk is visible.
    expected |= pos[None] < (pos[:, None] // l) * l
    expected |= np.diag(pos >= l)
  np.testing.assert_array_equal(influence > 0, expected)


def test_causal_prefix_consistency():
  n = 16
  x, mask = _inputs(n)
  layer = _layer(window_size=2, num_landmarks=2, causal=True, chunk_size=4)
  variables = _init(layer, x, mask)
  y = np.asarray(_apply(layer, variables, x, mask))
  for prefix in (8, 7):  # a multiple of l and w, and one padded internally
    y_prefix = np.asarray(_apply(layer, variables, x[:, :prefix],
                                 mask[:, :prefix]))
    np.testing.assert_allclose(y_prefix, y[:, :prefix], rtol=1e-5,
                               atol=1e-6)


# ----------------------------------------------------- padding and numerics


@pytest.mark.parametrize('causal', [False, True])
def test_any_padding_pattern_gives_finite_values_and_gradients(causal):
  n = 12
  x, mask = _inputs(n)
  mask = np.concatenate([mask, np.zeros((1, n), bool)])  # fully padded row
  x = np.concatenate([x, x[:1]])
  kw = dict(chunk_size=4) if causal else {}
  layer = _layer(window_size=3, num_landmarks=2, causal=causal, **kw)
  variables = _init(layer, x, mask)
  y = np.asarray(_apply(layer, variables, x, mask))
  assert np.all(np.isfinite(y))
  assert np.all(y[~mask] == 0.0)

  def loss(v, a):
    return jnp.sum(_apply(layer, v, a, mask) ** 2)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(variables, jnp.asarray(x))
  for g in jax.tree_util.tree_leaves(grads):
    assert np.all(np.isfinite(np.asarray(g)))
  assert np.all(np.asarray(grads[1])[~mask] == 0.0)


def test_sows_long_range_mass_metric():
  x, mask = _inputs(12)
  layer = _layer(window_size=4, num_landmarks=3)
  variables = _init(layer, x, mask)
  _, state = _apply(layer, variables, x, mask, mutable=['metrics'])
  (mass,) = state['metrics']['long_range_mass']
  assert 0.0 < float(mass) < 1.0


@pytest.mark.parametrize('kw,error,match', [
    (dict(window_size=0, num_landmarks=0), ValueError, 'nothing to attend'),
    (dict(window_size=-1), ValueError, '>= 0'),
    (dict(chunk_size=4), ValueError, 'causal=True'),
    (dict(conv_kernel_size=4), ValueError, 'odd'),
    (dict(conv_kernel_size=3, causal=True), NotImplementedError, 'causal'),
    (dict(chunk_size=0, causal=True), ValueError, 'chunk_size'),
    (dict(chunk_size=4, num_landmarks=0, causal=True), ValueError,
     'num_landmarks=0'),
    (dict(normalize_before_compress=True, num_landmarks=0), ValueError,
     'num_landmarks=0'),
])
def test_invalid_knobs_raise(kw, error, match):
  x, mask = _inputs(8)
  with pytest.raises(error, match=match):
    _layer(**kw).init(jax.random.PRNGKey(0), x, padding_mask=mask)


# ---------------------------------------------------------------- configs


def _config(task, arg=None):
  path = os.path.join(ROOT, 'configs', task, 'long_short.py')
  return config_lib.load_sibling(path, 'long_short').get_config(arg)


@pytest.mark.parametrize('task,w,r', [('listops', 16, 2), ('text', 1, 1),
                                      ('retrieval', 1, 254)])
def test_best_configs_follow_the_paper(task, w, r):
  fixed = _config(task, 'xiong')
  assert fixed.protocol == 'xiong'
  assert (fixed.model.attention_kw.window_size,
          fixed.model.attention_kw.num_landmarks) == (8, 32)
  best = _config(task, 'xiong,best')
  validation.validate(best)
  assert (best.model.attention_kw.window_size,
          best.model.attention_kw.num_landmarks) == (w, r)
  best_local = _config(task, 'best,xiong,runlocal')
  validation.validate(best_local)
  assert best_local.model.attention_kw.to_dict() == (
      best.model.attention_kw.to_dict())


@pytest.mark.parametrize('task', ['image', 'pathfinder'])
def test_best_is_unknown_for_image_tasks(task):
  with pytest.raises(ValueError, match='Table 7'):
    _config(task, 'xiong,best')


def test_best_needs_the_paper_protocol():
  with pytest.raises(ValueError, match='xiong'):
    _config('listops', 'best')
