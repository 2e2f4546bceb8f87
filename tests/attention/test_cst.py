"""CSA: the invariants of docs/mechanisms/cst.md §8 and a dense reference.

`_reference` below recomputes CSA token by token in float64 from the visibility
rules of the paper (extended windows, masked means, a literal shifted query
with a strictly causal global mask), with none of the module's reshapes,
extensions or shifts; the module must match it for every ordering,
aggregation, extension ratio, with and without biases, untied projections and
padding (including fully padded slices and lengths that are not a multiple of
L). The other tests check the paper's limiting cases against the softmax
reference, locality and causality through Jacobians, and the MS-VIPE rules.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
from flax.core import FrozenDict
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import attention
from lra_msmra import models
from lra_msmra import validation
from lra_msmra.attention import cst
from lra_msmra.attention import softmax
from tests import helpers

FEATURES, HEADS, QKV = 8, 2, 8


class Stack(nn.Module):
  """MS-VIPE tables plus `num_layers` CST layers, wired as the encoder does.

  One layer returns the attention output itself; a deeper stack adds each
  layer's output to its input (the residual stream of a Transformer).
  """
  kw: FrozenDict = FrozenDict()
  causal: bool = False
  num_layers: int = 1
  use_bias: bool = False
  max_len: int = 32
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, padding_mask=None, deterministic=True):
    mechanism = attention.Mechanism(
        'cst', self.kw,
        dict(num_heads=HEADS, qkv_features=QKV, causal=self.causal,
             use_bias=self.use_bias, dropout_rate=self.dropout_rate,
             dtype=self.dtype))
    shared = mechanism.shared_inputs(features=x.shape[-1],
                                     max_len=self.max_len)
    for i in range(self.num_layers):
      layer = mechanism.layer(name=f'attention_{i}')
      h = layer(x, padding_mask=padding_mask, deterministic=deterministic,
                **shared)
      x = h if self.num_layers == 1 else x + h
    return x


def _stack(kw, **fields):
  return Stack(kw=FrozenDict(kw), **fields)


def _inputs(length, batch=2, seed=0):
  rng = np.random.RandomState(seed)
  return jnp.asarray(rng.standard_normal((batch, length, FEATURES)),
                     jnp.float32)


def _randomize(params, seed=1, scale=0.5):
  """Every parameter (biases and tables included) drawn at random."""
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map(
      lambda l: jnp.asarray(scale * rng.standard_normal(l.shape), l.dtype),
      params)


def _init(stack, x, mask=None, seed=1):
  """Random parameters of the right shapes (no need to run the initialisers)."""
  shapes = jax.eval_shape(
      lambda a, m: stack.init(jax.random.PRNGKey(0), a, padding_mask=m), x,
      mask)['params']
  return _randomize(shapes, seed)


# Jitted with the (hashable) module as a static argument: one compilation per
# configuration is much cheaper than op-by-op dispatch on a CPU.
@functools.partial(jax.jit, static_argnames=('stack', 'mutable'))
def _apply(stack, params, x, mask=None, mutable=False):
  return stack.apply({'params': params}, x, padding_mask=mask,
                     mutable=mutable)


def _softmax_attention(params, x, mask, causal=False):
  """The reference softmax layer with the given parameters."""
  layer = softmax.SoftmaxAttention(num_heads=HEADS, qkv_features=QKV,
                                   causal=causal)
  return jax.jit(lambda p, a, m: layer.apply({'params': p}, a,
                                             padding_mask=m))(params, x, mask)


def _set(params, path, fn):
  """Returns a copy of `params` with the leaf at `path` replaced by fn(leaf)."""
  params = jax.tree_util.tree_map(lambda a: a, params)  # copy the dicts.
  node = params
  for key in path[:-1]:
    node = node[key]
  node[path[-1]] = fn(node[path[-1]])
  return params


@functools.partial(jax.jit, static_argnames='stack')
def _jacobian(stack, params, x):
  return jax.jacrev(lambda a: stack.apply({'params': params}, a[None])[0])(x)


def _influence(stack, params, x):
  """[i, j] = sum |d y_i / d x_j| for one example `x` `[length, features]`."""
  return np.abs(np.asarray(_jacobian(stack, params, x))).sum(axis=(1, 3))


# ------------------------------------------------------------ dense reference


def _attend(p, q_in, k_in, v_in, use_bias):
  """One query over K keys with the projections in `p`.

  K may be 0: a query that sees no key outputs zero, W_o's bias included
  (docs/mechanisms/cst.md §6: a query with no visible real slice outputs
  zero).
  """
  if not len(k_in):
    return np.zeros(p['out']['kernel'].shape[-1])

  def proj(name, a):
    y = np.einsum('...f,fhd->...hd', a, p[name]['kernel'])
    return y + p[name]['bias'] if use_bias else y
  head_dim = p['query']['kernel'].shape[-1]
  q = proj('query', q_in) / math.sqrt(head_dim)
  k, v = proj('key', np.stack(k_in)), proj('value', np.stack(v_in))
  logits = np.einsum('hd,khd->hk', q, k)
  w = np.exp(logits - logits.max(axis=1, keepdims=True))
  w /= w.sum(axis=1, keepdims=True)
  heads = np.einsum('hk,khd->hd', w, v)
  y = np.einsum('hd,hdf->f', heads, p['out']['kernel'])
  return y + p['out']['bias'] if use_bias else y


def _spread(g, size):
  """Broadcasts per-slice rows `[slices, D]` to their tokens."""
  return np.repeat(g, size, axis=0)


def _reference(params, x, mask, kw, causal, use_bias):
  """CSA token by token in float64 (docs/mechanisms/cst.md §2 and §6)."""
  size = kw.get('slice_length', 8)
  alpha = kw.get('alpha', 1)
  composition = kw.get('composition', 'local_first')
  aggregation = kw.get('aggregation', 'mean')
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  lp = p['attention_0']
  gp = lp if kw.get('share_local_global', True) else {
      n: lp['global_' + n] for n in ('query', 'key', 'value', 'out')}
  tables = p.get('attention_shared')
  width = (alpha - 1) * size // 2
  x, mask = np.asarray(x, np.float64), np.asarray(mask)
  batch, length, features = x.shape
  slices = -(-length // size)
  padded = slices * size

  def pos(name, row):
    return 0.0 if tables is None else tables[name][row]

  def local(xb, mb):
    ys = np.zeros((padded, features))
    for i in range(padded):
      start = (i // size) * size
      stop = i + 1 if causal else start + size + width
      keys = [j for j in range(start - width, stop)
              if 0 <= j < padded and mb[j]]
      ys[i] = _attend(
          lp, xb[i] + pos('local', i - start + width),
          [xb[j] + pos('local', j - start + width) for j in keys],
          [xb[j] for j in keys], use_bias)
    return ys

  def aggregate(ys, mb):
    out = np.zeros((slices, features))
    for s in range(slices):
      rows, real = ys[s * size:(s + 1) * size], mb[s * size:(s + 1) * size]
      if aggregation == 'mean':
        out[s] = rows[real].sum(0) / max(real.sum(), 1)
      elif aggregation == 'max':
        out[s] = rows[real].max(0) if real.any() else 0.0
      elif real.any():  # 'linear'; an empty slice's embedding is zero.
        kernel = lp['slice_projection']['kernel']  # [L, D, D]
        out[s] = np.einsum('lf,lfg->g', rows * real[:, None], kernel)
        if use_bias:
          out[s] += lp['slice_projection']['bias']
    return out

  def global_(emb, valid):
    out = np.zeros((slices, features))
    for t in range(slices):
      if causal:
        if t == 0:
          continue  # no slice before the first one.
        # The paper's form: query of slice t - 1, keys s < t. When all of
        # them are padding there is no key, and the output is zero.
        query, keys = t - 1, [s for s in range(t) if valid[s]]
      else:
        query, keys = t, [s for s in range(slices) if valid[s]]
      out[t] = _attend(gp, emb[query] + pos('global', query),
                       [emb[s] + pos('global', s) for s in keys],
                       [emb[s] for s in keys], use_bias)
    return out

  result = np.zeros((batch, length, features))
  for b in range(batch):
    xb = np.zeros((padded, features))
    xb[:length] = x[b]
    mb = np.zeros(padded, bool)
    mb[:length] = mask[b]
    valid = mb.reshape(slices, size).any(axis=1)
    if composition == 'local_only':
      y = local(xb, mb)
    elif composition == 'local_first':
      y_local = local(xb, mb)
      y = y_local + _spread(global_(aggregate(y_local, mb), valid), size)
    elif composition == 'parallel':
      y = local(xb, mb) + _spread(global_(aggregate(xb, mb), valid), size)
    else:
      g = _spread(global_(aggregate(xb, mb), valid), size)
      y = local(xb + g, mb) + g
    y[~mb] = 0.0
    result[b] = y[:length]
  return result


def _mask_with_gaps(length, batch=2):
  """Example 0 all real; example 1 has padding inside and at the end."""
  mask = np.ones((batch, length), bool)
  mask[1, 4:8] = False  # a whole slice for L in {2, 4}.
  mask[1, length - 2:] = False
  return jnp.asarray(mask)


REFERENCE_CASES = [
    ({'slice_length': 4}, False, False),
    ({'slice_length': 4, 'alpha': 3}, False, True),
    ({'slice_length': 4, 'alpha': 2, 'aggregation': 'max',
      'share_local_global': False}, False, False),
    ({'slice_length': 2, 'alpha': 2, 'aggregation': 'linear',
      'composition': 'parallel'}, False, True),
    ({'slice_length': 4, 'alpha': 3, 'composition': 'global_first'}, False,
     False),
    ({'slice_length': 4, 'position_embedding': 'none'}, False, False),
    ({'slice_length': 4, 'alpha': 3}, True, True),
    ({'slice_length': 2, 'alpha': 2, 'composition': 'global_first',
      'aggregation': 'max'}, True, False),
    ({'slice_length': 4, 'composition': 'parallel', 'aggregation': 'linear',
      'share_local_global': False}, True, False),
    ({'slice_length': 4, 'alpha': 2, 'composition': 'local_only'}, True,
     False),
]


@pytest.mark.parametrize(
    'kw,causal,use_bias', REFERENCE_CASES,
    ids=[f'{"-".join(f"{k}={v}" for k, v in kw.items())}-causal={c}-bias={b}'
         for kw, c, b in REFERENCE_CASES])
def test_matches_dense_reference(kw, causal, use_bias):
  length = 13  # not a multiple of L: padded internally, cropped back.
  stack = _stack(kw, causal=causal, use_bias=use_bias, max_len=16)
  x, mask = _inputs(length), _mask_with_gaps(length)
  params = _init(stack, x, mask)
  y = _apply(stack, params, x, mask)
  expected = _reference(params, x, mask, kw, causal, use_bias)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


def _mask_with_empty_slices(length, batch=3):
  """Masks whose padding covers whole slices of L = 2 and L = 4.

  Example 0 is left-padded (slices 0 and 1 hold no real token, slice 2 a
  few); example 1 has an empty first slice and, after two real ones, an
  empty slice whose embedding is the causal query of the next slice (with
  two real keys, so that the query matters); example 2 is real up to
  trailing padding.
  """
  mask = np.ones((batch, length), bool)
  mask[0, :10] = False
  mask[1, :4] = False
  mask[1, 12:16] = False
  mask[2, length - 3:] = False
  return jnp.asarray(mask)


# Empty slices in causal mode, biases on: a slice whose visible past is all
# padding gets a global output of zero (as slice 0 does), and an empty slice's
# embedding is zero under every aggregation (it is the shifted query of the
# next slice, so it reaches real outputs).
EMPTY_SLICE_CASES = [
    ({'slice_length': 4}, True),
    ({'slice_length': 4, 'alpha': 3, 'aggregation': 'linear'}, True),
    ({'slice_length': 2, 'alpha': 2, 'aggregation': 'linear',
      'composition': 'parallel', 'share_local_global': False}, True),
    ({'slice_length': 4, 'alpha': 2, 'aggregation': 'max',
      'composition': 'global_first'}, True),
    ({'slice_length': 4, 'aggregation': 'linear'}, False),
]


@pytest.mark.parametrize(
    'kw,causal', EMPTY_SLICE_CASES,
    ids=[f'{"-".join(f"{k}={v}" for k, v in kw.items())}-causal={c}'
         for kw, c in EMPTY_SLICE_CASES])
def test_empty_slices_match_dense_reference(kw, causal):
  length = 19  # not a multiple of L: padded internally, cropped back.
  stack = _stack(kw, causal=causal, use_bias=True, max_len=20)
  x, mask = _inputs(length, batch=3), _mask_with_empty_slices(length)
  params = _init(stack, x, mask)
  y = _apply(stack, params, x, mask)
  expected = _reference(params, x, mask, kw, causal, use_bias=True)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('aggregation', ['mean', 'max', 'linear'])
def test_causal_global_output_is_zero_without_a_real_slice_before(
    aggregation):
  """Left padding: slices 0 to 2 see no real slice, like slice 0 of any input.

  Biases on, so a branch that attends to nothing and still adds W_o's bias
  shows.
  """
  length, size = 16, 4
  stack = _stack({'slice_length': size, 'aggregation': aggregation},
                 causal=True, use_bias=True, max_len=length)
  x = _inputs(length)
  mask = np.ones((2, length), bool)
  mask[0, :9] = False  # slices 0, 1 empty; slice 2 has its first real token.
  params = _init(stack, x, jnp.asarray(mask))
  _, sown = _apply(stack, params, x, jnp.asarray(mask),
                   mutable=('intermediates',))
  (y_global,) = sown['intermediates']['attention_0']['global_output']
  y_global = np.asarray(y_global)
  assert np.all(y_global[0, :3] == 0.0)
  assert np.all(np.abs(y_global[0, 3]).sum(-1) > 0)
  assert np.all(y_global[1, 0] == 0.0)
  assert np.all(np.abs(y_global[1, 1:]).sum(-1) > 0)


# -------------------------- limiting cases (docs/mechanisms/cst.md §8)


@pytest.mark.parametrize('causal', [False, True])
def test_one_slice_without_global_is_softmax_attention(causal):
  """L = N, alpha = 1, global off, zero tables: standard attention."""
  length = 16
  stack = _stack({'slice_length': length, 'composition': 'local_only'},
                 causal=causal, max_len=length)
  x, mask = _inputs(length), _mask_with_gaps(length)
  params = _init(stack, x, mask)
  params = _set(params, ('attention_shared', 'local'), jnp.zeros_like)
  y = _apply(stack, params, x, mask)
  ref = _softmax_attention(params['attention_0'], x, mask, causal)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(y)[real], np.asarray(ref)[real],
                             rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(y)[~real] == 0.0)


def test_one_slice_with_global_adds_projected_mean():
  """L = N: one global key of weight 1, so Y = Y_l + W_o(mean(Y_l) W_v)."""
  length = 16
  stack = _stack({'slice_length': length}, max_len=length)
  x, mask = _inputs(length), _mask_with_gaps(length)
  params = _init(stack, x, mask)  # the slice-level table stays random.
  params = _set(params, ('attention_shared', 'local'), jnp.zeros_like)
  y = _apply(stack, params, x, mask)
  p = params['attention_0']
  y_local = _softmax_attention(p, x, mask)
  m = np.asarray(mask)[..., None]
  mean = (np.asarray(y_local) * m).sum(1) / m.sum(1)
  v = np.einsum('bf,fhd->bhd', mean, p['value']['kernel'])
  g = np.einsum('bhd,hdf->bf', v, p['out']['kernel'])
  expected = (np.asarray(y_local) + g[:, None]) * m
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5)


# 200 slices: the global attention runs in two query blocks
# (`base.ATTENTION_QUERY_BLOCK` = 128), the second partly padding.
@pytest.mark.parametrize('length', [12, 200])
def test_unit_slices_compose_two_full_attentions(length):
  """L = 1: Y_l = W_o(X W_v), then full attention over Y_l (zero P_g)."""
  stack = _stack({'slice_length': 1}, max_len=length)
  x, mask = _inputs(length), _mask_with_gaps(length)
  params = _init(stack, x, mask)  # the local table stays random.
  params = _set(params, ('attention_shared', 'global'), jnp.zeros_like)
  y = _apply(stack, params, x, mask)
  p = params['attention_0']
  v = jnp.einsum('blf,fhd->blhd', x, p['value']['kernel'])
  y_local = jnp.einsum('blhd,hdf->blf', v, p['out']['kernel'])
  y_global = _softmax_attention(p, y_local, mask)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(y)[real],
                             np.asarray(y_local + y_global)[real],
                             rtol=1e-5, atol=1e-5)


# ------------------------------------------------- locality and causality


@pytest.mark.parametrize('alpha', [1, 2, 3])
def test_local_path_sees_only_its_extended_slice(alpha):
  """Global off: y_i depends on x_j iff j is in [sL - e, (s + 1)L + e)."""
  length, size = 16, 4
  width = (alpha - 1) * size // 2
  stack = _stack({'slice_length': size, 'alpha': alpha,
                  'composition': 'local_only'}, max_len=length)
  x = _inputs(length, batch=1)
  influence = _influence(stack, _init(stack, x), x[0])
  i, j = np.meshgrid(np.arange(length), np.arange(length), indexing='ij')
  start = (i // size) * size
  window = (j >= start - width) & (j < start + size + width)
  np.testing.assert_array_equal(influence > 0, window)


def test_global_path_reaches_every_token():
  length = 16
  stack = _stack({'slice_length': 4}, max_len=length)
  x = _inputs(length, batch=1)
  assert np.all(_influence(stack, _init(stack, x), x[0]) > 0)


@pytest.mark.parametrize('size', [2, 4, 8])
@pytest.mark.parametrize('alpha', [1, 2, 3])
def test_causal_support_is_exactly_the_past(size, alpha):
  """1 and 2 layers: y_i depends on exactly x_0..x_i (global path included)."""
  length = 16
  x = _inputs(length, batch=1)
  past = np.tril(np.ones((length, length), bool))
  for layers in (1, 2):
    stack = _stack({'slice_length': size, 'alpha': alpha}, causal=True,
                   num_layers=layers, max_len=length)
    influence = _influence(stack, _init(stack, x), x[0])
    np.testing.assert_array_equal(influence > 0, past,
                                  err_msg=f'{layers} layer(s)')


@pytest.mark.parametrize('causal', [False, True])
def test_causal_global_output_of_first_slice_is_zero(causal):
  length = 16
  stack = _stack({'slice_length': 4}, causal=causal, use_bias=True,
                 max_len=length)
  x = _inputs(length)
  params = _init(stack, x)
  _, sown = _apply(stack, params, x, mutable=('intermediates',))
  (y_global,) = sown['intermediates']['attention_0']['global_output']
  first_is_zero = np.all(np.asarray(y_global)[:, 0] == 0.0)
  assert first_is_zero == causal
  assert np.all(np.abs(np.asarray(y_global)[:, 1:]).sum(-1) > 0)


# ------------------------------------------------------------------ padding


@pytest.mark.parametrize('kw', [
    {'slice_length': 4, 'alpha': 3},
    {'slice_length': 4, 'alpha': 2, 'aggregation': 'max',
     'composition': 'global_first'},
    {'slice_length': 4, 'aggregation': 'linear', 'composition': 'parallel'},
], ids=['mean', 'max-global_first', 'linear-parallel'])
@pytest.mark.parametrize('causal', [False, True])
def test_fully_padded_slices_stay_finite(kw, causal):
  length = 14
  stack = _stack(kw, causal=causal, max_len=length)
  x = _inputs(length, batch=3)
  mask = np.ones((3, length), bool)
  mask[0, 4:8] = False   # an empty slice between real ones.
  mask[1, :8] = False    # empty leading slices.
  mask[2, :] = False     # an entirely padded example.
  mask = jnp.asarray(mask)
  params = _init(stack, x, mask)

  def loss(p, a):
    y = stack.apply({'params': p}, a, padding_mask=mask)
    return jnp.sum(y ** 2), y
  grads, y = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)
  assert np.all(np.isfinite(np.asarray(y)))
  assert np.all(np.asarray(y)[~np.asarray(mask)] == 0.0)
  for g in jax.tree_util.tree_leaves(grads):
    assert np.all(np.isfinite(np.asarray(g)))
  # Padded inputs get no gradient.
  assert np.all(np.asarray(grads[1])[~np.asarray(mask)] == 0.0)


@pytest.mark.parametrize('aggregation', ['mean', 'max'])
def test_permutation_inside_a_slice_keeps_its_embedding(aggregation):
  """Tokens and their mask permuted inside slice 1 (alpha = 1, P_l = 0)."""
  length, size = 16, 4
  stack = _stack({'slice_length': size, 'aggregation': aggregation},
                 max_len=length)
  x = _inputs(length)
  mask = np.ones((2, length), bool)
  mask[1, 5] = False
  params = _init(stack, x, jnp.asarray(mask))
  params = _set(params, ('attention_shared', 'local'), jnp.zeros_like)
  order = np.arange(length)
  order[4:8] = [6, 4, 7, 5]

  def run(a, m):
    y, sown = _apply(stack, params, a, jnp.asarray(m),
                     mutable=('intermediates',))
    (emb,) = sown['intermediates']['attention_0']['slice_embedding']
    return np.asarray(y), np.asarray(emb)
  y, emb = run(x, mask)
  y_perm, emb_perm = run(x[:, order], mask[:, order])
  np.testing.assert_allclose(emb_perm, emb, rtol=1e-5, atol=1e-6)
  # The outputs are permuted the same way: the layer is equivariant inside a
  # slice when the local table is zero.
  np.testing.assert_allclose(y_perm, y[:, order], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ MS-VIPE


@pytest.mark.parametrize('kw,causal', [
    ({'slice_length': 4, 'alpha': 3}, False),
    ({'slice_length': 4, 'alpha': 2, 'share_local_global': False}, True),
])
def test_positions_never_reach_the_values(kw, causal):
  """With W_q = W_k = 0 (uniform attention) the tables cannot matter."""
  length = 14
  stack = _stack(kw, causal=causal, max_len=length)
  x, mask = _inputs(length), _mask_with_gaps(length)
  params = _init(stack, x, mask)
  other = _set(_set(params, ('attention_shared', 'local'), lambda t: t + 3.0),
               ('attention_shared', 'global'), lambda t: t - 2.0)

  def run(p):
    return np.asarray(_apply(stack, p, x, mask))
  # Sanity: with the learned W_q, W_k the tables do change the output.
  assert np.abs(run(params) - run(other)).max() > 1e-3
  for prefix in ('', 'global_'):
    for name in ('query', 'key'):
      if prefix + name in params['attention_0']:
        for p in (params, other):
          p['attention_0'][prefix + name] = jax.tree_util.tree_map(
              jnp.zeros_like, p['attention_0'][prefix + name])
  np.testing.assert_allclose(run(other), run(params), rtol=1e-5, atol=1e-6)


def test_tables_are_created_once_and_shared_by_all_layers():
  kw = {'slice_length': 4, 'alpha': 3}
  encoder = models.Encoder(
      vocab_size=11, max_len=30, num_layers=2, emb_dim=FEATURES,
      num_heads=HEADS, qkv_dim=QKV, mlp_dim=16, attention='cst',
      attention_kw=FrozenDict(kw), pos_emb='none', use_cls=True)
  ids = jnp.asarray(np.random.RandomState(0).randint(1, 11, (2, 30)))
  params = jax.eval_shape(lambda a: encoder.init(
      jax.random.PRNGKey(0), a, deterministic=True), ids)['params']
  tables = params['attention_shared']
  # alpha L local rows; ceil(31 / 4) slice rows (30 tokens plus CLS):
  # (L_k + N_max / L) D parameters for the whole model.
  assert tables['local'].shape == (12, FEATURES)
  assert tables['global'].shape == (8, FEATURES)
  paths = ['/'.join(str(k.key) for k in path) for path, _ in
           jax.tree_util.tree_flatten_with_path(params)[0]]
  assert [p for p in paths if p.endswith(('/local', '/global'))] == [
      'attention_shared/global', 'attention_shared/local']
  assert not any('pos_embedding' in p for p in paths)


@pytest.mark.parametrize('alpha', [1, 2, 3])
def test_causal_local_table_has_only_the_left_window_rows(alpha):
  kw = {'slice_length': 4, 'alpha': alpha}
  stack = _stack(kw, causal=True, max_len=16)
  x = _inputs(16)
  params = _init(stack, x)
  rows = (alpha + 1) * 4 // 2
  assert params['attention_shared']['local'].shape == (rows, FEATURES)
  # Every row is used: each one receives a gradient.
  grad = jax.grad(lambda p: jnp.sum(stack.apply({'params': p}, x) ** 2))(
      params)['attention_shared']['local']
  assert np.all(np.abs(np.asarray(grad)).sum(-1) > 0)
  # The tables follow the layers' own causal flag: one object builds both.
  for causal, local_rows in ((True, rows), (False, alpha * 4)):
    mechanism = attention.Mechanism('cst', kw, {'causal': causal})
    tables = mechanism.shared_module(features=FEATURES, max_len=16)
    assert tables.local_len == local_rows


def test_conventional_ablation_has_no_tables():
  kw = {'slice_length': 4, 'position_embedding': 'none'}
  assert attention.Mechanism('cst', kw).shared_module(
      features=FEATURES, max_len=16) is None
  assert attention.Mechanism('cst', kw).shared_inputs(
      features=FEATURES, max_len=16) == {}
  stack = _stack(kw, max_len=16)
  x = _inputs(16)
  assert 'attention_shared' not in _init(stack, x)
  with pytest.raises(ValueError, match="position_embedding='none'"):
    cst.CompositeSliceAttention(num_heads=HEADS, **kw).init(
        jax.random.PRNGKey(0), x,
        shared={'local': jnp.zeros((4, FEATURES)),
                'global': jnp.zeros((4, FEATURES))})


# ------------------------------------------------------------------- errors


def test_missing_tables_is_a_clear_error():
  layer = cst.CompositeSliceAttention(num_heads=HEADS, slice_length=4)
  with pytest.raises(ValueError, match='needs the model-level MS-VIPE'):
    layer.init(jax.random.PRNGKey(0), _inputs(16))


def test_table_shorter_than_input_is_an_error():
  stack = _stack({'slice_length': 4}, max_len=8)
  with pytest.raises(ValueError, match='max_len'):
    stack.init(jax.random.PRNGKey(0), _inputs(16))


@pytest.mark.parametrize('kw,match', [
    ({'alpha': 4}, 'alpha=4'),
    ({'alpha': 2, 'slice_length': 3}, 'even slice_length'),
    ({'slice_length': 0}, 'slice_length=0'),
    ({'composition': 'global_local'}, 'composition'),
    ({'aggregation': 'sum'}, 'aggregation'),
    ({'position_embedding': 'learned'}, 'position_embedding'),
])
def test_invalid_knobs_are_rejected(kw, match):
  with pytest.raises(ValueError, match=match):
    cst.CompositeSliceAttention(num_heads=HEADS, **kw)
  # The same message surfaces from config validation.
  config = helpers.tiny_listops_config()
  config.model.attention = 'cst'
  config.model.attention_kw = kw
  with pytest.raises(ValueError, match=match):
    validation.validate(config)
  # and the same config with a valid CST knob set passes.
  config.model.attention_kw = {'slice_length': 4, 'alpha': 2}
  validation.validate(config)


# --------------------------------------------------------------- efficiency


@pytest.mark.parametrize('causal', [False, True])
def test_no_array_has_two_long_axes(causal):
  """N = 512, L = 16: every intermediate has at most one axis >= N / 4."""
  length = 512
  stack = _stack({'slice_length': 16, 'alpha': 3}, causal=causal,
                 max_len=length)
  x = jnp.zeros((1, length, FEATURES))
  jaxpr = jax.make_jaxpr(
      lambda a: stack.init_with_output(jax.random.PRNGKey(0), a))(x)

  def shapes(jxpr):
    for eqn in jxpr.eqns:
      for var in eqn.outvars:
        yield getattr(var.aval, 'shape', ())
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if hasattr(sub, 'jaxpr') and hasattr(sub.jaxpr, 'eqns'):
            yield from shapes(sub.jaxpr)  # a ClosedJaxpr.
          elif hasattr(sub, 'eqns'):
            yield from shapes(sub)
  long_axes = [s for s in shapes(jaxpr.jaxpr)
               if sum(d >= length // 4 for d in s) > 1]
  assert not long_axes, long_axes
