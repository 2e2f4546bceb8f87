"""Transformer-LS's fused core (`implementation='pallas'`) against 'xla'.

On the CPU the flash kernel runs in Pallas' interpreter. The core
(`kernels.long_short.attend`) must equal the 'xla' core
(`attention.long_short._attend`) in its output, its landmark weight and its
gradients, for segment and sliding windows, landmarks for all queries and
per chunk, each part alone, under the padding patterns of the contract
tests; the whole layer must equal the 'xla' layer with the same variables
in its output, metric and the gradients of its parameters and input, in
float32 and bfloat16. Its forward and backward programs must lower for
`cuda` (Triton) and `tpu` (Mosaic) at a realistic size.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention import long_short as ls_attention
from lra_msmra.kernels import flash
from lra_msmra.kernels import long_short as ls_kernel
from tests.kernels import helpers

pytestmark = pytest.mark.xdist_group('kernels-long_short')

G = ls_kernel.Geometry
# (id, geometry)
CORE_CASES = [
    ('w4-r3', G(4, 3)),
    ('w3-r2', G(3, 2)),          # odd window: e = 1, w + 2 keys.
    ('w0-r5', G(0, 5)),          # landmarks only.
    ('w8-r0', G(8, 0)),          # window only.
    ('causal-w4-r2-l8', G(4, 2, True, 8)),
    ('causal-w5-r1-l4', G(5, 1, True, 4)),
    ('causal-w0-r2-l8', G(0, 2, True, 8)),
    ('causal-w4-r0', G(4, 0, True, 1)),
]
HEADS, DIM = 2, 8
BLOCK = 16  # Several query, key and landmark tiles.


def _length(g):
  """At least 30 positions, whole windows and chunks (as the layer pads)."""
  multiple = math.lcm(max(g.window_size, 1),
                      g.chunk_size if g.causal and g.num_landmarks else 1)
  return -(-30 // multiple) * multiple


def _core_inputs(g, dtype=jnp.float32):
  length = _length(g)
  mask = helpers.padding_mask(length)
  batch = mask.shape[0]
  m = g.num_landmarks * (length // g.chunk_size if g.causal else 1)
  ks = jax.random.split(jax.random.PRNGKey(0), 5)
  q = 0.5 * jax.random.normal(ks[0], (batch, length, HEADS, DIM), dtype)
  k, v = (jax.random.normal(s, (batch, length, HEADS, DIM), dtype)
          for s in ks[1:3])
  k_bar, v_bar = (jax.random.normal(s, (batch, m, HEADS, DIM), dtype)
                  for s in ks[3:5])
  return (q, k, v, k_bar, v_bar), mask


def _keep_mask(g, mask, m, seed, rate):
  """The kernel's dropout keep mask in the 'xla' core's layout.

  bool `[batch, heads, length, slots]`: landmarks first (by index), then the
  window slots of each query in key order (keys counted by position).
  """
  batch, length = mask.shape
  w = g.window_size
  left, right = ((w, 0) if g.causal
                 else (ls_attention.window_extension(w),) * 2)
  b = jnp.arange(batch)[:, None, None, None]
  h = jnp.arange(HEADS)[None, :, None, None]
  i = jnp.arange(length)[:, None]
  keep = lambda key, part: flash.keep_mask(seed, b, h, i, key, part, HEADS,
                                           rate)
  parts = []
  if m:
    parts.append(keep(jnp.arange(m)[None, :], flash.EXTRA_PART))
  if w:
    key = (i // w) * w - left + jnp.arange(left + w + right)[None, :]
    parts.append(keep(jnp.maximum(key, 0), flash.WINDOW_PART))
  return jnp.concatenate(
      [jnp.broadcast_to(p, (batch, HEADS, length, p.shape[-1]))
       for p in parts], -1)


def _core_functions(g, mask, dropout_rate=0.0, seed=None):
  """(kernel, xla) cores as functions of (q, k, v, k_bar, v_bar).

  Each returns (out, landmark weight per query `[batch, heads, length]`).
  """
  length = mask.shape[1]
  w, r = g.window_size, g.num_landmarks
  flags = ls_kernel.landmark_flags(mask, g) if r else None
  if g.causal:
    left, right = w, 0
    # The 'xla' core's landmark validity (`_causal_projected`).
    earlier = (jnp.arange(flags.shape[1] if r else 0)[None, :] // max(r, 1)
               < jnp.arange(length)[:, None] // g.chunk_size)
    bar_valid = earlier[None, None] & flags[:, None, None, :] if r else None
  else:
    left = right = ls_attention.window_extension(w)
    bar_valid = jnp.ones((mask.shape[0], 1, length, r), bool)

  def kernel(q, k, v, k_bar, v_bar):
    return ls_kernel.attend(
        q, (k_bar, v_bar, flags) if r else None, (k, v, mask) if w else None,
        mask, g, dropout_rate=dropout_rate, dropout_seed=seed, block=BLOCK,
        long_range_mass=bool(r))

  def xla(q, k, v, k_bar, v_bar):
    keep = (_keep_mask(g, mask, k_bar.shape[1] if r else 0, seed,
                       dropout_rate) if dropout_rate else None)
    out, probs = ls_attention._attend(
        q, (k_bar, v_bar, bar_valid) if r else None,
        (k, v, mask) if w else None, mask, keep, window_size=w, left=left,
        right=right, causal=g.causal, keep_prob=1.0 - dropout_rate)
    return out, (jnp.sum(probs[0], -1) if r else None)
  return kernel, xla


def _argnums(g):
  return tuple(i for i, used in enumerate(
      (True, bool(g.window_size), bool(g.window_size), bool(g.num_landmarks),
       bool(g.num_landmarks))) if used)


def _run(f, args, argnums, weigh):
  """f's (out, mass) and the gradient of sum(weigh(out)): one program."""
  def loss(*a):
    out, mass = f(*a)
    return jnp.sum(weigh(out).astype(jnp.float32)), (out, mass)
  (_, (out, mass)), grads = jax.jit(
      jax.value_and_grad(loss, argnums, has_aux=True))(*args)
  return out, mass, grads


