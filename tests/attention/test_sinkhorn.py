"""Sparse Sinkhorn attention (`sinkhorn`): float64 reference, invariants.

The reference builds the sorting matrix R from its definition (block
summaries -> SortNet logits -> softmax over blocks, or Sinkhorn balancing),
the sorted key and value blocks sum_j R_ij K_j, and then, query by query,
one softmax over its own block's real keys and one over its block's sorted
slots that hold real mass; the two outputs are added (paper Eq. 4-6, the
official code's combination), in float64 loops.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import attention
from lra_msmra.attention.sinkhorn import SinkhornAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2
HEAD_DIM = FEATURES // HEADS


def _inputs(length, seed=0):
  return ref.inputs(length, FEATURES, seed, holes=(0, 3, 4, length - 1))


def _init(layer, x, mask, seed=0):
  variables = {'params': ref.params(layer, x, mask, seed)}
  rng = np.random.RandomState(seed + 100)

  def perturb(path, p):  # non-zero biases, a sharper SortNet
    name = '/'.join(str(getattr(k, 'key', k)) for k in path)
    if name.endswith('bias'):
      return 0.3 * rng.standard_normal(p.shape).astype(np.float32)
    if name.startswith('sort'):
      return 3.0 * p
    return p
  return {'params': jax.tree_util.tree_map_with_path(perturb,
                                                     variables['params'])}


_apply = ref.call
_dense = ref.dense
_out = ref.output


def _softmax(logits, valid):
  logits = np.where(valid, logits, -np.inf)
  if not valid.any():
    return np.zeros_like(logits)
  e = np.exp(logits - logits.max())
  return e / e.sum()


def _sinkhorn(logits, valid, iterations):
  log_r = np.where(valid, logits, -np.inf)
  for _ in range(iterations):
    for axis in (-1, -2):
      top = np.max(log_r, axis=axis, keepdims=True)
      top = np.where(np.isfinite(top), top, 0.0)
      total = np.exp(log_r - top).sum(axis=axis, keepdims=True)
      log_r = np.where(valid, log_r - top - np.log(np.where(total > 0, total,
                                                            1.0)), -np.inf)
  return np.where(valid, np.exp(log_r), 0.0)


def dense_sinkhorn(layer, variables, x, mask):
  """Sinkhorn attention in float64 (see the module docstring)."""
  p = variables['params']
  x = np.asarray(x, np.float64)
  batch, n, _ = x.shape
  b = layer.block_size
  padded = -(-n // b) * b
  q, k, v = (_dense(p, name, x) for name in ('query', 'key', 'value'))
  pad = [(0, 0), (0, padded - n), (0, 0), (0, 0)]
  q, k, v = np.pad(q, pad), np.pad(k, pad), np.pad(v, pad)
  real = np.pad(mask, [(0, 0), (0, padded - n)])
  k, v = k * real[..., None, None], v * real[..., None, None]
  nb = padded // b
  kb = k.reshape(batch, nb, b, HEADS, HEAD_DIM)
  vb = v.reshape(batch, nb, b, HEADS, HEAD_DIM)
  rb = real.reshape(batch, nb, b)
  kernel = np.asarray(p['sort']['kernel'], np.float64)
  out = np.zeros((batch, padded, HEADS, HEAD_DIM))
  for bi in range(batch):
    block_real = rb[bi].any(-1)
    for h in range(HEADS):
      summary = kb[bi, :, 0, h] if layer.causal else kb[bi, :, :, h].sum(1)
      logits = summary @ kernel[:, :nb]
      if 'bias' in p['sort']:
        logits = logits + np.asarray(p['sort']['bias'], np.float64)[:nb]
      logits = logits / layer.temperature
      cols = np.broadcast_to(block_real[None, :], (nb, nb))
      if layer.causal:
        cols = cols & np.tril(np.ones((nb, nb), bool), -1)
      if layer.sort_activation == 'softmax':
        r = np.stack([_softmax(logits[i], cols[i]) for i in range(nb)])
      else:
        r = _sinkhorn(logits, cols & block_real[:, None],
                      layer.sinkhorn_iterations)
      for i in range(nb):
        sk = np.einsum('j,jsd->sd', r[i], kb[bi, :, :, h])
        sv = np.einsum('j,jsd->sd', r[i], vb[bi, :, :, h])
        mass = r[i] @ rb[bi].astype(float)
        for s in range(b):
          t = i * b + s
          if not real[bi, t]:
            continue
          qt = q[bi, t, h] / math.sqrt(HEAD_DIM)
          local_ok = rb[bi, i].copy()
          if layer.causal:
            local_ok &= np.arange(b) <= s
          w_local = _softmax(kb[bi, i, :, h] @ qt, local_ok)
          w_sorted = _softmax(sk @ qt, mass > 0)
          out[bi, t, h] = w_local @ vb[bi, i, :, h] + w_sorted @ sv
  return _out(p, out[:, :n], mask)


CASES = [
    dict(n=12, block_size=4),
    dict(n=13, block_size=4, use_bias=True),
    dict(n=14, block_size=3, sort_activation='sinkhorn', sinkhorn_iterations=4,
         temperature=0.5),
    dict(n=12, block_size=4, causal=True),
    dict(n=11, block_size=3, causal=True, use_bias=True),
    dict(n=10, block_size=2, sort_activation='sinkhorn', max_num_blocks=8),
]


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_dense_reference(case):
  case = dict(case)
  n = case.pop('n')
  x, mask = _inputs(n)
  layer = SinkhornAttention(num_heads=HEADS, **case)
  variables = _init(layer, x, mask)
  y = np.asarray(_apply(layer, variables, x, mask))
  np.testing.assert_allclose(y, dense_sinkhorn(layer, variables, x, mask),
                             rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('index', [1, 2, 4])
def test_gradients_match_finite_differences_of_dense_reference(index):
  case = dict(CASES[index])
  n = case.pop('n')
  x, mask = _inputs(n, seed=index)
  layer = SinkhornAttention(num_heads=HEADS, **case)
  variables = _init(layer, x, mask)
  grads = ref.check_gradients(
      layer, variables, x, mask,
      lambda v, a: dense_sinkhorn(layer, v, a, mask),
      seed=index, rtol=1e-3)
  # The SortNet receives a gradient (the official code's does not).
  assert float(jnp.abs(grads[0]['params']['sort']['kernel']).sum()) > 0


@pytest.mark.parametrize('sort_activation', ['softmax', 'sinkhorn'])
def test_one_block_is_twice_softmax_attention(sort_activation):
  """One block covering the sequence: the local part is softmax attention
  and the single block sorts to itself, so the sum is 2 x softmax."""
  x, mask = _inputs(12)
  layer = SinkhornAttention(num_heads=HEADS, block_size=16,
                            sort_activation=sort_activation)
  variables = _init(layer, x, mask)
  y = np.asarray(_apply(layer, variables, x, mask))
  soft = attention.get_attention('softmax')(num_heads=HEADS)
  p = variables['params']
  y_soft = np.asarray(_apply(soft, {'params': {
      k: p[k] for k in ('query', 'key', 'value', 'out')}}, x, mask))
  np.testing.assert_allclose(y[mask], 2.0 * y_soft[mask], rtol=1e-4,
                             atol=1e-5)


def test_sorting_matrix_rows_and_columns():
  x, mask = _inputs(16)
  mask[1, 12:] = False  # row 1: the last block is all padding
  soft = SinkhornAttention(num_heads=HEADS, block_size=4)
  variables = _init(soft, x, mask)
  _, state = _apply(soft, variables, x, mask, mutable=['intermediates'])
  r = np.asarray(state['intermediates']['sort_matrix'][0])  # [b, h, i, j]
  np.testing.assert_allclose(r.sum(-1), 1.0, rtol=1e-5)
  assert np.all(r[1, :, :, 3] == 0.0)  # padded block never sorted in
  balanced = SinkhornAttention(num_heads=HEADS, block_size=4,
                               sort_activation='sinkhorn',
                               sinkhorn_iterations=200)
  _, state = _apply(balanced, variables, x, mask, mutable=['intermediates'])
  r = np.asarray(state['intermediates']['sort_matrix'][0])
  np.testing.assert_allclose(r[0].sum(-1), 1.0, atol=1e-3)
  np.testing.assert_allclose(r[0].sum(-2), 1.0, atol=1e-3)
  np.testing.assert_allclose(r[1, :, :3, :3].sum(-1), 1.0, atol=1e-3)
  np.testing.assert_allclose(r[1, :, :3, :3].sum(-2), 1.0, atol=1e-3)
  assert np.all(r[1, :, 3] == 0.0) and np.all(r[1, :, :, 3] == 0.0)


def test_uniform_sorting_attends_to_the_mean_block():
  """A zero SortNet gives R = 1 / N_B: the sorted block is the mean of the
  blocks, the same for every block."""
  x, _ = _inputs(12)
  mask = np.ones((3, 12), bool)
  layer = SinkhornAttention(num_heads=HEADS, block_size=4)
  variables = _init(layer, x, mask)
  p = dict(variables['params'])
  p['sort'] = {'kernel': jnp.zeros_like(p['sort']['kernel'])}
  _, state = _apply(layer, {'params': p}, x, mask, mutable=['intermediates'])
  r = np.asarray(state['intermediates']['sort_matrix'][0])
  np.testing.assert_allclose(r, 1.0 / 3.0, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(_apply(layer, {'params': p}, x, mask)),
                             dense_sinkhorn(layer, {'params': p}, x, mask),
                             rtol=2e-4, atol=2e-5)


def test_causal_sorting_uses_earlier_blocks_only():
  x, _ = _inputs(12)
  mask = np.ones((3, 12), bool)
  layer = SinkhornAttention(num_heads=HEADS, block_size=4, causal=True)
  variables = _init(layer, x, mask)
  _, state = _apply(layer, variables, x, mask, mutable=['intermediates'])
  r = np.asarray(state['intermediates']['sort_matrix'][0])
  assert np.all(np.triu(np.ones((3, 3), bool))[None, None] <= (r == 0))
  np.testing.assert_allclose(r[:, :, 1:].sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize('causal', [False, True])
def test_any_padding_pattern_gives_finite_values_and_gradients(causal):
  n = 12
  x, mask = ref.with_padded_row(*_inputs(n))
  layer = SinkhornAttention(num_heads=HEADS, block_size=4, causal=causal)
  ref.check_any_padding(layer, _init(layer, x, mask), x, mask)


def test_more_blocks_than_the_sortnet_raises():
  x, mask = _inputs(8)
  layer = SinkhornAttention(num_heads=HEADS, block_size=4)
  # Shapes only: eval_shape and jit raise while tracing, nothing compiles.
  variables = jax.eval_shape(layer.init, jax.random.PRNGKey(0),
                             jnp.asarray(x), padding_mask=jnp.asarray(mask))
  assert variables['params']['sort']['kernel'].shape == (HEAD_DIM, 2)
  longer, mask_l = _inputs(12)
  with pytest.raises(ValueError, match='max_num_blocks'):
    ref.jitted(layer)({'params': ref.params(layer, x, mask)},
                      jnp.asarray(longer), jnp.asarray(mask_l))


@pytest.mark.parametrize('kw,error,match', [
    (dict(sort_activation='gumbel'), ValueError, 'sort_activation'),
    (dict(block_size=0), ValueError, 'block_size'),
    (dict(temperature=0.0), ValueError, 'temperature'),
    (dict(sort_activation='sinkhorn', causal=True), NotImplementedError,
     'causal'),
])
def test_invalid_knobs_raise(kw, error, match):
  with pytest.raises(error, match=match):
    SinkhornAttention(num_heads=HEADS, **kw)


def test_data_parallel_mesh():
  """Forward and gradients on the data-parallel mesh equal one device's
  (the SortNet and the sorted blocks)."""
  x, mask = _inputs(13)
  layer = SinkhornAttention(num_heads=HEADS, block_size=4)
  ref.check_mesh(layer, _init(layer, x, mask), x, mask)
