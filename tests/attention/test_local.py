"""Local attention: a dense float64 reference and its invariants.

The reference (`tests/attention/sparse_reference.py`) is plain softmax
attention in numpy with an explicit N x N pattern; here the pattern is
written from the rules: same contiguous block, or, for the official code's
grouping, the same column of `arange(N').reshape(B, N' / B)`.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention.local import LocalAttention
from lra_msmra.attention.softmax import SoftmaxAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2


def allowed(n, block, grouping, causal):
  pos = np.arange(n)
  if grouping == 'strided':
    n_pad = (n // block + 1) * block
    column = np.empty(n_pad, int)
    table = np.arange(n_pad).reshape(block, n_pad // block)
    for col in range(table.shape[1]):
      column[table[:, col]] = col
    group = column[:n]
  else:
    group = pos // block
  mask = group[:, None] == group[None, :]
  if causal:
    mask &= pos[None, :] <= pos[:, None]
  return mask


CASES = [
    dict(n=16, block_size=4),
    dict(n=13, block_size=4, use_bias=True),
    dict(n=13, block_size=5, causal=True),
    dict(n=7, block_size=1),
    dict(n=9, block_size=20),
    dict(n=16, block_size=4, grouping='strided'),
    dict(n=13, block_size=3, grouping='strided', causal=True, use_bias=True),
    dict(n=11, block_size=6, grouping='strided'),
]


def _layer(**kw):
  return LocalAttention(num_heads=HEADS, **kw)


def _setup(case, seed=0):
  case = dict(case)
  n = case.pop('n')
  x, mask = ref.inputs(n, FEATURES, seed)
  layer = _layer(**case)
  pattern = allowed(n, case['block_size'], case.get('grouping', 'contiguous'),
                    case.get('causal', False))
  return layer, ref.init(layer, x, mask, seed), x, mask, pattern


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_dense_reference(case):
  layer, variables, x, mask, pattern = _setup(case)
  y = ref.apply(layer, variables, x, mask)
  expected = ref.dense_attention(variables, x, mask, pattern)
  np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('index', [1, 6])
def test_gradients_match_finite_differences(index):
  layer, variables, x, mask, pattern = _setup(CASES[index], seed=index)
  ref.check_gradients(
      layer, variables, x, mask,
      lambda v, a: ref.dense_attention(v, a, mask, pattern), seed=index)


# Strided needs B > N: the official padding then leaves one group. Each
# grouping is checked at the smallest covering block and a larger one, one
# of them causal.
@pytest.mark.parametrize('grouping,extra,causal', [
    ('contiguous', 0, False), ('contiguous', 5, True),
    ('strided', 1, True), ('strided', 5, False)])
def test_block_covering_the_sequence_is_softmax(grouping, extra, causal):
  n = 12
  x, mask = ref.inputs(n, FEATURES)
  layer = _layer(block_size=n + extra, grouping=grouping, causal=causal)
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)
  y_soft = ref.apply(SoftmaxAttention(num_heads=HEADS, causal=causal),
                     variables, x, mask)
  # Softmax lets padded queries attend (LRA); only real rows are compared.
  np.testing.assert_allclose(y[mask], y_soft[mask], rtol=1e-5, atol=1e-6)


def test_blocks_are_independent():
  """Changing one block's inputs changes no other block's outputs."""
  x, mask = ref.inputs(12, FEATURES)
  mask = np.ones_like(mask)
  layer = _layer(block_size=4)
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)
  x2 = x.copy()
  x2[:, 4:8] += 1.0
  y2 = ref.apply(layer, variables, x2, mask)
  np.testing.assert_array_equal(y2[:, :4], y[:, :4])
  np.testing.assert_array_equal(y2[:, 8:], y[:, 8:])
  assert np.abs(y2[:, 4:8] - y[:, 4:8]).max() > 1e-3


def test_strided_groups_are_the_official_reshape():
  """Strided: N = 10, B = 4 -> N' = 12, G = 3: position p joins p mod 3."""
  x, mask = ref.inputs(10, FEATURES)
  mask = np.ones_like(mask)
  layer = _layer(block_size=4, grouping='strided')
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)
  x2 = x.copy()
  x2[:, 4] += 1.0  # group 1: positions 1, 4, 7 (and padded 10).
  changed = np.abs(ref.apply(layer, variables, x2, mask) - y).max(axis=(0, 2))
  np.testing.assert_array_equal(np.nonzero(changed)[0], [1, 4, 7])


@pytest.mark.parametrize('grouping', ['contiguous', 'strided'])
def test_padding_invariance(grouping):
  x, mask = ref.inputs(13, FEATURES)
  layer = _layer(block_size=4, grouping=grouping, use_bias=True)
  ref.check_padding_invariance(layer, ref.init(layer, x, mask), x, mask)


def test_data_parallel_mesh():
  x, mask = ref.inputs(13, FEATURES)
  layer = _layer(block_size=4, dropout_rate=0.0)
  ref.check_mesh(layer, ref.init(layer, x, mask), x, mask)


def test_knobs_are_checked():
  x, mask = ref.inputs(8, FEATURES)
  with pytest.raises(ValueError, match='block_size'):
    _layer(block_size=0).init({}, jnp.asarray(x), padding_mask=mask)
  with pytest.raises(ValueError, match='grouping'):
    _layer(grouping='dilated').init({}, jnp.asarray(x), padding_mask=mask)