def _check_core(g, args, mask, weigh, **dropout):
  kernel, xla = _core_functions(g, mask, **dropout)
  out, mass, got = _run(kernel, args, _argnums(g), weigh)
  want, want_mass, expected = _run(xla, args, _argnums(g), weigh)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  if g.num_landmarks:
    # Before dropout, as the metric's.
    np.testing.assert_allclose(mass, want_mass, rtol=1e-5, atol=1e-6)
  else:
    assert mass is None
  for a, b in zip(got, expected):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize('cid,g', CORE_CASES, ids=[c[0] for c in CORE_CASES])
def test_core_equals_xla_with_gradients(cid, g):
  del cid
  args, mask = _core_inputs(g)
  cot = jax.random.normal(jax.random.PRNGKey(1), args[0].shape)
  _check_core(g, args, mask, lambda out: out * cot)


@pytest.mark.parametrize('cid,g', [CORE_CASES[1], CORE_CASES[4]],
                         ids=[CORE_CASES[1][0], CORE_CASES[4][0]])
def test_core_dropout_equals_xla_with_the_same_mask(cid, g):
  del cid
  args, mask = _core_inputs(g)
  _check_core(g, args, mask, jnp.square, dropout_rate=0.3,
              seed=jnp.uint32(2024))


@pytest.mark.parametrize('cid,g', [CORE_CASES[0], CORE_CASES[4]],
                         ids=[CORE_CASES[0][0], CORE_CASES[4][0]])
def test_core_bfloat16_tracks_float32(cid, g):
  del cid
  args32, mask = _core_inputs(g)
  args16 = tuple(a.astype(jnp.bfloat16) for a in args32)
  kernel, xla = _core_functions(g, mask)
  out, _, got = _run(kernel, args16, _argnums(g), lambda o: o)
  want, _, expected = _run(xla, args32, _argnums(g), lambda o: o)
  assert out.dtype == jnp.bfloat16
  err = np.abs(np.asarray(out, np.float32) - np.asarray(want))
  assert err.max() < 0.05, err.max()
  for a, b in zip(got, expected):
    assert a.dtype == jnp.bfloat16
    scale = float(jnp.abs(b).max())
    assert float(jnp.abs(a.astype(jnp.float32) - b).max()) < 0.05 * scale


