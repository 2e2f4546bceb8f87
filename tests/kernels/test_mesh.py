"""Fused kernels under data parallelism: one kernel call per batch shard.

Traced inside a mesh of 8 (fake CPU) devices with the batch split over
them, the flash kernels run under `shard_map` on each device's rows, give
the unsplit batch's outputs, and draw the unsplit batch's dropout masks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import sharding
from lra_msmra.kernels import flash
from lra_msmra.kernels import mesh as mesh_lib

pytestmark = pytest.mark.xdist_group('kernels-mesh')


def _attend(q, k, v, valid, seed):
  return flash.flash_attention(q, k, v, valid,
                               window=flash.Window('segment', size=8),
                               dropout_rate=0.2, dropout_seed=seed)


def test_shards_run_their_rows_with_the_unsplit_batch_masks():
  mesh = sharding.create_mesh(jax.devices()[:8])
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(s, (8, 2, 32, 8)) for s in keys)
  valid = jnp.asarray(np.arange(32)[None, :] < np.arange(8)[:, None] * 4 + 4)
  seed = jnp.int32(11)
  whole = jax.jit(_attend)(q, k, v, valid, seed)
  rows = sharding.batch_sharding(mesh)
  split = jax.jit(mesh_lib.under_mesh(_attend, mesh),
                  in_shardings=(rows, rows, rows, rows,
                                sharding.replicated(mesh)),
                  out_shardings=rows)
  np.testing.assert_allclose(split(q, k, v, valid, seed), whole, rtol=1e-6,
                             atol=1e-6)
  # The kernels see one device's rows.
  with mesh_lib.mesh_context(mesh):
    jaxpr = str(jax.make_jaxpr(_attend)(q, k, v, valid, seed))
  assert 'shard_map' in jaxpr
  assert 'f32[1,2,32,16]' in jaxpr  # Head width padded to 16 inside.


def test_outside_a_mesh_it_is_a_plain_call():
  q = jnp.ones((2, 1, 16, 8))
  jaxpr = str(jax.make_jaxpr(_attend)(q, q, q, jnp.ones((2, 16), bool),
                                      jnp.int32(0)))
  assert 'shard_map' not in jaxpr


def test_adamra_layer_gradients_under_a_mesh():
  """Replicated maps (AdaMRA's per-head queries) get the sum of every
  shard's gradient."""
  from lra_msmra.attention import standalone  # pylint: disable=g-import-not-at-top
  mesh = sharding.create_mesh(jax.devices()[:8])
  layer = standalone.StandaloneAttention(
      mechanism='adamra', kw={'implementation': 'pallas'})
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 16, 32))
  mask = jnp.asarray(np.arange(16)[None, :] < np.arange(8)[:, None] + 9)
  variables = layer.init(jax.random.PRNGKey(1), x, padding_mask=mask)

  def loss(v, a, m):
    return jnp.sum(layer.apply(v, a, padding_mask=m) ** 2)
  want = jax.jit(jax.grad(loss))(variables, x, mask)
  rows, same = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  got = jax.jit(mesh_lib.under_mesh(jax.grad(loss), mesh),
                in_shardings=(same, rows, rows), out_shardings=same)(
                    variables, x, mask)
  with mesh_lib.mesh_context(mesh):
    assert 'shard_map' in str(jax.make_jaxpr(loss)(variables, x, mask))
  # Sums over shards in another order: float32 rounding of each leaf's scale
  # (a missing sum over shards would be off by a factor).
  for g, w in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    scale = float(np.abs(np.asarray(w)).max())
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 + 5e-5 * scale)


@pytest.mark.parametrize('config_file', ['cst.py', 'long_short.py',
                                         'combiner_axial.py', 'adamra.py'])
def test_pallas_training_steps_lower_on_a_mesh_for_tpu_and_gpu(config_file):
  """The trainer's jitted train and eval steps of a `pallas` config, over 8
  devices with the batch split (shard_map around every kernel call),
  lower for tpu and for cuda in bfloat16."""
  import os  # pylint: disable=g-import-not-at-top
  from lra_msmra_tools import scaling  # pylint: disable=g-import-not-at-top
  from lra_msmra import validation  # pylint: disable=g-import-not-at-top
  config = scaling.load_config(
      os.path.join(scaling.CONFIG_ROOT, 'listops', config_file), 'runlocal')
  config.model.attention_kw.implementation = 'pallas'
  config.model.dtype = 'bfloat16'
  mesh = sharding.create_mesh(jax.devices()[:8])
  _, abstract = validation.trace(config)
  steps = scaling.build_steps(config, mesh, abstract)
  # One platform at a time, as jit lowers on each: the kernels' Triton and
  # Mosaic parameters live in separate branches of lax.platform_dependent,
  # which a single program for both platforms cannot hold.
  for program in (steps.train, steps.eval):
    for platform in ('tpu', 'cuda'):
      assert scaling.lowering_failures(program, (platform,)) == [], (
          program.name, platform)
