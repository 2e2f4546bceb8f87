"""`cst` with implementation='pallas' computes the 'xla' layer.

Same variables, same inputs: outputs and gradients (parameters and input)
agree for the paper's setting and the ablations the kernels cover, in
bidirectional and causal form, under the contract's padding patterns
(leading, inner and trailing padding, an example without a real token) and
with every bias non-zero. The kernels run in Pallas' interpreter here;
the export test lowers the layer for cuda and tpu.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention import standalone
from tests.kernels import helpers

pytestmark = pytest.mark.xdist_group('kernels-cst')

FEATURES, LENGTH = 32, 29


def _layers(kw, **fields):
  make = lambda impl: standalone.StandaloneAttention(
      mechanism='cst', kw={**kw, 'implementation': impl}, use_bias=True,
      **fields)
  return make('xla'), make('pallas')


CASES = [
    ('l4', {'slice_length': 4}),
    ('l8_parallel_max', {'slice_length': 8, 'composition': 'parallel',
                         'aggregation': 'max'}),
    ('l4_global_first_linear_untied',
     {'slice_length': 4, 'composition': 'global_first',
      'aggregation': 'linear', 'share_local_global': False}),
    ('l4_local_only_no_positions',
     {'slice_length': 4, 'composition': 'local_only',
      'position_embedding': 'none'}),
]


@pytest.mark.parametrize('causal', [False, True], ids=['bidir', 'causal'])
@pytest.mark.parametrize('cid,kw', CASES, ids=[c[0] for c in CASES])
def test_pallas_equals_xla_with_gradients(cid, kw, causal):
  del cid
  xla, pallas = _layers(kw, causal=causal)
  x = jax.random.normal(jax.random.PRNGKey(0), (4, LENGTH, FEATURES))
  mask = helpers.padding_mask(LENGTH)
  variables = helpers.random_biases(xla.init(jax.random.PRNGKey(1), x,
                                      padding_mask=mask))
  # Both implementations have the same variables.
  assert (jax.tree_util.tree_structure(variables) ==
          jax.tree_util.tree_structure(jax.eval_shape(
              lambda: pallas.init(jax.random.PRNGKey(1), x,
                                  padding_mask=mask))))
  run = lambda layer: jax.jit(
      lambda v, a: layer.apply(v, a, padding_mask=mask))
  np.testing.assert_allclose(run(pallas)(variables, x),
                             run(xla)(variables, x), rtol=1e-5, atol=1e-5)
  cot = jax.random.normal(jax.random.PRNGKey(2), x.shape)
  grads = lambda layer: jax.jit(jax.grad(
      lambda v, a: jnp.sum(layer.apply(v, a, padding_mask=mask) * cot),
      argnums=(0, 1)))(variables, x)
  # Float32 rounding, relative to each leaf's largest entry (up to ~170
  # here, with unit biases; the kernels add dK / dV over query chunks in
  # another order than XLA); a leaf whose true gradient is zero holds noise
  # of order 1e-5 in both.
  for g, w in zip(jax.tree_util.tree_leaves(grads(pallas)),
                  jax.tree_util.tree_leaves(grads(xla))):
    scale = float(np.abs(np.asarray(w)).max())
    np.testing.assert_allclose(g, w, rtol=0, atol=5e-5 + 1e-5 * scale)


def test_bfloat16_tracks_xla():
  xla, pallas = _layers({'slice_length': 8}, dtype=jnp.bfloat16)
  x = jax.random.normal(jax.random.PRNGKey(0), (4, LENGTH, FEATURES))
  mask = helpers.padding_mask(LENGTH)
  variables = xla.init(jax.random.PRNGKey(1), x, padding_mask=mask)
  y = jax.jit(lambda v: pallas.apply(v, x, padding_mask=mask))(variables)
  want = jax.jit(lambda v: xla.apply(v, x, padding_mask=mask))(variables)
  assert y.dtype == jnp.bfloat16
  err = np.abs(np.asarray(y, np.float32) - np.asarray(want, np.float32))
  assert err.max() < 0.05 * float(np.abs(np.asarray(want, np.float32)).max())


def test_dropout_inside_the_kernels():
  _, pallas = _layers({'slice_length': 4}, dropout_rate=0.3)
  x = jax.random.normal(jax.random.PRNGKey(0), (4, LENGTH, FEATURES))
  mask = helpers.padding_mask(LENGTH)
  variables = pallas.init(jax.random.PRNGKey(1), x, padding_mask=mask)
  run = jax.jit(lambda v, r: pallas.apply(
      v, x, padding_mask=mask, deterministic=False, rngs={'dropout': r}))
  a = run(variables, jax.random.PRNGKey(5))
  np.testing.assert_array_equal(a, run(variables, jax.random.PRNGKey(5)))
  assert float(jnp.abs(a - run(variables, jax.random.PRNGKey(6))).max()) > 0
  det = pallas.apply(variables, x, padding_mask=mask)
  assert float(jnp.abs(a - det).max()) > 0
  assert float(jnp.abs(a[~mask]).max()) == 0.0  # Padded rows stay zero.
  grads = jax.grad(lambda v: jnp.sum(pallas.apply(
      v, x, padding_mask=mask, deterministic=False,
      rngs={'dropout': jax.random.PRNGKey(5)}) ** 2))(variables)
  assert all(bool(jnp.all(jnp.isfinite(g)))
             for g in jax.tree_util.tree_leaves(grads))


def test_alpha_above_one_refuses_pallas():
  layer = standalone.StandaloneAttention(
      mechanism='cst', kw={'slice_length': 4, 'alpha': 2,
                           'implementation': 'pallas'})
  x = jnp.zeros((1, 16, FEATURES))
  with pytest.raises(ValueError, match="covers alpha=1 only.*'xla'"):
    layer.init(jax.random.PRNGKey(0), x)


@pytest.mark.parametrize('platform', ['cuda', 'tpu'])
def test_layer_lowers_with_its_gradients(platform):
  layer = standalone.StandaloneAttention(
      mechanism='cst', kw={'slice_length': 8, 'implementation': 'pallas'},
      num_heads=4, qkv_features=256, dtype=jnp.bfloat16, max_len=2048)
  x = jax.ShapeDtypeStruct((2, 2048, 256), jnp.float32)
  mask = jax.ShapeDtypeStruct((2, 2048), bool)
  variables = jax.eval_shape(
      lambda: layer.init(jax.random.PRNGKey(0), jnp.zeros(x.shape)))

  def step(v, a, m):
    return jax.grad(lambda v, a: jnp.sum(layer.apply(
        v, a, padding_mask=m).astype(jnp.float32)), argnums=(0, 1))(v, a)
  exported = jax.export.export(
      jax.jit(step), platforms=(platform,),
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
          '__gpu$xla.gpu.triton')])(variables, x, mask)
  marker = '__gpu$xla.gpu.triton' if platform == 'cuda' else 'tpu_custom_call'
  # Two attentions, each a forward kernel; in the backward the local one
  # (slices of 8, whole in every tile) is one fused kernel, the global one
  # a dQ and a dK/dV kernel.
  assert exported.mlir_module().count(marker) == 5
