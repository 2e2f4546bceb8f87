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
from lra_msmra.kernels import long_short as ls_kernel

pytestmark = pytest.mark.xdist_group('kernels-long_short')

G = ls_kernel.Geometry
# (id, geometry)
CORE_CASES = [
    ('w4-r3', G(4, 3)),
    ('w3-r2', G(3, 2)),          # odd window: e = 1, w + 2 keys.
    ('w1-r2', G(1, 2)),          # unit window: 3 keys.
    ('w0-r5', G(0, 5)),          # landmarks only.
    ('w8-r0', G(8, 0)),          # window only.
    ('causal-w4-r2-l8', G(4, 2, True, 8)),
    ('causal-w5-r1-l4', G(5, 1, True, 4)),
    ('causal-w0-r2-l8', G(0, 2, True, 8)),
    ('causal-w4-r0', G(4, 0, True, 1)),
]
HEADS, DIM = 2, 8
BLOCK = 16  # Several query, key and landmark tiles.


def _padding_mask(length):
  """The contract tests' patterns, one per row.

  Trailing third (`_inputs`); then `_padded_rows_mask`'s leading run, inner
  run with a trailing position, and an example with no real token.
  """
  mask = np.ones((4, length), bool)
  mask[0, length - length // 3:] = False
  mask[1, :5] = False
  mask[2, 4:9] = False
  mask[2, length - 1] = False
  mask[3] = False
  return jnp.asarray(mask)


def _length(g):
  """At least 30 positions, whole windows and chunks (as the layer pads)."""
  multiple = math.lcm(max(g.window_size, 1),
                      g.chunk_size if g.causal and g.num_landmarks else 1)
  return -(-30 // multiple) * multiple


def _core_inputs(g, dtype=jnp.float32):
  length = _length(g)
  mask = _padding_mask(length)
  batch = mask.shape[0]
  m = g.num_landmarks * (length // g.chunk_size if g.causal else 1)
  ks = jax.random.split(jax.random.PRNGKey(0), 5)
  q = 0.5 * jax.random.normal(ks[0], (batch, length, HEADS, DIM), dtype)
  k, v = (jax.random.normal(s, (batch, length, HEADS, DIM), dtype)
          for s in ks[1:3])
  k_bar, v_bar = (jax.random.normal(s, (batch, m, HEADS, DIM), dtype)
                  for s in ks[3:5])
  return (q, k, v, k_bar, v_bar), mask


def _core_functions(g, mask):
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
        mask, g, block=BLOCK, long_range_mass=bool(r))

  def xla(q, k, v, k_bar, v_bar):
    out, probs = ls_attention._attend(
        q, (k_bar, v_bar, bar_valid) if r else None,
        (k, v, mask) if w else None, mask, None, window_size=w, left=left,
        right=right, causal=g.causal, keep_prob=1.0)
    return out, (jnp.sum(probs[0], -1) if r else None)
  return kernel, xla


def _argnums(g):
  return tuple(i for i, used in enumerate(
      (True, bool(g.window_size), bool(g.window_size), bool(g.num_landmarks),
       bool(g.num_landmarks))) if used)


@pytest.mark.parametrize('cid,g', CORE_CASES, ids=[c[0] for c in CORE_CASES])
def test_core_equals_xla_with_gradients(cid, g):
  del cid
  args, mask = _core_inputs(g)
  kernel, xla = _core_functions(g, mask)
  out, mass = jax.jit(kernel)(*args)
  want, want_mass = xla(*args)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  if g.num_landmarks:
    np.testing.assert_allclose(mass, want_mass, rtol=1e-5, atol=1e-6)
  else:
    assert mass is None
  cot = jax.random.normal(jax.random.PRNGKey(1), out.shape)
  loss = lambda f: lambda *a: jnp.sum(f(*a)[0] * cot)
  got = jax.jit(jax.grad(loss(kernel), _argnums(g)))(*args)
  expected = jax.grad(loss(xla), _argnums(g))(*args)
  for a, b in zip(got, expected):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize('cid,g', [CORE_CASES[0], CORE_CASES[5]],
                         ids=[CORE_CASES[0][0], CORE_CASES[5][0]])
def test_core_bfloat16_tracks_float32(cid, g):
  del cid
  args32, mask = _core_inputs(g)
  args16 = tuple(a.astype(jnp.bfloat16) for a in args32)
  kernel, xla = _core_functions(g, mask)
  out, _ = jax.jit(kernel)(*args16)
  assert out.dtype == jnp.bfloat16
  want, _ = xla(*args32)
  err = np.abs(np.asarray(out, np.float32) - np.asarray(want))
  assert err.max() < 0.05, err.max()
  f32 = lambda f: lambda *a: jnp.sum(f(*a)[0].astype(jnp.float32))
  got = jax.jit(jax.grad(f32(kernel), _argnums(g)))(*args16)
  expected = jax.grad(f32(xla), _argnums(g))(*args32)
  for a, b in zip(got, expected):
    assert a.dtype == jnp.bfloat16
    scale = float(jnp.abs(b).max())
    assert float(jnp.abs(a.astype(jnp.float32) - b).max()) < 0.05 * scale


def test_core_refuses_a_mismatched_geometry():
  (q, k, v, _, _), mask = _core_inputs(G(4, 0))
  with pytest.raises(ValueError, match='does not match the key sets'):
    ls_kernel.attend(q, None, (k, v, mask), mask, G(4, 2))
