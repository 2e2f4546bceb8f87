"""Synthesizer (`synthesizer`): float64 reference, softmax tie, invariants.

The reference adds the parts of the logits from their definitions (paper
Eq. 1-3: dot product, the random table R_h, the factorised R1_h R2_h, the
dense B_i = W2 relu(W1 x_i + b1) + b2), masks padded keys (and j > i), takes
one softmax per row in float64 and zeroes padded query rows.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import attention
from lra_msmra.attention.synthesizer import SynthesizerAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2
HEAD_DIM = FEATURES // HEADS


def _inputs(length, seed=0):
  return ref.inputs(length, FEATURES, seed, holes=(0, 3, 4, length - 1))


def _init(layer, x, mask, seed=0):
  variables = {'params': ref.params(layer, x, mask, seed)}
  rng = np.random.RandomState(seed + 100)

  def perturb(path, p):  # non-trivial biases and tables
    name = '/'.join(str(getattr(k, 'key', k)) for k in path)
    if name.endswith('bias'):
      return 0.3 * rng.standard_normal(p.shape).astype(np.float32)
    if 'random' in name:
      return p + 0.5 * rng.standard_normal(p.shape).astype(np.float32)
    return p
  return {'params': jax.tree_util.tree_map_with_path(perturb,
                                                     variables['params'])}


_apply = ref.call
_dense = ref.dense


def _np(p, name):
  return np.asarray(p[name], np.float64)


def dense_synthesizer(variables, x, mask, *, synthesizer_mode='random',
                      ignore_dot_product=False, causal=False):
  p = variables['params']
  x = np.asarray(x, np.float64)
  b, n, _ = x.shape
  v = _dense(p, 'value', x)
  logits = np.zeros((b, HEADS, n, n))
  if not ignore_dot_product:
    q, k = _dense(p, 'query', x), _dense(p, 'key', x)
    logits += np.einsum('bihd,bjhd->bhij', q, k) / math.sqrt(HEAD_DIM)
  parts = synthesizer_mode.split('+')
  if 'random' in parts:
    logits += _np(p, 'random')[None, :, :n, :n]
  if 'factorized_random' in parts:
    logits += np.einsum('hik,hkj->hij', _np(p, 'random1')[:, :n],
                        _np(p, 'random2')[:, :, :n])[None]
  if 'dense' in parts:
    hidden = np.maximum(_dense(p, 'dense_syn', x), 0)
    dense = np.einsum('bnhd,dl->bhnl', hidden,
                      _np(p, 'dense_syn_length')[:, :n])
    if 'dense_syn_length_bias' in p:
      dense += _np(p, 'dense_syn_length_bias')[:n]
    logits += dense
  valid = mask[:, None, None, :]
  if causal:
    valid = valid & np.tril(np.ones((n, n), bool))[None, None]
  logits = np.where(valid, logits, -np.inf)
  top = logits.max(-1, keepdims=True)
  weights = np.exp(logits - np.where(np.isfinite(top), top, 0))
  total = weights.sum(-1, keepdims=True)
  weights = weights / np.where(total > 0, total, 1)
  out = np.einsum('bhij,bjhd->bihd', weights, v) * mask[:, :, None, None]
  y = np.tensordot(out, np.asarray(p['out']['kernel'], np.float64),
                   axes=([-2, -1], [0, 1]))
  if 'bias' in p['out']:
    y = y + np.asarray(p['out']['bias'], np.float64)
  return y * mask[..., None]  # padded query rows are zero


CASES = [
    dict(n=12),
    dict(n=13, synthesizer_mode='factorized_random', factorized_k=3,
         use_bias=True),
    dict(n=11, synthesizer_mode='dense', ignore_dot_product=True,
         use_bias=True),
    dict(n=12, synthesizer_mode='dense+random', causal=True),
    dict(n=10, synthesizer_mode='dense+factorized_random', factorized_k=2,
         ignore_dot_product=True, causal=True, use_bias=True),
    dict(n=9, synthesizer_mode='random', ignore_dot_product=True),
]


def _split(case):
  case = dict(case)
  n = case.pop('n')
  ref_kw = {k: case[k] for k in ('synthesizer_mode', 'ignore_dot_product',
                                 'causal') if k in case}
  return n, case, ref_kw


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_dense_reference(case):
  n, kw, ref_kw = _split(case)
  x, mask = _inputs(n)
  layer = SynthesizerAttention(num_heads=HEADS, **kw)
  variables = _init(layer, x, mask)
  y = np.asarray(_apply(layer, variables, x, mask))
  np.testing.assert_allclose(y, dense_synthesizer(variables, x, mask,
                                                  **ref_kw),
                             rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('index', [1, 2, 4])
def test_gradients_match_finite_differences_of_dense_reference(index):
  n, kw, ref_kw = _split(CASES[index])
  x, mask = _inputs(n, seed=index)
  layer = SynthesizerAttention(num_heads=HEADS, **kw)
  variables = _init(layer, x, mask)
  ref.check_gradients(
      layer, variables, x, mask,
      lambda v, a: dense_synthesizer(v, a, mask, **ref_kw),
      seed=index, rtol=1e-3)


@pytest.mark.parametrize('causal', [False, True])
def test_zero_random_table_plus_dot_product_is_softmax_attention(causal):
  """R = 0 leaves the dot product alone: the layer is `softmax` on real rows
  (softmax's padded query rows attend uniformly, ours are zero)."""
  x, mask = _inputs(12)
  layer = SynthesizerAttention(num_heads=HEADS, causal=causal)
  variables = _init(layer, x, mask)
  p = dict(variables['params'])
  p['random'] = jnp.zeros_like(p['random'])
  y = np.asarray(_apply(layer, {'params': p}, x, mask))
  soft = attention.get_attention('softmax')(num_heads=HEADS, causal=causal)
  y_soft = np.asarray(_apply(soft, {'params': {
      k: p[k] for k in ('query', 'key', 'value', 'out')}}, x, mask))
  np.testing.assert_allclose(y[mask], y_soft[mask], rtol=1e-5, atol=1e-6)


def test_factorized_table_is_the_product_of_its_factors():
  x, mask = _inputs(10)
  fact = SynthesizerAttention(num_heads=HEADS,
                              synthesizer_mode='factorized_random',
                              factorized_k=3)
  variables = _init(fact, x, mask)
  p = dict(variables['params'])
  full = dict(p)
  del full['random1'], full['random2']
  full['random'] = jnp.einsum('hik,hkj->hij', p['random1'], p['random2'])
  y_full = _apply(SynthesizerAttention(num_heads=HEADS), {'params': full}, x,
                  mask)
  np.testing.assert_allclose(np.asarray(_apply(fact, variables, x, mask)),
                             np.asarray(y_full), rtol=1e-5, atol=1e-6)


def test_random_synthesizer_alone_is_linear_in_the_input():
  """Without the dot product the weights do not depend on the input: for a
  fixed padding mask (and no biases) the layer is a linear map."""
  x1, mask = _inputs(9, seed=1)
  x2, _ = _inputs(9, seed=2)
  layer = SynthesizerAttention(num_heads=HEADS, ignore_dot_product=True)
  variables = _init(layer, x1, mask)
  f = lambda a: np.asarray(_apply(layer, variables, a, mask), np.float64)
  np.testing.assert_allclose(f(2.0 * x1 - 3.0 * x2), 2.0 * f(x1) - 3.0 * f(x2),
                             rtol=1e-4, atol=1e-5)


def test_table_defaults_to_the_initial_length_and_crops():
  x, mask = _inputs(12)
  layer = SynthesizerAttention(num_heads=HEADS,
                               synthesizer_mode='dense+random')
  variables = _init(layer, x, mask)
  assert variables['params']['random'].shape == (HEADS, 12, 12)
  assert variables['params']['dense_syn_length'].shape == (HEAD_DIM, 12)
  y = np.asarray(_apply(layer, variables, x, mask))
  # A shorter input uses the top-left corner of the tables: as if cropped.
  y8 = np.asarray(_apply(layer, variables, x[:, :8], mask[:, :8]))
  ref8 = dense_synthesizer(variables, x[:, :8], mask[:, :8],
                           synthesizer_mode='dense+random')
  np.testing.assert_allclose(y8, ref8, rtol=2e-4, atol=2e-5)
  assert y.shape[1] == 12
  longer, mask_l = _inputs(14)
  with pytest.raises(ValueError, match='max_length'):
    jax.eval_shape(lambda v, a, m: layer.apply(v, a, padding_mask=m),
                   variables, jnp.asarray(longer), jnp.asarray(mask_l))
  sized = SynthesizerAttention(num_heads=HEADS, max_length=20)
  assert ref.params(sized, x, mask)['random'].shape == (HEADS, 20, 20)


@pytest.mark.parametrize('causal', [False, True])
def test_any_padding_pattern_gives_finite_values_and_gradients(causal):
  n = 12
  x, mask = ref.with_padded_row(*_inputs(n))
  layer = SynthesizerAttention(num_heads=HEADS, causal=causal,
                               synthesizer_mode='dense+random',
                               ignore_dot_product=True)
  ref.check_any_padding(layer, _init(layer, x, mask), x, mask)


@pytest.mark.parametrize('kw,match', [
    (dict(synthesizer_mode='sparse'), 'synthesizer_mode'),
    (dict(synthesizer_mode='random+factorized_random'), 'synthesizer_mode'),
    (dict(factorized_k=0), 'factorized_k'),
    (dict(max_length=0), 'max_length'),
])
def test_invalid_knobs_raise(kw, match):
  with pytest.raises(ValueError, match=match):
    SynthesizerAttention(num_heads=HEADS, **kw)


def test_data_parallel_mesh():
  """Forward and gradients on the data-parallel mesh equal one device's
  (the random table)."""
  x, mask = _inputs(13)
  layer = SynthesizerAttention(num_heads=HEADS)
  ref.check_mesh(layer, _init(layer, x, mask), x, mask)
