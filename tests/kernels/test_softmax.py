"""Softmax attention through the fused kernels (lra_msmra/kernels/softmax.py).

Neither kernel runs on this CPU, so the tests check:

* the arguments: the real-first reordering and its lengths, the segment
  ids, against plain numpy, for trailing and other padding;
* the math, on the CPU: the cuDNN path with the same arguments given to
  `jax.nn.dot_product_attention`'s XLA implementation, and the TPU kernel
  itself in Pallas' TPU interpreter, against a numpy softmax over real keys,
  with padded rows zero; and the layer against the `'xla'` layer;
* the errors a layer gives at construction;
* that the layers' forward and backward programs lower for `cuda` and `tpu`
  through `jax.export`. For cuDNN, JAX reads the cuDNN version from the
  CUDA plugin when it traces the call (`check_cudnn_version`), and a
  CPU-only jaxlib has none ("cuDNN is not detected."): the test stands in
  a version (9.8) for that one call. JAX's cuDNN and Mosaic custom calls
  carry no export compatibility guarantee, so the test lifts that one
  check for their targets.
"""

import jax
from jax._src.cudnn import fused_attention_stablehlo
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention import softmax
from lra_msmra.attention.standalone import StandaloneAttention
from lra_msmra.kernels import softmax as fused

pytestmark = pytest.mark.xdist_group('kernels-softmax')

LENGTH = 11
MASKS = {
    'trailing': [[1] * 11, [1] * 7 + [0] * 4],
    'black pixels': [[0] + [1] * 4 + [0, 0] + [1] * 3 + [0],
                     [1, 0] * 5 + [1]],
    'left and one real': [[0] * 5 + [1] * 6, [0] * 10 + [1]],
    'no real token': [[0] * 11, [1] * 11],
}


def _mask(name):
  return jnp.asarray(MASKS[name], bool)


def _numpy_order(mask):
  """Reference: each row's real positions in order, then its padding."""
  mask = np.asarray(mask)
  order = np.stack([np.concatenate([np.flatnonzero(r), np.flatnonzero(~r)])
                    for r in mask])
  return order, np.argsort(order, axis=1), mask.sum(1)


@pytest.mark.parametrize('name', MASKS)
def test_real_first_is_the_stable_partition(name):
  mask = _mask(name)
  order, place, lengths = jax.jit(fused.real_first)(mask)
  want_order, want_place, want_lengths = _numpy_order(mask)
  np.testing.assert_array_equal(order, want_order)
  np.testing.assert_array_equal(place, want_place)
  np.testing.assert_array_equal(lengths, want_lengths)
  assert order.dtype == place.dtype == lengths.dtype == jnp.int32
  # Trailing padding: the identity, the lengths say everything.
  trailing = [np.all(np.diff(r.astype(int)) <= 0) for r in np.asarray(mask)]
  for row, is_trailing in enumerate(trailing):
    assert is_trailing == np.array_equal(order[row], np.arange(LENGTH))


def test_reordering_rows_backpropagates_through_the_inverse():
  mask = _mask('black pixels')
  order, place, _ = fused.real_first(mask)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, LENGTH, 3, 4))
  g = jax.random.normal(jax.random.PRNGKey(1), x.shape)
  take_rows = fused._take_rows  # pylint: disable=protected-access
  y, pullback = jax.vjp(lambda x: take_rows(x, order, place), x)
  rows = np.arange(2)[:, None]
  np.testing.assert_array_equal(y, np.asarray(x)[rows, np.asarray(order)])
  np.testing.assert_array_equal(pullback(g)[0],
                                np.asarray(g)[rows, np.asarray(place)])
  jaxpr = str(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(
      take_rows(x, order, place) ** 2)))(x))
  assert 'scatter' not in jaxpr


