"""Influence maps of attention layers (lra_msmra.analysis).

The maps are checked against attention probabilities computed here by hand
(softmax with zero query weights, where the map is exactly the probabilities
times a weight norm), against known supports (causal triangles, CST slices
with and without extension, padding), and on every registered mechanism.
"""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import analysis
from lra_msmra import attention
from lra_msmra import config_lib
from lra_msmra import models
from tests.attention import harness

LENGTH = 12
# Example 0: 9 real tokens then 3 padding; example 1: all real.
IDS = np.array([[3, 1, 4, 1, 5, 9, 2, 6, 5, 0, 0, 0],
                [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5]], np.int32)
REAL = 9


def _model(attention_name='softmax', kw=None, *, causal=False,
           pooling='CLS', dual=False, num_layers=2):
  m = config_lib.default_config().model.to_dict()
  m.update(num_layers=num_layers, emb_dim=16, num_heads=2, qkv_dim=16,
           mlp_dim=16, head_hidden=(16,), attention=attention_name,
           attention_kw=kw or {}, causal=causal, pooling=pooling)
  if attention_name == 'cst':
    m['pos_emb'] = 'none'  # MS-VIPE instead, as the CST configs do.
  model = models.create_model(m, vocab_size=10, num_classes=3,
                              max_len=LENGTH, dual=dual)
  batch = {'inputs': jnp.asarray(IDS)}
  if dual:
    batch['inputs2'] = jnp.asarray(IDS[::-1])
  params = jax.jit(functools.partial(model.init, deterministic=True))(
      jax.random.PRNGKey(0), batch)['params']
  return model, flax.core.unfreeze(params), batch


def test_captured_calls_reproduce_the_layer_outputs():
  for name, kw in (('softmax', {}), ('cst', {'slice_length': 4})):
    model, params, batch = _model(name, kw)
    calls = analysis.capture_attention_calls(model, params, batch)
    assert [c.path for c in calls] == [
        ('encoder', 'block_0', 'attention'),
        ('encoder', 'block_1', 'attention')]
    _, state = jax.jit(functools.partial(
        model.apply, deterministic=True, capture_intermediates=True))(
            {'params': params}, batch)
    inter = state['intermediates']['encoder']
    for i, call in enumerate(calls):
      expected = inter[f'block_{i}']['attention']['__call__'][0]
      np.testing.assert_allclose(
          jax.jit(call.apply)(call.inputs, call.padding_mask), expected,
          rtol=1e-5, atol=1e-6)
      # CLS copies the first token's mask, then the ids' mask.
      np.testing.assert_array_equal(
          call.padding_mask, np.concatenate([IDS[:, :1] > 0, IDS > 0], 1))


def test_dual_encoder_has_one_call_per_document():
  model, params, batch = _model(dual=True)
  calls = analysis.capture_attention_calls(model, params, batch)
  assert len(calls) == 4
  second = analysis.find_call(calls, layer=1, document=1)
  np.testing.assert_array_equal(second.padding_mask, IDS[::-1] > 0)
  out = analysis.attention_influence(model, params, batch, layer=1,
                                     document=1, example=1)
  assert out.num_prefix == 0  # Retrieval has no CLS token (LRA).
  np.testing.assert_array_equal(out.padding_mask, IDS[0] > 0)
  with pytest.raises(ValueError, match='2 time'):
    analysis.find_call(calls, layer=0, document=2)
  with pytest.raises(ValueError, match='block_0'):
    analysis.find_call(calls, layer=5)


def _visible(mask, causal):
  """Keys each query may see in the LRA softmax: [L, L] bool."""
  vis = mask[:, None] & mask[None, :]
  if causal:
    vis &= np.tril(np.ones(vis.shape, bool))
  return vis


