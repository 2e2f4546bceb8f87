"""Longformer: a dense float64 reference and its invariants.

The reference applies the paper's and the official code's rules densely:
non-global queries see the window [i - left + 1, i + right] (right = w // 2,
left = w - right) and the global keys with the window projections; global
queries see every key with the global projections.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention.longformer import LongformerAttention
from lra_msmra.attention.softmax import SoftmaxAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2


def window_pattern(n, window_size, num_global_tokens=0, causal=False):
  right = window_size // 2
  left = window_size - right
  pos = np.arange(n)
  diff = pos[None, :] - pos[:, None]  # key - query
  out = (diff > -left) & (diff <= right)
  out |= pos[None, :] < num_global_tokens
  if causal:
    out &= diff <= 0
  return out


def dense_longformer(variables, x, mask, *, window_size, num_global_tokens=0,
                     global_projections=True, causal=False):
  p = variables['params']
  x = np.asarray(x, np.float64)
  n = x.shape[1]
  q, k, v = ref.qkv(p, x)
  visible = window_pattern(n, window_size, num_global_tokens, causal)
  out = ref.attention_rows(q, k, v, visible[None, None] & mask[:, None, None])
  g = num_global_tokens
  if g:
    names = (('query_global', 'key_global', 'value_global')
             if global_projections else ('query', 'key', 'value'))
    qg, kg, vg = ref.qkv(p, x, names)
    full = np.ones((n, n), bool)
    if causal:
      full = np.tril(full)
    out_g = ref.attention_rows(qg, kg, vg,
                               full[None, None] & mask[:, None, None])
    out[:, :g] = out_g[:, :g]
  return ref.output(p, out, mask)


CASES = [
    dict(n=16, window_size=4),
    dict(n=13, window_size=5, use_bias=True),
    dict(n=13, window_size=3, causal=True),
    dict(n=14, window_size=4, num_global_tokens=2),
    dict(n=13, window_size=6, num_global_tokens=1, global_projections=False,
         use_bias=True),
    dict(n=12, window_size=5, num_global_tokens=2, causal=True),
    dict(n=9, window_size=1),
    dict(n=7, window_size=40, num_global_tokens=3),
]


def _setup(case, seed=0):
  case = dict(case)
  n = case.pop('n')
  x, mask = ref.inputs(n, FEATURES, seed)
  layer = LongformerAttention(num_heads=HEADS, **case)
  case.pop('use_bias', None)
  return layer, ref.init(layer, x, mask, seed), x, mask, case


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_dense_reference(case):
  layer, variables, x, mask, kw = _setup(case)
  y = ref.apply(layer, variables, x, mask)
  np.testing.assert_allclose(y, dense_longformer(variables, x, mask, **kw),
                             rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('index', [1, 5])
def test_gradients_match_finite_differences(index):
  layer, variables, x, mask, kw = _setup(CASES[index], seed=index)
  ref.check_gradients(
      layer, variables, x, mask,
      lambda v, a: dense_longformer(v, a, mask, **kw), seed=index)


def test_window_sides_follow_the_official_code():
  # w = 4: right = 2, left = 2 (itself and one before); w = 5: 3 and 2.
  assert set(np.nonzero(window_pattern(20, 4)[10])[0]) == {9, 10, 11, 12}
  assert set(np.nonzero(window_pattern(20, 5)[10])[0]) == {8, 9, 10, 11, 12}


# The smallest covering window (2N) and a wider one, one of them causal.
@pytest.mark.parametrize('extra,causal', [(0, False), (3, True)])
def test_window_covering_the_sequence_is_softmax(extra, causal):
  n = 12
  x, mask = ref.inputs(n, FEATURES)
  layer = LongformerAttention(num_heads=HEADS, window_size=2 * n + extra,
                              causal=causal)
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)
  y_soft = ref.apply(SoftmaxAttention(num_heads=HEADS, causal=causal),
                     variables, x, mask)
  np.testing.assert_allclose(y[mask], y_soft[mask], rtol=1e-5, atol=1e-6)


def test_all_tokens_global_is_softmax():
  n = 11
  x, mask = ref.inputs(n, FEATURES)
  layer = LongformerAttention(num_heads=HEADS, window_size=2,
                              num_global_tokens=n, global_projections=False)
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)
  y_soft = ref.apply(SoftmaxAttention(num_heads=HEADS), variables, x, mask)
  np.testing.assert_allclose(y[mask], y_soft[mask], rtol=1e-5, atol=1e-6)


def test_global_token_reaches_every_query():
  """A far query depends on the global token but not on a far non-global one."""
  n = 20
  x, _ = ref.inputs(n, FEATURES)
  mask = np.ones((3, n), bool)
  layer = LongformerAttention(num_heads=HEADS, window_size=3,
                              num_global_tokens=1)
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)
  for pos, reached in ((0, True), (1, False)):
    x2 = x.copy()
    x2[:, pos] += 1.0
    moved = np.abs(ref.apply(layer, variables, x2, mask) - y)[:, 15].max()
    assert (moved > 1e-4) == reached


def test_no_global_parameters_without_global_tokens():
  x, mask = ref.inputs(8, FEATURES)
  params = ref.params(LongformerAttention(num_heads=HEADS, window_size=4), x,
                      mask)
  assert sorted(params) == ['key', 'out', 'query', 'value']


def test_padding_invariance():
  x, mask = ref.inputs(13, FEATURES)
  layer = LongformerAttention(num_heads=HEADS, window_size=4,
                              num_global_tokens=1, use_bias=True)
  ref.check_padding_invariance(layer, ref.init(layer, x, mask), x, mask)


def test_data_parallel_mesh():
  x, mask = ref.inputs(13, FEATURES)
  layer = LongformerAttention(num_heads=HEADS, window_size=4,
                              num_global_tokens=1)
  ref.check_mesh(layer, ref.init(layer, x, mask), x, mask)


def test_knobs_are_checked():
  x, mask = ref.inputs(8, FEATURES)
  for kw, match in (({'window_size': 0}, 'window_size'),
                    ({'num_global_tokens': -1}, 'num_global_tokens')):
    with pytest.raises(ValueError, match=match):
      LongformerAttention(num_heads=HEADS, **kw).init(
          {}, jnp.asarray(x), padding_mask=mask)