def test_segment_ids_pad_to_the_kernel_block():
  mask = _mask('black pixels')
  ids = fused.segment_ids(mask)
  assert ids.shape == (2, fused.TPU_BLOCK) and ids.dtype == jnp.int32
  want = np.zeros((2, fused.TPU_BLOCK), np.int32)
  want[:, :LENGTH] = np.asarray(mask)
  np.testing.assert_array_equal(ids, want)
  assert fused.segment_ids(jnp.ones((1, 256), bool), 128).shape == (1, 256)


def _reference(q, k, v, mask, causal, scale):
  """float64 softmax over each query's real (and, causal, earlier) keys;
  zero at padded queries."""
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  mask = np.asarray(mask)
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) * scale
  valid = np.broadcast_to(mask[:, None, None, :], logits.shape)
  if causal:
    valid = valid & np.tril(np.ones((q.shape[1],) * 2, bool))
  logits = np.where(valid, logits, -np.inf)
  # A padded causal query may see no real key: its row is NaN, then zeroed.
  with np.errstate(invalid='ignore'):
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
  out = np.einsum('bhqk,bkhd->bqhd', np.nan_to_num(weights), v)
  return np.where(mask[:, :, None, None], out, 0.0)


def _qkv(length=LENGTH, dtype=jnp.float32):
  ks = jax.random.split(jax.random.PRNGKey(3), 3)
  return [jax.random.normal(s, (2, length, 2, 8), dtype) for s in ks]


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('name', MASKS)
def test_cudnn_arguments_compute_softmax_over_real_keys(name, causal,
                                                        monkeypatch):
  # The same call with JAX's XLA implementation, which takes the same
  # lengths and masks padded keys as cuDNN does.
  monkeypatch.setattr(fused, 'CUDNN_BACKEND', 'xla')
  q, k, v = _qkv()
  mask = _mask(name)
  out = jax.jit(lambda q, k, v: fused.cudnn_attention(
      q, k, v, mask, causal=causal, scale=0.35))(q, k, v)
  np.testing.assert_allclose(out, _reference(q, k, v, mask, causal, 0.35),
                             rtol=1e-5, atol=1e-5)
  grads = jax.grad(lambda *a: jnp.sum(jnp.sin(fused.cudnn_attention(
      *a, mask, causal=causal, scale=0.35))), (0, 1, 2))(q, k, v)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


@pytest.mark.parametrize('causal', [False, True])
def test_tpu_flash_in_the_interpreter(causal):
  # Pallas' TPU interpreter runs the kernel itself on the CPU (slowly: one
  # small case, forward and backward).
  q, k, v = _qkv()
  mask = _mask('black pixels')
  fn = lambda q, k, v: fused.tpu_flash_attention(q, k, v, mask,
                                                 causal=causal, scale=0.35)
  with pltpu.force_tpu_interpret_mode():
    out, pullback = jax.vjp(fn, q, k, v)
    grads = pullback(jnp.ones_like(out))
  np.testing.assert_allclose(out, _reference(q, k, v, mask, causal, 0.35),
                             rtol=1e-5, atol=1e-5)
  # The gradients of the same attention written with jax.numpy.
  valid = mask[:, None, None, :]
  if causal:
    valid = valid & jnp.tril(jnp.ones((LENGTH, LENGTH), bool))

  def dense(q, k, v):
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) * 0.35
    weights = jax.nn.softmax(jnp.where(valid, logits, -1e30), -1)
    out = jnp.einsum('bhqk,bkhd->bqhd', weights, v)
    return jnp.where(mask[:, :, None, None], out, 0.0)
  want = jax.vjp(dense, q, k, v)[1](jnp.ones_like(out))
  for got, ref in zip(grads, want):
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def _layer(implementation, dtype=jnp.bfloat16, **kw):
  return StandaloneAttention(
      mechanism='softmax', kw={'implementation': implementation},
      num_heads=2, qkv_features=16, dtype=dtype, use_bias=True, **kw)