@pytest.mark.parametrize('causal', [False, True], ids=['bidir', 'causal'])
def test_softmax_map_is_the_attention_probabilities(causal):
  """W_q = 0: uniform attention over visible keys and no derivative through
  the logits, so the map is exactly P[i, j] times the norm of the linear
  value-output readout: ||W_v W_o||_F per layer, ||W_v[h]||_F per head."""
  pooling = 'MEAN' if causal else 'CLS'
  model, params, batch = _model(causal=causal, pooling=pooling)
  layer = params['encoder']['block_1']['attention']
  layer['query']['kernel'] = jnp.zeros_like(layer['query']['kernel'])
  w_v = np.asarray(layer['value']['kernel'])  # [D, H, d]
  w_o = np.asarray(layer['out']['kernel'])  # [H, d, D]

  out = analysis.attention_influence(model, params, batch, layer=1)
  heads = analysis.attention_influence(model, params, batch, layer=1,
                                       per_head=True)
  prefix = 0 if causal else 1
  assert out.num_prefix == prefix
  mask = np.concatenate([IDS[0, :prefix] > 0, IDS[0] > 0])
  np.testing.assert_array_equal(out.padding_mask, mask)
  vis = _visible(mask, causal)
  probs = vis / np.maximum(vis.sum(-1, keepdims=True), 1)
  real = np.flatnonzero(mask)  # padded queries attend uniformly (LRA).
  readout = np.linalg.norm(np.einsum('ehd,hdf->ef', w_v, w_o))
  np.testing.assert_allclose(out.values[real], probs[real] * readout,
                             rtol=1e-5, atol=1e-7)
  for h in range(2):
    np.testing.assert_allclose(heads.values[h][real],
                               probs[real] * np.linalg.norm(w_v[:, h]),
                               rtol=1e-5, atol=1e-7)
  # A subset of rows gives the same rows.
  some = analysis.attention_influence(model, params, batch, layer=1,
                                      query_positions=[2, 5])
  np.testing.assert_allclose(some.values, out.values[[2, 5]], rtol=1e-6)
  np.testing.assert_array_equal(some.query_positions, [2, 5])


def test_softmax_support_with_trained_like_weights():
  """Random weights: every visible key influences a real query, no other."""
  model, params, batch = _model()
  out = analysis.attention_influence(model, params, batch, layer=0)
  mask = out.padding_mask
  real = np.flatnonzero(mask)
  assert np.all(out.values[real][:, mask] > 0)
  assert np.all(out.values[real][:, ~mask] == 0)


def _first_cases():
  return [(name, harness.CONTRACT_CASES[name][0][1])
          for name in sorted(attention.REGISTRY)]


@pytest.mark.parametrize('name,kw', _first_cases(),
                         ids=[n for n, _ in _first_cases()])
def test_every_mechanism_has_a_map(name, kw):
  model, params, batch = _model(name, kw, num_layers=1)
  out = analysis.attention_influence(model, params, batch, layer=0)
  length = LENGTH + 1
  assert out.values.shape == (length, length)
  assert np.all(np.isfinite(out.values)) and np.all(out.values >= 0)
  real = np.flatnonzero(out.padding_mask)
  # Real outputs never depend on a padded input. (Not every real output
  # depends on something: AdaMRA's ReLU kernel gives an output of exactly 0
  # when phi(q) and phi(k) of the only landmark share no positive feature.)
  assert out.values[real].max() > 0
  assert np.all(out.values[real][:, ~out.padding_mask] == 0)
  try:
    heads = analysis.attention_influence(model, params, batch, layer=0,
                                         per_head=True)
  except ValueError as e:
    assert 'per_head=False' in str(e)
  else:
    assert heads.values.shape == (2, length, length)
    assert np.all(heads.values[:, real][..., ~out.padding_mask] == 0)


@pytest.mark.parametrize('name,kw', _first_cases(),
                         ids=[n for n, _ in _first_cases()])
def test_causal_maps_are_lower_triangular(name, kw):
  try:
    model, params, batch = _model(name, kw, causal=True, pooling='MEAN',
                                  num_layers=1)
  except NotImplementedError:
    pytest.skip(f'{name} has no causal form')
  out = analysis.attention_influence(model, params, batch, layer=0,
                                     example=1)
  assert np.all(np.triu(out.values, k=1) == 0)
  assert np.all(np.diag(out.values) > 0)


@pytest.mark.parametrize('alpha', [1, 2])
def test_cst_local_map_shows_slices_and_their_extension(alpha):
  """Without the global path, output i in slice s sees inputs [sL - e,
  (s + 1) L + e) with e = (alpha - 1) L / 2 (docs/mechanisms/cst.md §8)."""
  size = 4
  model, params, batch = _model(
      'cst', {'slice_length': size, 'alpha': alpha,
              'composition': 'local_only'}, pooling='MEAN', num_layers=1)
  out = analysis.attention_influence(model, params, batch, layer=0,
                                     example=1)
  e = (alpha - 1) * size // 2
  i, j = np.meshgrid(np.arange(LENGTH), np.arange(LENGTH), indexing='ij')
  start = (i // size) * size
  support = (j >= start - e) & (j < start + size + e)
  assert np.all(out.values[support] > 0)
  assert np.all(out.values[~support] == 0)


def test_bad_arguments():
  model, params, batch = _model('cst', {'slice_length': 4})
  with pytest.raises(ValueError, match='per_head=False'):
    analysis.attention_influence(model, params, batch, layer=0,
                                 per_head=True)
  with pytest.raises(ValueError, match='query_positions'):
    analysis.attention_influence(model, params, batch, layer=0,
                                 query_positions=[LENGTH + 1])
