"""The contract every registered attention mechanism must honour.

Runs over every entry of `lra_msmra.attention.REGISTRY` (with the knobs listed
in each mechanism's `EXAMPLES`), in bidirectional and causal form.

The padded-row rule (docs/mechanisms/softmax.md §3.2), one for every
mechanism: the output at a padded query position is exactly zero, biases
included (`base.Attention.zero_padded_queries`). The softmax baseline is the
one exception: it keeps the LRA reference's values there (a padded query
attends uniformly to every position), because the LRA protocol reads them
(unmasked MEAN pooling, P9; a CLS query masked by a black pixel, P8).
`test_padded_rows_with_biases` checks the rule for every registered
mechanism and case, bidirectional and causal.
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import attention
from tests.attention import harness

KNOBS = {(name, cid): kw for name, cid, kw in harness.all_cases()}
# All the tests of one case run on one worker (pytest-xdist's `--dist
# loadgroup`, set in pytest.ini), where they share its compiled programs
# (`_case`).
CASES = [pytest.param(name, cid, id=f'{name}-{cid}',
                      marks=pytest.mark.xdist_group(f'contract-{name}-{cid}'))
         for name, cid in KNOBS]
BATCH, FEATURES = 2, 32
LENGTHS = (16, 13)  # 13: not a multiple of any block size.


def _inputs(length, seed=0):
  x = jax.random.normal(jax.random.PRNGKey(seed), (BATCH, length, FEATURES))
  # Example 0 is fully real; example 1 has its last third padded.
  mask = np.ones((BATCH, length), bool)
  mask[1, length - length // 3:] = False
  return x, jnp.asarray(mask)


class Case(NamedTuple):
  """A harness and its jitted init and apply."""
  h: Any
  init: Callable[..., Any]  # (key, x, mask) -> variables
  apply: Callable[..., Any]  # (variables, x, mask) -> output


# Inits and applies run jitted: one compiled program per call site instead of
# one small program per operation and input shape in eager mode, which costs
# seconds per test for the larger mechanisms. The eager path is exercised once
# per case, where its output is compared with the jitted one. One pair of
# jitted functions per harness: the tests of a case that init or apply the
# same harness at the same shapes trace and compile it once.
@functools.cache
def _case_of(name, cid, fields):
  h = harness.AttentionHarness(mechanism=name, kw=KNOBS[name, cid],
                               **dict(fields))
  return Case(h, jax.jit(lambda k, a, m: h.init(k, a, padding_mask=m)),
              jax.jit(lambda v, a, m: h.apply(v, a, padding_mask=m)))


def _case(name, cid, **fields) -> Case:
  return _case_of(name, cid, tuple(sorted(fields.items())))


def _init(case, x, mask, seed=0):
  return case.init(jax.random.PRNGKey(seed), x, mask)


def _build(name, cid, x, mask, causal=False, **fields):
  """(case, variables at `x`), or None when the mechanism refuses `causal`
  (from `check_knobs` or while tracing its call)."""
  case = _case(name, cid, causal=causal, **fields)
  try:
    return case, _init(case, x, mask)
  except NotImplementedError:
    if not causal:
      raise
    return None


def test_every_registered_mechanism_has_cases():
  assert set(harness.CONTRACT_CASES) == set(attention.REGISTRY)


def test_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match='softmax'):
    attention.get_attention('no_such_attention')


@pytest.mark.parametrize('name,cid', CASES)
@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('length', LENGTHS)
def test_shape_jit_determinism_and_padding(name, cid, causal, length):
  x, mask = _inputs(length)
  built = _build(name, cid, x, mask, causal=causal)
  if built is None:
    pytest.skip(f'{name} raises NotImplementedError for causal=True')
  case, variables = built
  h, apply = case.h, case.apply
  y_jit = apply(variables, x, mask)
  assert y_jit.shape == (BATCH, length, FEATURES)
  assert bool(jnp.all(jnp.isfinite(y_jit)))
  np.testing.assert_array_equal(apply(variables, x, mask), y_jit)
  if length == LENGTHS[-1]:
    # Eager (op by op) agrees with jit; at one length, as it is slow.
    y = h.apply(variables, x, padding_mask=mask)
    np.testing.assert_allclose(y_jit, y, rtol=1e-4, atol=1e-5)

  # Padded tokens must not influence real-token outputs.
  noise = 10.0 * jax.random.normal(jax.random.PRNGKey(7), x.shape)
  x2 = jnp.where(mask[..., None], x, noise)
  y2 = apply(variables, x2, mask)
  y = y_jit
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(y2)[real], np.asarray(y)[real],
                             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name,cid', CASES)
def test_out_features(name, cid):
  # Shapes only, traced and not compiled: out_features changes the width of
  # the output projection, whose computation the other tests run.
  h = _case(name, cid, out_features=24).h
  x, mask = _inputs(16)
  variables = jax.eval_shape(
      lambda k: h.init(k, x, padding_mask=mask), jax.random.PRNGKey(0))
  y = jax.eval_shape(lambda v: h.apply(v, x, padding_mask=mask), variables)
  assert y.shape == (BATCH, 16, 24)


@pytest.mark.parametrize('name,cid', CASES)
@pytest.mark.parametrize('causal', [False, True])
def test_gradients_finite(name, cid, causal):
  x, mask = _inputs(16)
  mask = mask.at[1, 4:].set(False)  # long padded run (whole blocks).
  built = _build(name, cid, x, mask, causal=causal)
  if built is None:
    pytest.skip(f'{name} raises NotImplementedError for causal=True')
  case, variables = built
  h = case.h

  def loss(v, a):
    return jnp.sum(h.apply(v, a, padding_mask=mask) ** 2)
  gv, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(variables, x)
  for g in jax.tree_util.tree_leaves((gv, gx)):
    assert bool(jnp.all(jnp.isfinite(g)))
  assert any(float(jnp.abs(g).sum()) > 0
             for g in jax.tree_util.tree_leaves(gv['params']))


@pytest.mark.parametrize('name,cid', CASES)
def test_dropout_needs_rng_and_changes_output(name, cid):
  case = _case(name, cid, dropout_rate=0.5)
  h = case.h
  x, mask = _inputs(16)
  # Dropout has no variables: the ones of the same harness without it (the
  # program other tests of the case compile).
  variables = _init(_case(name, cid), x, mask)
  y_det = case.apply(variables, x, mask)  # deterministic=True, the default.
  dropped = jax.jit(lambda v, a, m, r: h.apply(
      v, a, padding_mask=m, deterministic=False, rngs={'dropout': r}))
  y_a = dropped(variables, x, mask, jax.random.PRNGKey(1))
  y_b = dropped(variables, x, mask, jax.random.PRNGKey(1))
  np.testing.assert_array_equal(y_a, y_b)
  assert y_a.shape == y_det.shape
  assert bool(jnp.all(jnp.isfinite(y_a)))


@pytest.mark.parametrize('name,cid', CASES)
def test_causal_no_future_leakage(name, cid):
  """After one layer and after a residual stack of two (one program)."""
  length = 16
  x, _ = _inputs(length)
  mask = jnp.ones((BATCH, length), bool)
  built = _build(name, cid, x, mask, causal=True)
  if built is None:
    pytest.skip(f'{name} raises NotImplementedError for causal=True')
  case, first = built
  h = case.h
  variables = [first, _init(case, x, mask, seed=1)]

  @jax.jit
  def stack(a):  # [layers, B, N, D]: the output after each layer.
    m = jnp.ones(a.shape[:2], bool)
    outputs = []
    for v in variables:
      a = a + h.apply(v, a, padding_mask=m)
      outputs.append(a)
    return jnp.stack(outputs)

  # d y_i / d x_j must vanish for every j > i.
  jac = jax.jit(jax.jacrev(lambda a: stack(a[None])[:, 0]))(x[0])
  influence = np.abs(np.asarray(jac)).sum(axis=(2, 4))  # [layers, i, j]
  future = np.triu(np.ones((length, length), bool), k=1)
  for layers, seen in enumerate(influence, 1):
    assert seen[future].max() == 0.0, (
        f'after {layers} layer(s) the output depends on future inputs')
    assert seen[~future].max() > 0.0

  # Perturbing the last positions leaves earlier outputs bit-identical.
  y = np.asarray(stack(x))
  y2 = np.asarray(stack(x.at[:, 11:].add(3.0)))
  np.testing.assert_array_equal(y2[:, :, :11], y[:, :, :11])


@pytest.mark.parametrize('name,cid', CASES)
def test_bfloat16_runs_and_tracks_float32(name, cid):
  x, mask = _inputs(16)
  c32 = _case(name, cid)
  variables = _init(c32, x, mask)
  y32 = c32.apply(variables, x, mask)
  y16 = _case(name, cid, dtype=jnp.bfloat16).apply(variables, x, mask)
  assert y16.dtype == jnp.bfloat16
  for leaf in jax.tree_util.tree_leaves(variables):
    assert leaf.dtype == jnp.float32
  real = np.asarray(mask)
  err = np.abs(np.asarray(y16, np.float32) - np.asarray(y32))[real]
  scale = np.abs(np.asarray(y32))[real].mean()
  assert bool(np.all(np.isfinite(err)))
  assert err.mean() < 0.05 * scale + 1e-3


def _padded_rows_mask(length):
  """Leading, inner and trailing padding, and an example with no real token."""
  mask = np.ones((3, length), bool)
  mask[0, :5] = False           # left padding: whole leading blocks.
  mask[1, 4:9] = False          # an inner run.
  mask[1, length - 1] = False   # and a trailing position.
  mask[2, :] = False
  return jnp.asarray(mask)


def _random_biases(params, seed=3):
  """Every bias drawn from N(0, 1), so that none of them is zero."""
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: jnp.asarray(rng.standard_normal(leaf.shape),
                                     leaf.dtype)
      if getattr(path[-1], 'key', None) == 'bias' else leaf, params)


def _lra_padded_rows(params, x):
  """LRA's softmax at a padded query: uniform weights over all positions."""
  p = params['attention']
  v = jnp.einsum('blf,fhd->blhd', x, p['value']['kernel']) + p['value']['bias']
  out = jnp.einsum('bhd,hdf->bf', v.mean(1), p['out']['kernel'])
  return out + p['out']['bias']