def test_cudnn_layer_is_the_xla_layer_on_real_rows(monkeypatch):
  monkeypatch.setattr(fused, 'CUDNN_BACKEND', 'xla')
  x = jax.random.normal(jax.random.PRNGKey(0), (2, LENGTH, 16))
  mask = _mask('black pixels')
  variables = _layer('xla').init(jax.random.PRNGKey(1), x, padding_mask=mask)
  # Output biases that a padded row would show.
  variables = jax.tree.map(lambda p: p + 0.5, variables)
  got = _layer('cudnn').apply(variables, x, padding_mask=mask)
  want = _layer('xla').apply(variables, x, padding_mask=mask)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(got, np.float32)[real],
                             np.asarray(want, np.float32)[real],
                             rtol=2e-2, atol=2e-2)
  # Zero at padded rows, biases included (the xla layer keeps LRA's values).
  assert not np.any(np.asarray(got)[~real])
  assert np.all(np.asarray(want)[~real] != 0)


def test_without_cudnn_the_layer_says_so():
  x = jnp.ones((1, 8, 16))
  with pytest.raises(ValueError, match="implementation='cudnn' needs cuDNN"):
    jax.eval_shape(lambda x: _layer('cudnn').init(
        jax.random.PRNGKey(0), x), x)


@pytest.mark.parametrize('implementation', fused.IMPLEMENTATIONS)
def test_attention_dropout_is_refused(implementation):
  with pytest.raises(ValueError, match=r'no attention dropout.*'
                     r'attention_dropout_rate=0'):
    softmax.SoftmaxAttention(implementation=implementation,
                             dtype=jnp.bfloat16, dropout_rate=0.1)


def test_cudnn_refuses_float32():
  with pytest.raises(ValueError, match=r"bfloat16 or float16 only.*"
                     r"config.model.dtype='bfloat16'"):
    softmax.SoftmaxAttention(implementation='cudnn', dtype=jnp.float32)
  softmax.SoftmaxAttention(implementation='cudnn', dtype=jnp.float16)
  softmax.SoftmaxAttention(implementation='tpu_flash', dtype=jnp.float32)


def _exported(implementation, platform):
  """Exports the layer's forward and backward pass for `platform`."""
  length = 200  # Not a multiple of the TPU kernel's block.
  layer = _layer(implementation)
  x = jax.ShapeDtypeStruct((2, length, 16), jnp.float32)
  mask = jax.ShapeDtypeStruct((2, length), jnp.bool_)
  variables = jax.eval_shape(
      lambda: _layer('xla').init(jax.random.PRNGKey(0), jnp.ones(x.shape),
                                 padding_mask=jnp.ones(mask.shape, bool)))

  def loss(variables, x, mask):
    y = layer.apply(variables, x, padding_mask=mask)
    return jnp.sum(jnp.square(y.astype(jnp.float32)))
  targets = ('__cudnn$fmhaSoftmax', '__cudnn$fmhaSoftmaxBackward',
             'tpu_custom_call')
  exported = jax.export.export(
      jax.jit(jax.value_and_grad(loss, (0, 1))), platforms=(platform,),
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(t)
                       for t in targets])(variables, x, mask)
  return exported.mlir_module()


def test_cudnn_layer_exports_for_cuda(monkeypatch):
  # A stand-in for the cuDNN version a CUDA plugin would report (see the
  # module docstring); nothing else of the lowering is replaced.
  monkeypatch.setattr(fused_attention_stablehlo, 'check_cudnn_version',
                      lambda: 90800)
  text = _exported('cudnn', 'cuda')
  assert '__cudnn$fmhaSoftmax' in text
  assert '__cudnn$fmhaSoftmaxBackward' in text
  assert 'PADDING' in text  # Sequence lengths, not a materialised mask.


def test_tpu_flash_layer_exports_for_tpu():
  text = _exported('tpu_flash', 'tpu')
  # The forward kernel, and the two of the backward pass (dK/dV and dQ).
  assert text.count('tpu_custom_call') >= 3
