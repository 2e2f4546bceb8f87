"""AdaMRA's fused query side (`implementation='pallas'`).

On the CPU the kernels run in Pallas' interpreter; the layer must equal the
`'xla'` layer in its output and in the gradients of every parameter and of
its input under every padding pattern of the contract tests (leading, inner
and trailing runs, an example without a real token), for every projection
layout, router gate, segment-mean mode and feature map, with biases and
landmark dropout, in float32 (tight) and bfloat16 (loose), with the same
variables and sown values. The kernels' forward and backward programs must
lower for `cuda` (Triton) and `tpu` (Mosaic) at a realistic size.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention import adamra
from lra_msmra.kernels import adamra as routed_kernels
from lra_msmra.kernels import flash
from tests.kernels import helpers

pytestmark = pytest.mark.xdist_group('kernels-adamra')

FEATURES, SUBHEADS, LENGTH = 16, 2, 40
BLOCK = 16  # Several query tiles; head_dim 8 is padded to 16 in the kernels.
PAPER_RATES = (1 / 2, 1 / 8, 1 / 32)
# (id, knobs, landmark dropout): the configs' settings (configs/common/
# adamra.py: the paper's rates, 'prob', 'masked'; 'single', 'stacked_shared'
# or 'stacked' by task and protocol) and every other knob value.
CASES = [
    ('single-prob-dropout', dict(projections='single'), 0.3),
    ('stacked-prob-bias', dict(projections='stacked', use_bias=True), 0.0),
    ('stacked_shared-hard-elu', dict(projections='stacked_shared',
                                     router_gate='hard',
                                     feature_map='elu_plus_one',
                                     use_bias=True), 0.0),
    ('single-unmasked-st', dict(projections='single',
                                segment_means='unmasked',
                                router_gate='straight_through',
                                compression_rates=(1, 1 / 4)), 0.0),
    # Segments of 1 and 4: the kernel's layer pads 40 tokens to its tile
    # (64), beyond the reference's 40; the same landmarks drop.
    ('single-quarter-dropout', dict(projections='single',
                                    compression_rates=(1, 1 / 4)), 0.3),
    ('stacked-st-elu-bias', dict(projections='stacked',
                                 router_gate='straight_through',
                                 feature_map='elu_plus_one', use_bias=True),
     0.0),
]


def _layer(implementation, knobs, dropout_rate=0.0, dtype=jnp.float32):
  knobs = {'compression_rates': PAPER_RATES, **knobs}
  return adamra.AdaMRAAttention(
      num_heads=SUBHEADS, qkv_features=FEATURES, dropout_rate=dropout_rate,
      dtype=dtype, implementation=implementation, **knobs)


def _variables(layer, x, mask):
  variables = jax.jit(lambda k, a, m: layer.init(k, a, padding_mask=m))(
      jax.random.PRNGKey(0), x, mask)
  # Biases drawn from N(0, 1), so that none of them is zero.
  rng = np.random.RandomState(3)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: jnp.asarray(rng.standard_normal(leaf.shape),
                                     leaf.dtype)
      if getattr(path[-1], 'key', None) == 'bias' else leaf, variables)


@functools.partial(jax.jit, static_argnames=('layer',))
def _output_and_grads(layer, params, x, mask, cot):
  """The layer's output and the gradients of <output, cot>."""
  def loss(params, x):
    y = layer.apply({'params': params}, x, padding_mask=mask,
                    deterministic=layer.dropout_rate == 0.0,
                    rngs={'dropout': jax.random.PRNGKey(5)})
    return jnp.sum(y.astype(jnp.float32) * cot), y
  (_, y), grads = jax.value_and_grad(loss, (0, 1), has_aux=True)(params, x)
  return y, grads


def _compare(cid, knobs, rate, dtype, check):
  """Runs both implementations; `check(name, got, want)` on each array."""
  del cid
  mask = helpers.padding_mask(LENGTH)
  x = jax.random.normal(jax.random.PRNGKey(1), (4, LENGTH, FEATURES))
  cot = jax.random.normal(jax.random.PRNGKey(2), (4, LENGTH, FEATURES))
  xla, pallas = (_layer(i, knobs, rate, dtype) for i in ('xla', 'pallas'))
  variables = _variables(xla, x, mask)
  x = x.astype(dtype)
  want = _output_and_grads(xla, variables['params'], x, mask, cot)
  got = _output_and_grads(pallas, variables['params'], x, mask, cot)
  assert got[0].dtype == want[0].dtype == dtype
  check('output', got[0], want[0])
  assert float(jnp.abs(got[0][3]).max()) == 0.0  # No real token: zero.
  check('d input', got[1][1], want[1][1])
  flat_got = jax.tree_util.tree_leaves_with_path(got[1][0])
  flat_want = jax.tree.leaves(want[1][0])
  assert len(flat_got) == len(flat_want)
  for (path, g), w in zip(flat_got, flat_want):
    check(jax.tree_util.keystr(path), g, w)
  return got, want


