"""Linformer: a dense float64 reference and its invariants.

The reference projects keys and values with E (its first N rows, padded
positions removed) and applies softmax attention to the k projected rows,
all in numpy float64 (paper Eq. 7 with key-value and headwise sharing).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import models
from lra_msmra.attention import standalone
from lra_msmra.attention.linformer import LinformerAttention
from lra_msmra.attention.softmax import SoftmaxAttention
from tests.attention import sparse_reference as ref

FEATURES, HEADS = 8, 2


def dense_linformer(variables, x, mask, kernel=None):
  p = variables['params']
  x = np.asarray(x, np.float64)
  n = x.shape[1]
  e = np.asarray(p['low_rank_kernel'] if kernel is None else kernel,
                 np.float64)[:n]
  q, k, v = ref.qkv(p, x)
  e = e[None] * mask[..., None]  # [batch, N, k], padded rows removed.
  k_bar = np.einsum('bnr,bnhd->brhd', e, k)
  v_bar = np.einsum('bnr,bnhd->brhd', e, v)
  out = ref.attention_rows(q, k_bar, v_bar,
                           np.ones((1, 1, n, e.shape[-1]), bool))
  return ref.output(p, out, mask)


CASES = [
    dict(n=16, low_rank_features=4),
    dict(n=13, low_rank_features=5, use_bias=True),
    dict(n=7, low_rank_features=9),
    dict(n=11, low_rank_features=3, max_len=20),
]


def _setup(case, seed=0):
  case = dict(case)
  n = case.pop('n')
  x, mask = ref.inputs(n, FEATURES, seed)
  layer = LinformerAttention(num_heads=HEADS, **case)
  return layer, ref.init(layer, x, mask, seed), x, mask


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_dense_reference(case):
  layer, variables, x, mask = _setup(case)
  rows = case.get('max_len') or case['n']
  assert variables['params']['low_rank_kernel'].shape == (
      rows, case['low_rank_features'])
  y = ref.apply(layer, variables, x, mask)
  np.testing.assert_allclose(y, dense_linformer(variables, x, mask),
                             rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('index', [1, 3])
def test_gradients_match_finite_differences(index):
  layer, variables, x, mask = _setup(CASES[index], seed=index)
  ref.check_gradients(layer, variables, x, mask,
                      lambda v, a: dense_linformer(v, a, mask), seed=index)


def test_identity_projection_with_k_equal_n_is_softmax():
  n = 12
  x, _ = ref.inputs(n, FEATURES)
  mask = np.ones((3, n), bool)
  layer = LinformerAttention(num_heads=HEADS, low_rank_features=n)
  variables = ref.init(layer, x, mask)
  variables['params']['low_rank_kernel'] = jnp.eye(n)
  y = ref.apply(layer, variables, x, mask)
  y_soft = ref.apply(SoftmaxAttention(num_heads=HEADS), variables, x, mask)
  np.testing.assert_allclose(y, y_soft, rtol=1e-5, atol=1e-6)
  # A permutation of the positions in E changes nothing either.
  variables['params']['low_rank_kernel'] = jnp.eye(n)[::-1]
  np.testing.assert_allclose(ref.apply(layer, variables, x, mask), y_soft,
                             rtol=1e-5, atol=1e-6)


def test_shorter_inputs_use_the_first_rows_of_e():
  x, mask = ref.inputs(16, FEATURES)
  layer = LinformerAttention(num_heads=HEADS, low_rank_features=4)
  variables = ref.init(layer, x, mask)
  short_x, short_mask = x[:, :10], mask[:, :10].copy()
  short_mask[2, 5] = True
  y = ref.apply(layer, variables, short_x, short_mask)
  np.testing.assert_allclose(y, dense_linformer(variables, short_x,
                                                short_mask),
                             rtol=2e-4, atol=2e-5)
  with pytest.raises(ValueError, match='exceeds'):
    ref.apply(layer, variables, np.concatenate([x, x], 1),
              np.concatenate([mask, mask], 1))


def test_layerwise_sharing_is_one_model_level_e():
  n = 10
  x, mask = ref.inputs(n, FEATURES)
  kw = {'low_rank_features': 3, 'share_layers': True}
  h = standalone.StandaloneAttention(mechanism='linformer', kw=kw,
                                     num_heads=HEADS, qkv_features=FEATURES,
                                     max_len=16)
  variables = {'params': ref.params(h, x, mask)}
  e = variables['params']['attention_shared']['low_rank_kernel']
  assert e.shape == (16, 3)
  assert 'low_rank_kernel' not in variables['params']['attention']
  y = ref.apply(h, variables, x, mask)
  expected = dense_linformer({'params': variables['params']['attention']}, x,
                             mask, kernel=e)
  np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)
  # In the encoder: one E for both layers.
  encoder = models.Encoder(vocab_size=20, max_len=n, num_layers=2,
                           emb_dim=FEATURES, num_heads=HEADS,
                           qkv_dim=FEATURES, mlp_dim=16,
                           attention='linformer', attention_kw=kw)
  ids = jnp.ones((2, n), jnp.int32)
  params = jax.eval_shape(
      lambda key: encoder.init(key, ids, deterministic=True),
      jax.random.PRNGKey(0))
  leaves = [jax.tree_util.keystr(path) for path, _ in
            jax.tree_util.tree_leaves_with_path(params)
            if 'low_rank_kernel' in jax.tree_util.keystr(path)]
  assert len(leaves) == 1 and 'attention_shared' in leaves[0]


def test_causal_is_refused():
  x, mask = ref.inputs(8, FEATURES)
  with pytest.raises(NotImplementedError, match='causal'):
    LinformerAttention(num_heads=HEADS, causal=True).init(
        jax.random.PRNGKey(0), jnp.asarray(x), padding_mask=mask)


def test_padding_invariance():
  x, mask = ref.inputs(13, FEATURES)
  layer = LinformerAttention(num_heads=HEADS, low_rank_features=4,
                             use_bias=True)
  ref.check_padding_invariance(layer, ref.init(layer, x, mask), x, mask)


def test_data_parallel_mesh():
  x, mask = ref.inputs(13, FEATURES)
  layer = LinformerAttention(num_heads=HEADS, low_rank_features=4)
  ref.check_mesh(layer, ref.init(layer, x, mask), x, mask)


def test_knobs_are_checked():
  x, mask = ref.inputs(8, FEATURES)
  for kw, match in (({'low_rank_features': 0}, 'low_rank_features'),
                    ({'max_len': 0}, 'max_len')):
    with pytest.raises(ValueError, match=match):
      LinformerAttention(num_heads=HEADS, **kw).init(
          {}, jnp.asarray(x), padding_mask=mask)
