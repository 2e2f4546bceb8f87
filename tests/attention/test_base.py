"""Numerics helpers shared by the mechanisms (lra_msmra/attention/base.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra.attention import base


def test_safe_softmax_parts_equals_safe_softmax_of_the_concatenation():
  rng = np.random.RandomState(0)
  a = jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float32)
  b = jnp.asarray(rng.standard_normal((2, 3, 5)) * 10, jnp.float32)
  valid_a = jnp.asarray(rng.rand(2, 1, 4) > 0.4)  # broadcasts over rows.
  valid_b = jnp.asarray(rng.rand(2, 3, 5) > 0.4)
  valid_a = valid_a.at[1].set(False)
  valid_b = valid_b.at[1, 0].set(False)  # Row (1, 0): nothing valid at all.
  whole = base.safe_softmax(
      jnp.concatenate([a, b], -1),
      jnp.concatenate([jnp.broadcast_to(valid_a, a.shape), valid_b], -1))
  parts = base.safe_softmax_parts([a, b], [valid_a, valid_b])
  np.testing.assert_allclose(jnp.concatenate(parts, -1), whole, rtol=1e-6,
                             atol=1e-7)
  assert not np.any(parts[0][1, 0]) and not np.any(parts[1][1, 0])
  grads = jax.grad(lambda x, y: sum(
      jnp.sum(jnp.sin(p)) for p in base.safe_softmax_parts(
          [x, y], [valid_a, valid_b])), argnums=(0, 1))(a, b)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