def test_core_refuses_a_mismatched_geometry():
  (q, k, v, _, _), mask = _core_inputs(G(4, 0))
  with pytest.raises(ValueError, match='does not match the key sets'):
    ls_kernel.attend(q, None, (k, v, mask), mask, G(4, 2))


# -- the layer ---------------------------------------------------------------

FEATURES = 16
LAYER_LENGTH = 37  # Padded inside the layer; several tiles of BLOCK.
# (id, knobs)
LAYER_CASES = [
    ('w4-r3-conv', dict(window_size=4, num_landmarks=3, conv_kernel_size=3)),
    ('w0-r3', dict(window_size=0, num_landmarks=3)),
    ('causal-w4-r2-l8', dict(window_size=4, num_landmarks=2, causal=True,
                             chunk_size=8)),
    ('causal-w3-r0', dict(window_size=3, num_landmarks=0, causal=True)),
]


@pytest.fixture(autouse=True)
def _small_tiles(monkeypatch):
  monkeypatch.setattr(ls_kernel, 'BLOCK', BLOCK)


def _layers(dtype=jnp.float32, **knobs):
  make = lambda impl: ls_attention.LongShortAttention(
      num_heads=HEADS, use_bias=True, dtype=dtype, implementation=impl,
      **knobs)
  return make('xla'), make('pallas')


def _layer_inputs():
  mask = helpers.padding_mask(LAYER_LENGTH)
  x = jax.random.normal(jax.random.PRNGKey(3),
                        (mask.shape[0], LAYER_LENGTH, FEATURES))
  return x, mask


def _variables(layer, x, mask):
  """Initialised, with every bias and LayerNorm shifted off its init."""
  params = layer.init(jax.random.PRNGKey(0), x, padding_mask=mask)['params']
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(4), len(leaves))
  return {'params': jax.tree_util.tree_unflatten(tree, [
      p + 0.3 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)])}


@pytest.mark.parametrize('cid,knobs', LAYER_CASES,
                         ids=[c[0] for c in LAYER_CASES])
def test_layer_equals_xla_with_gradients(cid, knobs):
  del cid
  xla, pallas = _layers(**knobs)
  x, mask = _layer_inputs()
  variables = _variables(xla, x, mask)
  # The same variables: the implementation changes no parameter.
  assert (jax.tree_util.tree_structure(jax.eval_shape(
      lambda: pallas.init(jax.random.PRNGKey(0), x, padding_mask=mask)))
          == jax.tree_util.tree_structure(variables))

  cot = jax.random.normal(jax.random.PRNGKey(5), x.shape)

  def run(layer):
    """Output, sown collections and gradients: one program."""
    def loss(v, a):
      y, sown = layer.apply(v, a, padding_mask=mask,
                            mutable=['metrics', 'intermediates'])
      return jnp.sum(y * cot), (y, sown)
    (_, (y, sown)), grads = jax.jit(jax.value_and_grad(
        loss, (0, 1), has_aux=True))(variables, x)
    return y, sown, grads
  y, sown, got = run(pallas)
  y_xla, sown_xla, want = run(xla)
  np.testing.assert_allclose(y, y_xla, rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(y[~mask]).max()) == 0.0
  # P and LN_G(K̄) are shared code; the joint weights are not sown.
  inter = sown.get('intermediates', {})
  inter_xla = sown_xla['intermediates']
  assert 'probs' in inter_xla and 'probs' not in inter
  assert sorted(inter) == sorted(k for k in inter_xla if k != 'probs')
  for name in inter:
    # The kernel's layer pads further (to its tile): the padded positions
    # beyond the reference's are padding; reductions over the longer
    # padded axis round differently.
    want_sown = inter_xla[name][0]
    got_sown = inter[name][0][tuple(slice(0, n) for n in want_sown.shape)]
    np.testing.assert_allclose(got_sown, want_sown, rtol=1e-6, atol=1e-6)
  assert sown.get('metrics', {}).keys() == sown_xla.get('metrics', {}).keys()
  for name, value in sown.get('metrics', {}).items():
    np.testing.assert_allclose(value[0], sown_xla['metrics'][name][0],
                               rtol=1e-5)
  flat = jax.tree_util.tree_leaves_with_path(want)
  for (path, w), g in zip(flat, jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))