def test_only_the_softmax_baseline_keeps_lra_padded_rows():
  keeps = {name for name, cls in attention.REGISTRY.items()
           if not cls.zero_padded_queries}
  assert keeps == {'softmax'}


@pytest.mark.parametrize('name,cid', CASES)
@pytest.mark.parametrize('causal', [False, True])
def test_padded_rows_with_biases(name, cid, causal):
  """The padded-row rule (module docstring), with every bias non-zero.

  Left padding covering whole blocks, an inner run, a trailing position and
  an example with no real token: what a mechanism leaves at padded rows (a
  bias, a convolution term, a span summary) must not show.
  """
  length = 13  # internal padding too, for every mechanism that pads.
  x = jax.random.normal(jax.random.PRNGKey(5), (3, length, FEATURES))
  mask = _padded_rows_mask(length)
  built = _build(name, cid, x, mask, causal=causal, use_bias=True)
  if built is None:
    pytest.skip(f'{name} raises NotImplementedError for causal=True')
  case, variables = built
  variables = {**variables, 'params': _random_biases(variables['params'])}
  y = np.asarray(case.apply(variables, x, mask))
  padded = ~np.asarray(mask)
  assert np.all(np.isfinite(y))
  if attention.REGISTRY[name].zero_padded_queries:
    worst = float(np.abs(y[padded]).max())
    assert worst == 0.0, f'padded query rows are not zero (max |y| {worst:.3g})'
  else:
    expected = np.broadcast_to(
        np.asarray(_lra_padded_rows(variables['params'], x))[:, None],
        y.shape)
    np.testing.assert_allclose(y[padded], expected[padded], rtol=1e-5,
                               atol=1e-5)
