"""Sparse Transformer (fixed pattern): a dense float64 reference and its
invariants.

The pattern below is written from the paper's A(1) and A(2) sets and the
official code's reading of them (summary offsets 0 and l - c .. l - 1, every
pattern causal, the CLS row and column open), one (i, j) pair at a time.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention.softmax import SoftmaxAttention
from lra_msmra.attention.sparse import SparseAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2


def allowed(n, block_size, summary_size, num_prefix_tokens=0,
            pattern_causal=True, causal=False):
  l, c, p = block_size, summary_size, num_prefix_tokens
  out = np.zeros((n, n), bool)
  for i in range(n):
    for j in range(n):
      if i < p or j < p:
        ok = True
      else:
        a, b = i - p, j - p
        ok = (a // l == b // l) or (b % l == 0) or (b % l >= l - c)
        if pattern_causal:
          ok = ok and b <= a
      if causal:
        ok = ok and j <= i
      out[i, j] = ok
  return out


CASES = [
    dict(n=16, block_size=4, summary_size=1),
    dict(n=13, block_size=4, summary_size=2, use_bias=True),
    dict(n=13, block_size=5, summary_size=1, pattern_causal=False),
    dict(n=14, block_size=3, summary_size=0, num_prefix_tokens=1),
    dict(n=14, block_size=4, summary_size=1, num_prefix_tokens=2,
         pattern_causal=False, use_bias=True),
    dict(n=12, block_size=4, summary_size=1, num_prefix_tokens=1,
         causal=True),
    dict(n=11, block_size=4, summary_size=2, pattern_causal=False,
         causal=True),
    dict(n=7, block_size=20, summary_size=3),
    dict(n=9, block_size=4, summary_size=4, pattern_causal=False),
]


def _setup(case, seed=0):
  case = dict(case)
  n = case.pop('n')
  x, mask = ref.inputs(n, FEATURES, seed)
  layer = SparseAttention(num_heads=HEADS, **case)
  case.pop('use_bias', None)
  return layer, ref.init(layer, x, mask, seed), x, mask, allowed(n, **case)


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_dense_reference(case):
  layer, variables, x, mask, pattern = _setup(case)
  y = ref.apply(layer, variables, x, mask)
  expected = ref.dense_attention(variables, x, mask, pattern)
  np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('index', [1, 4])
def test_gradients_match_finite_differences(index):
  layer, variables, x, mask, pattern = _setup(CASES[index], seed=index)
  ref.check_gradients(
      layer, variables, x, mask,
      lambda v, a: ref.dense_attention(v, a, mask, pattern), seed=index)


def test_official_pattern_at_lra_sizes():
  """l = 50, c = 10 with CLS: the rows of a few queries, by hand."""
  pattern = allowed(200, 50, 10, num_prefix_tokens=1)
  # Query 120 (offset 119: block 2): its block 100..119 up to itself, the
  # summary keys 1, 41..50, 51, 91..100 (offsets 0, 40..49, 50, 90..99),
  # and the CLS key 0.
  expected = {0, 1, 51} | set(range(41, 51)) | set(range(91, 101)) | set(
      range(101, 121))
  assert set(np.nonzero(pattern[120])[0]) == expected
  assert pattern[0].all() and pattern[:, 0].all()


# (True, True) adds nothing to (True, False) and (False, True): both are
# causal softmax already.
@pytest.mark.parametrize('pattern_causal,causal', [
    (False, False), (True, False), (False, True)])
def test_one_block_is_softmax(pattern_causal, causal):
  """l >= N: one block, so (causal) softmax attention on real tokens."""
  x, mask = ref.inputs(12, FEATURES)
  layer = SparseAttention(num_heads=HEADS, block_size=12, summary_size=2,
                          pattern_causal=pattern_causal, causal=causal)
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)
  y_soft = ref.apply(
      SoftmaxAttention(num_heads=HEADS, causal=causal or pattern_causal),
      variables, x, mask)
  np.testing.assert_allclose(y[mask], y_soft[mask], rtol=1e-5, atol=1e-6)


def test_every_key_a_summary_is_softmax():
  """c = l: every key is a summary key; symmetric -> full softmax."""
  x, mask = ref.inputs(13, FEATURES)
  layer = SparseAttention(num_heads=HEADS, block_size=4, summary_size=4,
                          pattern_causal=False, num_prefix_tokens=1)
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)
  y_soft = ref.apply(SoftmaxAttention(num_heads=HEADS), variables, x, mask)
  np.testing.assert_allclose(y[mask], y_soft[mask], rtol=1e-5, atol=1e-6)


def test_padding_invariance():
  x, mask = ref.inputs(13, FEATURES)
  layer = SparseAttention(num_heads=HEADS, block_size=4, summary_size=1,
                          num_prefix_tokens=1, use_bias=True)
  ref.check_padding_invariance(layer, ref.init(layer, x, mask), x, mask)


def test_data_parallel_mesh():
  x, mask = ref.inputs(13, FEATURES)
  layer = SparseAttention(num_heads=HEADS, block_size=4, summary_size=1,
                          num_prefix_tokens=1)
  ref.check_mesh(layer, ref.init(layer, x, mask), x, mask)


def test_knobs_are_checked():
  x, mask = ref.inputs(8, FEATURES)
  for kw, match in (({'block_size': 0}, 'block_size'),
                    ({'summary_size': 60}, 'summary_size'),
                    ({'num_prefix_tokens': -1}, 'num_prefix_tokens')):
    with pytest.raises(ValueError, match=match):
      SparseAttention(num_heads=HEADS, **kw).init(
          {}, jnp.asarray(x), padding_mask=mask)
