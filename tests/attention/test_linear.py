"""Linear Transformer (`linear`): a dense float64 reference and invariants.

The reference builds the N x N kernel matrix A_ij = phi(q_i) . phi(k_j) with
phi = elu + 1 explicitly (paper Eq. 4-7), masks padded keys (and, causally,
j > i), and normalises each row by its sum plus the official epsilon.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention import linear
from lra_msmra.attention.linear import LinearAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2


def _inputs(length, seed=0):
  return ref.inputs(length, FEATURES, seed, holes=(0, 3, 4, length - 1))


_init = ref.init
_apply = ref.call
_dense = ref.dense


def _elu1(x):
  return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def dense_linear(variables, x, mask, causal=False):
  """Linear attention with an explicit [batch, heads, N, N] kernel matrix."""
  p = variables['params']
  x = np.asarray(x, np.float64)
  n = x.shape[1]
  q, k, v = (_dense(p, name, x) for name in ('query', 'key', 'value'))
  a = np.einsum('bihm,bjhm->bhij', _elu1(q), _elu1(k))
  valid = mask[:, None, None, :]
  if causal:
    valid = valid & np.tril(np.ones((n, n), bool))[None, None]
  a = np.where(valid, a, 0.0)
  weights = a / (a.sum(-1, keepdims=True) + linear.EPSILON)
  out = np.einsum('bhij,bjhd->bihd', weights, v) * mask[:, :, None, None]
  y = np.tensordot(out, np.asarray(p['out']['kernel'], np.float64),
                   axes=([-2, -1], [0, 1]))
  if 'bias' in p['out']:
    y = y + np.asarray(p['out']['bias'], np.float64)
  return y * mask[..., None]  # padded query rows are zero


CASES = [dict(n=12), dict(n=13, use_bias=True), dict(n=7, causal=True),
         dict(n=16, causal=True, use_bias=True)]


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_dense_reference(case):
  case = dict(case)
  n = case.pop('n')
  x, mask = _inputs(n)
  layer = LinearAttention(num_heads=HEADS, **case)
  variables = _init(layer, x, mask)
  y = np.asarray(_apply(layer, variables, x, mask))
  expected = dense_linear(variables, x, mask, case.get('causal', False))
  np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('causal', [False, True])
def test_gradients_match_finite_differences_of_dense_reference(causal):
  n = 9
  x, mask = _inputs(n, seed=3)
  layer = LinearAttention(num_heads=HEADS, causal=causal, use_bias=True)
  variables = _init(layer, x, mask)
  ref.check_gradients(
      layer, variables, x, mask,
      lambda v, a: dense_linear(v, a, mask, causal),
      seed=1, rtol=1e-3)


def test_last_causal_row_is_the_bidirectional_row():
  """Query N-1 sees every key in both forms: the two outputs agree there."""
  x, _ = _inputs(10)
  mask = np.ones((3, 10), bool)
  bi = LinearAttention(num_heads=HEADS)
  variables = _init(bi, x, mask)
  y_bi = np.asarray(_apply(bi, variables, x, mask))
  y_causal = np.asarray(_apply(LinearAttention(num_heads=HEADS, causal=True),
                               variables, x, mask))
  np.testing.assert_allclose(y_causal[:, -1], y_bi[:, -1], rtol=1e-5,
                             atol=1e-6)
  assert np.abs(y_causal[:, 0] - y_bi[:, 0]).max() > 1e-3


def test_permutation_equivariance():
  """No positions inside the layer: permuting tokens permutes outputs."""
  x, mask = _inputs(10)
  layer = LinearAttention(num_heads=HEADS)
  variables = _init(layer, x, mask)
  perm = np.random.RandomState(0).permutation(10)
  y = np.asarray(_apply(layer, variables, x, mask))
  y_perm = np.asarray(_apply(layer, variables, x[:, perm], mask[:, perm]))
  np.testing.assert_allclose(y_perm, y[:, perm], rtol=1e-4, atol=1e-5)


def test_constant_values_pass_through():
  """The weights of a row sum to 1 (up to eps): equal values come out as is.

  With W_v = 0 and a value bias b, every value is b, so (before the output
  projection) every real row returns b * s / (s + eps) with s its weight sum.
  """
  x, mask = _inputs(11)
  layer = LinearAttention(num_heads=HEADS, use_bias=True)
  variables = _init(layer, x, mask)
  p = dict(variables['params'])
  p['value'] = {'kernel': jnp.zeros_like(p['value']['kernel']),
                'bias': p['value']['bias']}
  p['out'] = {'kernel': jnp.eye(FEATURES).reshape(HEADS, -1, FEATURES),
              'bias': jnp.zeros(FEATURES)}
  y = np.asarray(_apply(layer, {'params': p}, x, mask))
  expected = np.asarray(p['value']['bias']).reshape(-1)
  np.testing.assert_allclose(y[mask], np.broadcast_to(expected, y[mask].shape),
                             rtol=1e-5)
  assert np.all(y[~mask] == 0.0)


@pytest.mark.parametrize('causal', [False, True])
def test_any_padding_pattern_gives_finite_values_and_gradients(causal):
  n = 12
  x, mask = ref.with_padded_row(*_inputs(n))
  layer = LinearAttention(num_heads=HEADS, causal=causal)
  ref.check_any_padding(layer, _init(layer, x, mask), x, mask)


def test_causal_scan_with_log_scales_is_exact_and_overflow_free():
  """`causal_kernel_sums` with huge key scales: ratio as with exp(s) taken
  literally in float64, and no inf or NaN."""
  rng = np.random.RandomState(0)
  b, n, h, m, d = 2, 7, 2, 3, 4
  phi_q = rng.uniform(0.1, 1.0, (b, n, h, m))
  phi_k = rng.uniform(0.1, 1.0, (b, n, h, m))
  v = rng.standard_normal((b, n, h, d))
  s = rng.uniform(0, 200, (b, n, h))  # exp(200) overflows float32
  valid = np.ones((b, n), bool)
  valid[1, [0, 4]] = False
  num, den = linear.causal_kernel_sums(*(jnp.asarray(a, jnp.float32) for a in
                                         (phi_q, phi_k, v)),
                                       jnp.asarray(valid),
                                       jnp.asarray(s, jnp.float32))
  num, den = np.asarray(num), np.asarray(den)
  assert np.all(np.isfinite(num)) and np.all(np.isfinite(den))
  w = np.exp(s - s.max())[..., None] * phi_k * valid[:, :, None, None]
  tril = np.tril(np.ones((n, n)))
  ref_num = np.einsum('ij,bihm,bjhm,bjhd->bihd', tril, phi_q, w, v)
  ref_den = np.einsum('ij,bihm,bjhm->bih', tril, phi_q, w)
  has = den > 0
  np.testing.assert_allclose((num / np.where(has, den, 1)[..., None])[has],
                             (ref_num / np.where(has, ref_den, 1)[..., None]
                              )[has], rtol=1e-4, atol=1e-5)
  assert np.all(den[1, 0] == 0.0)  # no valid key yet


def test_data_parallel_mesh():
  """Forward and gradients on the data-parallel mesh equal one device's
  (the causal scan)."""
  x, mask = _inputs(13)
  layer = LinearAttention(num_heads=HEADS, causal=True)
  ref.check_mesh(layer, _init(layer, x, mask), x, mask)
