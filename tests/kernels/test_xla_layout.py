"""The `'xla'` code's scheduling dependency
(lra_msmra/kernels/xla_layout.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.kernels import xla_layout


def test_after_keeps_values_and_stays_on_each_devices_rows():
  anchor = jnp.arange(8 * 3 * 2, dtype=jnp.float32).reshape(8, 3, 2)
  stats = jnp.ones((8, 3, 1), jnp.float32)
  np.testing.assert_array_equal(xla_layout.after(anchor, stats)[0], stats)
  poisoned = xla_layout.after(anchor.at[2, 0, 0].set(jnp.nan), stats)[0]
  assert np.isnan(poisoned[2]).all() and not np.isnan(np.delete(
      np.asarray(poisoned), 2, axis=0)).any()
  with pytest.raises(ValueError, match='leading axis'):
    xla_layout.after(anchor, jnp.ones((3,)))
  # Batch-sharded over 8 devices (data parallelism): no communication.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ('data',))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  hlo = jax.jit(xla_layout.after, in_shardings=(rows, rows),
                out_shardings=rows).lower(anchor, stats).compile().as_text()
  for op in ('all-reduce', 'all-gather', 'collective-permute', 'all-to-all'):
    assert op not in hlo, op