@pytest.mark.parametrize('cid,knobs,rate', CASES, ids=[c[0] for c in CASES])
def test_pallas_equals_xla_with_gradients(cid, knobs, rate):
  def check(name, got, want):
    scale = max(float(jnp.abs(want).max()), 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * scale,
                               err_msg=name)
  got, _ = _compare(cid, knobs, rate, jnp.float32, check)
  if knobs.get('router_gate', 'prob') != 'hard':
    # The router learns (through the gate's cotangent from the kernel).
    assert float(jnp.abs(got[1][0]['router']['kernel']).max()) > 0


@pytest.mark.parametrize('cid,knobs,rate', [CASES[0], CASES[1]],
                         ids=[CASES[0][0], CASES[1][0]])
def test_tpu_form_equals_xla_with_gradients(monkeypatch, cid, knobs, rate):
  # The TPU form reads the per-subhead arrays heads-major, transposed
  # around its kernels (the GPU form reads the model's layout).
  jax.clear_caches()  # No program traced in the other form.
  monkeypatch.setattr(flash, 'INTERPRET_TPU_FORM', True)

  def check(name, got, want):
    scale = max(float(jnp.abs(want).max()), 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * scale,
                               err_msg=name)
  try:
    _compare(cid, knobs, rate, jnp.float32, check)
  finally:
    jax.clear_caches()


@pytest.mark.parametrize('dim', [32, 128, 192],
                         ids=['model-layout', 'wide', 'spans'])
@pytest.mark.parametrize('stacked', [False, True], ids=['shared', 'stacked'])
def test_routed_attention_equals_reference(dim, stacked):
  # Subheads under 128 wide are read in the model's layout, wider ones
  # heads-major; beyond SUMMARY_SPAN (192, padded to 256) the summaries
  # and rows are worked in spans, d KV in blocks: all equal the reference,
  # with gradients.
  _routed_equals_reference(dim, stacked)


@pytest.mark.parametrize('stacked', [False, True], ids=['shared', 'stacked'])
def test_spans_in_the_tpu_form_equal_the_reference(monkeypatch, stacked):
  # The TPU form (heads-major, Mosaic's lane-aligned spans) of the wide
  # subheads' spans and d KV blocks.
  jax.clear_caches()  # No program traced in the other form.
  monkeypatch.setattr(flash, 'INTERPRET_TPU_FORM', True)
  try:
    _routed_equals_reference(192, stacked)
  finally:
    jax.clear_caches()


def _routed_equals_reference(dim, stacked):
  batch, n, heads, subheads, features = 2, 40, 3, 2, 32
  keys = iter(jax.random.split(jax.random.PRNGKey(7), 8))
  normal = lambda shape: jax.random.normal(next(keys), shape)
  q = normal((batch, n, features) if stacked else (batch, n, subheads, dim))
  w = normal((heads, features, subheads, dim)) / 4 if stacked else None
  b = normal((heads, subheads, dim)) if stacked else None
  kv = normal((batch, heads, subheads, dim, dim))
  z = jnp.abs(normal((batch, heads, subheads, dim))) + 1.0
  choice = jax.random.randint(next(keys), (batch, n), 0, heads)
  gate = jax.nn.softmax(normal((batch, n, heads)))
  cot = normal((batch, n, subheads, dim))

  def loss(fn):
    def f(q, w, b, kv, z, gate):
      y = fn(q, kv, z, choice, gate, weight=w, bias=b)
      return jnp.sum(y * cot), y
    return jax.jit(jax.value_and_grad(f, (0, 1, 2, 3, 4, 5) if stacked
                                      else (0, 3, 4, 5), has_aux=True))
  (_, got), got_grads = loss(routed_kernels.routed_attention)(
      q, w, b, kv, z, gate)
  (_, want), want_grads = loss(routed_kernels.reference)(q, w, b, kv, z,
                                                         gate)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  for g, r in zip(got_grads, want_grads):
    scale = float(jnp.abs(r).max())
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * scale)


