"""Reformer (`reformer`): a float64 reference with explicit key sets, and
invariants tying LSH attention to softmax over shared query-key.

The reference hashes every position with the layer's rotations (paper §3.1),
sorts each round by (bucket, position), and then, query by query and round
by round, lists the keys of its chunk and of the chunk before it (with
multiplicity), takes a softmax over the real ones and combines the rounds by
their log-sum-exps, all in float64 loops.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention import reformer
from lra_msmra.attention.reformer import ReformerAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2
HEAD_DIM = FEATURES // HEADS


def _inputs(length, seed=0):
  return ref.inputs(length, FEATURES, seed, holes=(0, 3, 4, length - 1))


_init = ref.init
_apply = ref.call
_dense = ref.dense
_out = ref.output


def dense_reformer(layer, variables, x, mask):
  """LSH attention with explicit per-query key sets (float64 loops)."""
  p = variables['params']
  x = np.asarray(x, np.float64)
  batch, n, _ = x.shape
  qk, v = _dense(p, 'query', x), _dense(p, 'value', x)
  padded, chunk = layer.layout(n)
  pad = [(0, 0), (0, padded - n), (0, 0), (0, 0)]
  qk, v = np.pad(qk, pad), np.pad(v, pad)
  real = np.pad(mask, [(0, 0), (0, padded - n)])
  rounds, nb = layer.num_hashes, layer.num_buckets
  rot = reformer.lsh_rotations(layer.hash_seed, HEAD_DIM, rounds, nb)
  rot = None if rot is None else np.asarray(rot, np.float64)
  chunks = rounds * padded // chunk
  out = np.zeros((batch, padded, HEADS, HEAD_DIM))
  for b in range(batch):
    for h in range(HEADS):
      q = qk[b, :, h]
      k = q / np.sqrt(np.mean(q ** 2, -1, keepdims=True) + 1e-6) if (
          layer.normalize_keys) else q
      sorted_pos = []
      for r in range(rounds):
        if rot is None:
          bucket = np.zeros(padded, int)
        else:
          proj = q @ rot[:, r]
          bucket = np.argmax(np.concatenate([proj, -proj], -1), -1)
        bucket = np.where(real[b], bucket, nb)
        sorted_pos.append(np.argsort(bucket * padded + np.arange(padded),
                                     kind='stable'))
      sorted_pos = np.concatenate(sorted_pos)
      for i in range(padded):
        if not real[b, i]:
          continue
        outs, lses = [], []
        for r in range(rounds):
          s = r * padded + int(np.where(sorted_pos[r * padded:(r + 1) * padded]
                                        == i)[0][0])
          c = s // chunk
          keys = np.concatenate([
              sorted_pos[c * chunk:(c + 1) * chunk],
              sorted_pos[((c - 1) % chunks) * chunk:
                         ((c - 1) % chunks + 1) * chunk]])
          keys = keys[real[b, keys]]
          logits = k[keys] @ q[i] / math.sqrt(HEAD_DIM)
          if layer.mask_self:
            logits = np.where(keys == i, -1e5, logits)
          top = logits.max()
          e = np.exp(logits - top)
          outs.append((e / e.sum()) @ v[b, keys, h])
          lses.append(top + np.log(e.sum()))
        lses = np.array(lses)
        w = np.exp(lses - lses.max())
        out[b, i, h] = (w / w.sum()) @ np.array(outs)
  return _out(p, out[:, :n], mask)


def _shared_qk_softmax(variables, x, mask, normalize_keys=False):
  """Full softmax attention with keys = queries (float64)."""
  p = variables['params']
  x = np.asarray(x, np.float64)
  q, v = _dense(p, 'query', x), _dense(p, 'value', x)
  k = q / np.sqrt(np.mean(q ** 2, -1, keepdims=True) + 1e-6) if (
      normalize_keys) else q
  logits = np.einsum('bihd,bjhd->bhij', q, k) / math.sqrt(HEAD_DIM)
  logits = np.where(mask[:, None, None, :], logits, -np.inf)
  top = logits.max(-1, keepdims=True)
  e = np.exp(logits - np.where(np.isfinite(top), top, 0))
  total = e.sum(-1, keepdims=True)
  w = e / np.where(total > 0, total, 1)
  out = np.einsum('bhij,bjhd->bihd', w, v) * mask[:, :, None, None]
  return _out(p, out, mask)


CASES = [
    dict(n=12, num_buckets=4),
    dict(n=13, num_buckets=4, num_hashes=2, use_bias=True),
    dict(n=16, num_buckets=6, chunk_length=3, normalize_keys=True),
    dict(n=11, num_buckets=2, num_hashes=3, chunk_length=2, mask_self=True),
    dict(n=10, num_buckets=8, hash_seed=5, normalize_keys=True,
         mask_self=True, num_hashes=2),
]


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_dense_reference(case):
  case = dict(case)
  n = case.pop('n')
  x, mask = _inputs(n)
  layer = ReformerAttention(num_heads=HEADS, **case)
  variables = _init(layer, x, mask)
  y = np.asarray(_apply(layer, variables, x, mask))
  np.testing.assert_allclose(y, dense_reformer(layer, variables, x, mask),
                             rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('index', [1, 3])
def test_gradients_match_finite_differences_of_dense_reference(index):
  """Buckets are piecewise constant; elsewhere the layer is smooth."""
  case = dict(CASES[index])
  n = case.pop('n')
  x, mask = _inputs(n, seed=index)
  layer = ReformerAttention(num_heads=HEADS, **case)
  variables = _init(layer, x, mask)
  ref.check_gradients(
      layer, variables, x, mask,
      lambda v, a: dense_reformer(layer, v, a, mask),
      seed=index, rtol=1e-3)


@pytest.mark.parametrize('kw', [
    dict(num_buckets=1), dict(num_buckets=1, num_hashes=2,
                              normalize_keys=True),
    dict(num_buckets=2, hash_seed=7)])
def test_one_chunk_pair_is_softmax_over_shared_qk(kw):
  """One bucket (one chunk per round), or two buckets (two chunks, each
  seeing the other): every query sees every key, so LSH attention is full
  softmax attention with keys = queries, whatever the hashes."""
  x, mask = _inputs(12)
  layer = ReformerAttention(num_heads=HEADS, **kw)
  variables = _init(layer, x, mask)
  np.testing.assert_allclose(
      np.asarray(_apply(layer, variables, x, mask)),
      _shared_qk_softmax(variables, x, mask, kw.get('normalize_keys', False)),
      rtol=2e-4, atol=2e-5)


def test_hashing_is_fixed_by_the_seed():
  x, mask = _inputs(16)
  layer = ReformerAttention(num_heads=HEADS, num_buckets=8)
  variables = _init(layer, x, mask)
  y = np.asarray(_apply(layer, variables, x, mask))
  np.testing.assert_array_equal(y, np.asarray(_apply(layer, variables, x,
                                                     mask)))
  # Evaluation is deterministic and training hashes the same way.
  y_train = np.asarray(_apply(layer, variables, x, mask, deterministic=False,
                              rngs={'dropout': jax.random.PRNGKey(3)}))
  np.testing.assert_allclose(y_train, y, rtol=1e-5, atol=1e-6)
  other = ReformerAttention(num_heads=HEADS, num_buckets=8, hash_seed=1)
  assert np.abs(np.asarray(_apply(other, variables, x, mask)) - y).max() > 1e-3


def test_any_padding_pattern_gives_finite_values_and_gradients():
  n = 12
  x, mask = ref.with_padded_row(*_inputs(n))
  layer = ReformerAttention(num_heads=HEADS, num_buckets=4, num_hashes=2)
  ref.check_any_padding(layer, _init(layer, x, mask), x, mask)


def test_causal_is_refused():
  x, mask = _inputs(8)
  with pytest.raises(NotImplementedError, match='causal'):
    ReformerAttention(num_heads=HEADS, causal=True).init(
        jax.random.PRNGKey(0), jnp.asarray(x), padding_mask=mask)


@pytest.mark.parametrize('kw,match', [
    (dict(num_buckets=3), 'even'), (dict(num_buckets=0), 'num_buckets'),
    (dict(num_hashes=0), 'num_hashes'), (dict(chunk_length=0),
                                         'chunk_length')])
def test_invalid_knobs_raise(kw, match):
  with pytest.raises(ValueError, match=match):
    ReformerAttention(num_heads=HEADS, **kw)


def test_data_parallel_mesh():
  """Forward and gradients on the data-parallel mesh equal one device's
  (hashing, sorting and chunking)."""
  x, mask = _inputs(13)
  layer = ReformerAttention(num_heads=HEADS, num_buckets=4)
  ref.check_mesh(layer, _init(layer, x, mask), x, mask)
