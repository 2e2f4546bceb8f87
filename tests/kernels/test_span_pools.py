"""Combiner's span pools as kernels (`lra_msmra.kernels.span_pools`).

They must equal `combiner_spans.prefix_pool` (the 'xla' implementation's
pools) on every line of a 'bnhd' operand, with or without a fold, in
both directions and both kinds, with gradients, in the interpreter (the
form GPUs run) and in the TPU form (XLA's pools).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.kernels import combiner_spans
from lra_msmra.kernels import flash
from lra_msmra.kernels import span_pools

pytestmark = pytest.mark.xdist_group('kernels-combiner')

ROWS, LENGTH, HEADS, WIDTH = 2, 24, 2, 16


def _reference(xs, valid, kind, directions, fold):
  """`combiner_spans.prefix_pool` on each line: operand `[rows, L, fold
  * H, d]`, line b * fold + f."""
  outs = []
  for x in xs:
    grid = x.reshape(ROWS, LENGTH, fold, HEADS, WIDTH)
    member = jnp.swapaxes(valid.reshape(ROWS, fold, LENGTH), 1, 2)
    for direction in directions:
      pooled, _ = combiner_spans.prefix_pool(
          grid, member[..., None, None], axis=1, kind=kind,
          reverse=direction == 'suffix')
      outs.append(pooled.reshape(x.shape))
  return tuple(outs)


def _inputs(fold, dtype, ties):
  ks = jax.random.split(jax.random.PRNGKey(fold), 2)
  shape = (ROWS, LENGTH, fold * HEADS, WIDTH)
  xs = tuple(jax.random.normal(k, shape).astype(dtype) for k in ks)
  if ties:  # Equal maxima, as ReLU'd DeepSets give: the first takes all.
    xs = tuple(jnp.maximum(x, 0) for x in xs)
  valid = np.random.RandomState(fold).rand(ROWS * fold, LENGTH) > 0.3
  valid[0] = False  # A line without members.
  valid[1, :5] = False
  return xs, jnp.asarray(valid)


@pytest.mark.parametrize('form', ['interpreter', 'tpu'])
@pytest.mark.parametrize('kind', ['max', 'mean'])
@pytest.mark.parametrize('directions', [('prefix',), ('prefix', 'suffix')],
                         ids=['prefix', 'both'])
@pytest.mark.parametrize('fold', [1, 3])
def test_pools_equal_xla_with_gradients(form, kind, directions, fold,
                                        monkeypatch):
  monkeypatch.setattr(flash, 'INTERPRET_TPU_FORM', form == 'tpu')
  xs, valid = _inputs(fold, jnp.float32, ties=False)
  run = lambda *xs: span_pools.pools(xs, valid, kind=kind,
                                     directions=directions, heads=HEADS,
                                     fold=fold)
  ref = lambda *xs: _reference(xs, valid, kind, directions, fold)
  got, want = jax.jit(run)(*xs), ref(*xs)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
  cots = [jax.random.normal(jax.random.PRNGKey(9 + i), w.shape)
          for i, w in enumerate(want)]
  loss = lambda f: lambda *xs: sum(jnp.sum(o * c) for o, c in zip(f(*xs),
                                                                  cots))
  got = jax.jit(jax.grad(loss(run), (0, 1)))(*xs)
  want = jax.grad(loss(ref), (0, 1))(*xs)
  for g, w in zip(got, want):
    assert float(jnp.abs(w).max()) > 0.1
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_equal_maxima_give_their_gradient_to_the_first():
  """XLA's cumulative maximum splits a tie's gradient by its scan's tree;
  the kernel gives it to the first member of the maximum: the same total
  per line, and the same where there is no tie."""
  xs, valid = _inputs(1, jnp.float32, ties=True)
  x = xs[0][:, :, :, :1]  # One feature: many lines tie at 0.
  x = jnp.concatenate([x] + [jnp.zeros_like(x)] * 15, -1)
  run = lambda x: span_pools.pools((x,), valid, kind='max',
                                   directions=('prefix',), heads=HEADS)[0]
  grad = jax.jit(jax.grad(lambda x: jnp.sum(run(x))))(x)
  # Each position after a line's first member passes its 1 to one member:
  # the first that reached the maximum so far.
  g = np.asarray(grad)[..., 0]
  v = np.asarray(valid)
  for b in range(ROWS):
    for h in range(HEADS):
      members = np.nonzero(v[b])[0]
      if members.size == 0:
        assert np.all(g[b, :, h] == 0)
        continue
      # Positions after the first member all have a pool.
      assert np.isclose(g[b, :, h].sum(), LENGTH - 1 - members[0])
      firsts = [j for i, j in enumerate(members)
                if np.all(x[b, members[:i], h, 0] < x[b, j, h, 0])]
      assert set(np.nonzero(g[b, :, h])[0]) <= set(firsts)


@pytest.mark.parametrize('dtype', [jnp.bfloat16])
def test_bfloat16_pools_are_exact_maxima(dtype):
  xs, valid = _inputs(3, dtype, ties=False)
  got = span_pools.pools(xs, valid, kind='max', directions=('prefix',
                                                            'suffix'),
                         heads=HEADS, fold=3)
  want = _reference(xs, valid, 'max', ('prefix', 'suffix'), 3)
  for g, w in zip(got, want):
    assert g.dtype == dtype
    np.testing.assert_array_equal(np.asarray(g, np.float32),
                                  np.asarray(w, np.float32))


def test_bad_kind_or_direction_is_one_line():
  xs, valid = _inputs(1, jnp.float32, ties=False)
  with pytest.raises(ValueError, match='Unknown pool kind'):
    span_pools.pools(xs, valid, kind='sum', directions=('prefix',),
                     heads=HEADS)
  with pytest.raises(ValueError, match='directions='):
    span_pools.pools(xs, valid, kind='max', directions=('up',), heads=HEADS)
