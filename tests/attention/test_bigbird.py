"""BigBird (ITC): a dense float64 reference and its invariants.

The dense pattern is written from the paper's blocked ITC rules (global
first and last blocks, window of three blocks, random blocks); the random
blocks themselves are the module's draw (`bigbird.random_blocks`), whose
own properties are tested separately.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention import bigbird
from lra_msmra.attention.bigbird import BigBirdAttention
from lra_msmra.attention.softmax import SoftmaxAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2


def allowed(length, block_size, chosen):
  """`[heads, N, N]` from the ITC rules; `chosen` `[heads, nb - 2, r]`."""
  b = block_size
  n = -(-length // b) * b
  nb = n // b
  block = np.arange(n) // b
  out = np.zeros((chosen.shape[0], n, n), bool)
  for h in range(chosen.shape[0]):
    for i in range(n):
      for j in range(n):
        bi, bj = block[i], block[j]
        out[h, i, j] = (nb <= 3 or bi in (0, nb - 1) or bj in (0, nb - 1)
                        or abs(int(bi) - int(bj)) <= 1
                        or bj in chosen[h, bi - 1])
  return out[:, :length, :length]


def _chosen(length, **kw):
  b = kw.get('block_size', bigbird.DEFAULT_BLOCK_SIZE)
  nb = -(-length // b)
  return bigbird.random_blocks(
      nb, b, kw.get('num_random_blocks', bigbird.DEFAULT_NUM_RANDOM_BLOCKS),
      HEADS, kw.get('random_limit', bigbird.DEFAULT_RANDOM_LIMIT),
      bigbird.layer_seed((), kw.get('seed', 0)))


CASES = [
    dict(n=16, block_size=2, num_random_blocks=1),
    dict(n=13, block_size=2, num_random_blocks=2, use_bias=True),
    dict(n=20, block_size=2, num_random_blocks=2, random_limit=10, seed=3),
    dict(n=12, block_size=3, num_random_blocks=3),
    dict(n=15, block_size=2, num_random_blocks=0),
    dict(n=7, block_size=3, num_random_blocks=2),
]


def _setup(case, seed=0):
  case = dict(case)
  n = case.pop('n')
  x, mask = ref.inputs(n, FEATURES, seed)
  layer = BigBirdAttention(num_heads=HEADS, **case)
  case.pop('use_bias', None)
  pattern = allowed(n, case['block_size'], _chosen(n, **case))
  return layer, ref.init(layer, x, mask, seed), x, mask, pattern


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_dense_reference(case):
  layer, variables, x, mask, pattern = _setup(case)
  y = ref.apply(layer, variables, x, mask)
  expected = ref.dense_attention(variables, x, mask, pattern)
  np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('index', [1, 2])
def test_gradients_match_finite_differences(index):
  layer, variables, x, mask, pattern = _setup(CASES[index], seed=index)
  ref.check_gradients(
      layer, variables, x, mask,
      lambda v, a: ref.dense_attention(v, a, mask, pattern), seed=index)


def test_random_blocks_follow_the_itc_rules():
  nb, b, r = 40, 64, 3
  chosen = bigbird.random_blocks(nb, b, r, 4, 1024, seed=5)
  assert chosen.shape == (4, nb - 2, r)
  for h in range(4):
    for g in range(nb - 2):
      i = g + 1
      picks = chosen[h, g]
      assert len(set(picks)) == r and (picks >= 0).all()
      # Never global, never in the window, within the first 1024 positions.
      assert all(1 <= c and (c + 1) * b <= 1024 and abs(c - i) > 1
                 for c in picks)
  assert not (chosen[0] == chosen[1]).all()  # heads draw independently.
  np.testing.assert_array_equal(
      chosen, bigbird.random_blocks(nb, b, r, 4, 1024, seed=5))
  # No limit: blocks anywhere except the global ones.
  free = bigbird.random_blocks(nb, b, r, 4, None, seed=5)
  assert free.max() == nb - 2 and free.min() >= 1
  # Fewer candidates than r: the rest of the slots are unused (-1).
  few = bigbird.random_blocks(6, 2, 3, 1, None, seed=0)
  assert (few[0, 0] == -1).sum() == 1  # block 1: candidates 3 and 4.


def test_pattern_is_fixed_per_layer_and_differs_between_layers():
  assert bigbird.layer_seed(('block_0', 'attention'), 0) == bigbird.layer_seed(
      ('block_0', 'attention'), 0)
  assert bigbird.layer_seed(('block_0', 'attention'), 0) != bigbird.layer_seed(
      ('block_1', 'attention'), 0)
  assert bigbird.layer_seed(('block_0',), 0) != bigbird.layer_seed(
      ('block_0',), 1)


@pytest.mark.parametrize('block_size', [5, 30])  # 3 blocks; one block > N
def test_three_blocks_or_fewer_is_softmax(block_size):
  x, mask = ref.inputs(12, FEATURES)
  layer = BigBirdAttention(num_heads=HEADS, block_size=block_size)
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)
  y_soft = ref.apply(SoftmaxAttention(num_heads=HEADS), variables, x, mask)
  np.testing.assert_allclose(y[mask], y_soft[mask], rtol=1e-5, atol=1e-6)


def test_global_blocks_reach_every_query_and_see_every_key():
  n, b = 24, 2
  x, _ = ref.inputs(n, FEATURES)
  mask = np.ones((3, n), bool)
  layer = BigBirdAttention(num_heads=HEADS, block_size=b, num_random_blocks=0)
  variables = ref.init(layer, x, mask)
  y = ref.apply(layer, variables, x, mask)

  def moved(pos):
    x2 = x.copy()
    x2[:, pos] += 1.0
    return np.abs(ref.apply(layer, variables, x2, mask) - y).max(axis=(0, 2))
  assert (moved(0) > 1e-5).all() and (moved(n - 1) > 1e-5).all()
  far = moved(12)  # block 6: reaches blocks 5-7 and both global blocks.
  np.testing.assert_array_equal(np.nonzero(far > 1e-6)[0],
                                [0, 1, 10, 11, 12, 13, 14, 15, 22, 23])


def test_causal_is_refused():
  x, mask = ref.inputs(8, FEATURES)
  with pytest.raises(NotImplementedError, match='softmax'):
    BigBirdAttention(num_heads=HEADS, causal=True).init(
        jax.random.PRNGKey(0), jnp.asarray(x), padding_mask=mask)


def test_padding_invariance():
  x, mask = ref.inputs(15, FEATURES)
  layer = BigBirdAttention(num_heads=HEADS, block_size=2, num_random_blocks=2,
                           use_bias=True)
  ref.check_padding_invariance(layer, ref.init(layer, x, mask), x, mask)


def test_data_parallel_mesh():
  x, mask = ref.inputs(15, FEATURES)
  layer = BigBirdAttention(num_heads=HEADS, block_size=2, num_random_blocks=2)
  ref.check_mesh(layer, ref.init(layer, x, mask), x, mask)


def test_knobs_are_checked():
  x, mask = ref.inputs(8, FEATURES)
  for kw, match in (({'block_size': 0}, 'block_size'),
                    ({'num_random_blocks': -1}, 'num_random_blocks'),
                    ({'random_limit': 0}, 'random_limit')):
    with pytest.raises(ValueError, match=match):
      BigBirdAttention(num_heads=HEADS, **kw).init(
          {}, jnp.asarray(x), padding_mask=mask)