def test_layer_bfloat16_tracks_float32():
  knobs = LAYER_CASES[2][1]
  xla, _ = _layers(**knobs)
  _, pallas16 = _layers(jnp.bfloat16, **knobs)
  x, mask = _layer_inputs()
  variables = _variables(xla, x, mask)

  def run(layer):
    def loss(v, a):
      y = layer.apply(v, a, padding_mask=mask)
      return jnp.sum(y.astype(jnp.float32) ** 2), y
    return jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(
        variables, x)
  (_, y), got = run(pallas16)
  (_, want), expected = run(xla)
  assert y.dtype == jnp.bfloat16
  scale = float(jnp.abs(want).max())
  assert float(jnp.abs(y.astype(jnp.float32) - want).max()) < 0.05 * scale
  for g, w in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(expected)):
    scale = float(jnp.abs(w).max())
    assert float(jnp.abs(g.astype(jnp.float32) - w).max()) < 0.05 * scale


def test_layer_dropout_draws_from_the_dropout_rng():
  knobs = LAYER_CASES[0][1]
  xla, _ = _layers(**knobs)
  _, pallas = _layers(dropout_rate=0.3, **knobs)
  x, mask = _layer_inputs()
  variables = _variables(xla, x, mask)
  run = jax.jit(lambda v, a, rng: pallas.apply(
      v, a, padding_mask=mask, deterministic=False, rngs={'dropout': rng}))
  y1 = run(variables, x, jax.random.PRNGKey(1))
  np.testing.assert_array_equal(y1, run(variables, x, jax.random.PRNGKey(1)))
  y2 = run(variables, x, jax.random.PRNGKey(2))
  y_det = jax.jit(lambda v, a: xla.apply(v, a, padding_mask=mask))(
      variables, x)
  assert bool(jnp.all(jnp.isfinite(y1)))
  assert float(jnp.abs(y1 - y2).max()) > 1e-3
  assert float(jnp.abs(y1 - y_det).max()) > 1e-3
  assert float(jnp.abs(y1[~mask]).max()) == 0.0


@pytest.mark.parametrize('platform', ['cuda', 'tpu'])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16],
                         ids=['float32', 'bfloat16'])
def test_layer_forward_and_backward_lower(platform, dtype, monkeypatch):
  # A realistic size and the kernel's own tile: head_dim 64, 1,024 tokens.
  monkeypatch.setattr(ls_kernel, 'BLOCK', flash.DEFAULT_BLOCK)
  batch, length, heads, features = 2, 1024, 4, 256
  layers = [ls_attention.LongShortAttention(
      num_heads=heads, dtype=dtype, implementation='pallas', **knobs)
            for knobs in (dict(window_size=8, num_landmarks=32),
                          dict(causal=True, window_size=16, num_landmarks=1))]
  x = jax.ShapeDtypeStruct((batch, length, features), jnp.float32)
  mask = jax.ShapeDtypeStruct((batch, length), bool)
  variables = [jax.eval_shape(lambda l=l: l.init(
      jax.random.PRNGKey(0), jnp.zeros(x.shape), padding_mask=jnp.ones(
          mask.shape, bool))) for l in layers]

  def grads(variables, x, mask):
    def loss(variables, x):
      return sum(jnp.sum(l.apply(v, x, padding_mask=mask).astype(
          jnp.float32)) for l, v in zip(layers, variables))
    return jax.grad(loss, (0, 1))(variables, x)
  exported = jax.export.export(
      jax.jit(grads), platforms=(platform,),
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
          '__gpu$xla.gpu.triton')])(variables, x, mask)
  text = exported.mlir_module()
  marker = '__gpu$xla.gpu.triton' if platform == 'cuda' else 'tpu_custom_call'
  # Per layer: forward, dQ and a dK/dV kernel per key set; nothing else.
  assert text.count(marker) == 8, text.count(marker)
  # No array of length x length anywhere (scores stay inside the kernel).
  assert f'{length}x{length}x' not in text