def test_bfloat16_tracks_xla():
  def check(name, got, want):
    got, want = (np.asarray(a, np.float32) for a in (got, want))
    scale = max(float(np.abs(want).max()), 1e-6)
    err = float(np.abs(got - want).max())
    assert err <= 0.05 * scale, (name, err, scale)
  _compare(*CASES[1], jnp.bfloat16, check)


def test_variables_are_the_xla_ones():
  # Everything but the query side is shared code; the stacked maps are
  # created by the same module, whose kernel applies them.
  mask = helpers.padding_mask(LENGTH)
  x = jax.random.normal(jax.random.PRNGKey(1), (4, LENGTH, FEATURES))
  knobs = dict(projections='stacked', use_bias=True)
  init = lambda layer: jax.jit(lambda k, a, m: layer.init(  # noqa: E731
      k, a, padding_mask=m))(jax.random.PRNGKey(0), x, mask)
  got, want = (init(_layer(i, knobs)) for i in ('pallas', 'xla'))
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(g, w)


def test_sown_values_are_the_xla_ones():
  mask = helpers.padding_mask(LENGTH)
  x = jax.random.normal(jax.random.PRNGKey(1), (4, LENGTH, FEATURES))
  xla, pallas = (_layer(i, dict(projections='single'))
                 for i in ('xla', 'pallas'))
  variables = _variables(xla, x, mask)
  run = lambda layer: jax.jit(lambda v, a, m: layer.apply(  # noqa: E731
      v, a, padding_mask=m, mutable=['intermediates', 'metrics']))(
          variables, x, mask)[1]
  got, want = run(pallas), run(xla)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(g, w)


def test_xla_is_the_default_and_pallas_is_accepted():
  assert adamra.AdaMRAAttention().implementation == 'xla'
  assert 'pallas' in adamra.AdaMRAAttention.IMPLEMENTATIONS
  with pytest.raises(ValueError, match='no implementation'):
    adamra.AdaMRAAttention(implementation='triton')


@pytest.mark.parametrize('platform', ['cuda', 'tpu'])
@pytest.mark.parametrize('dtype,stacked', [(jnp.float32, False),
                                           (jnp.bfloat16, True)],
                         ids=['float32-shared', 'bfloat16-stacked'])
def test_forward_and_backward_lower(platform, dtype, stacked):
  batch, length, features, heads, subheads, dim = 2, 1024, 256, 3, 4, 64

  def value_and_grads(q, w, b, kv, z, choice, gate):
    def loss(q, w, b, kv, z, gate):
      y = routed_kernels.routed_attention(
          q, kv, z, choice, gate, weight=w, bias=b,
          # The straight-through gate recomputes every head's queries.
          all_gate_gradients=stacked)
      return jnp.sum(y.astype(jnp.float32))
    argnums = (0, 1, 2, 3, 4, 5) if stacked else (0, 3, 4, 5)
    return jax.value_and_grad(loss, argnums)(q, w, b, kv, z, gate)

  s = jax.ShapeDtypeStruct
  f32 = jnp.float32
  args = (s((batch, length, features) if stacked
            else (batch, length, subheads, dim), dtype),
          s((heads, features, subheads, dim), dtype) if stacked else None,
          s((heads, subheads, dim), dtype) if stacked else None,
          s((batch, heads, subheads, dim, dim), f32),
          s((batch, heads, subheads, dim), f32),
          s((batch, length), jnp.int32), s((batch, length, heads), f32))
  exported = jax.export.export(
      jax.jit(value_and_grads), platforms=(platform,),
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
          '__gpu$xla.gpu.triton')])(*args)
  text = exported.mlir_module()
  marker = '__gpu$xla.gpu.triton' if platform == 'cuda' else 'tpu_custom_call'
  # Forward, per-tile backward and summary-gradient kernels.
  assert text.count(marker) == 3, text.count(marker)


def test_bad_feature_map_is_named():
  with pytest.raises(ValueError, match='feature_map'):
    routed_kernels.routed_attention(
        jnp.zeros((1, 16, 1, 16)), jnp.zeros((1, 1, 1, 16, 16)),
        jnp.zeros((1, 1, 1, 16)), jnp.zeros((1, 16), jnp.int32),
        jnp.ones((1, 16, 1)), feature_map='tanh')


