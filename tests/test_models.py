"""The LRA encoder against an independent NumPy reference, and its options."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import attention
from lra_msmra import config_lib
from lra_msmra import models


def small_model_config(**overrides):
  m = config_lib.default_config().model
  m.num_layers, m.emb_dim, m.num_heads, m.qkv_dim, m.mlp_dim = 2, 16, 4, 16, 24
  m.head_hidden = (12,)
  m.dropout_rate = m.attention_dropout_rate = 0.0
  m.update(overrides)
  return m


def ids_batch(rng, batch=3, length=11, vocab=20, pad_from=(11, 7, 3)):
  ids = rng.integers(1, vocab, size=(batch, length))
  for b, p in enumerate(pad_from):
    ids[b, p:] = 0
  return ids


# --------------------------------------------------------- NumPy reference


def np_layer_norm(x, p, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p['scale'] + p['bias']


def np_gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def np_attention(x, p, mask, num_heads):
  """LRA softmax attention: outer-product mask, -1e10 bias, 1/sqrt(d)."""
  b, n, _ = x.shape
  q = np.einsum('bnf,fhd->bnhd', x, p['query']['kernel'])
  k = np.einsum('bnf,fhd->bnhd', x, p['key']['kernel'])
  v = np.einsum('bnf,fhd->bnhd', x, p['value']['kernel'])
  d = q.shape[-1]
  logits = np.einsum('bqhd,bkhd->bhqk', q / np.sqrt(d), k)
  valid = mask[:, None, :, None] & mask[:, None, None, :]
  logits = logits + np.where(valid, 0.0, -1e10)
  logits = logits - logits.max(-1, keepdims=True)
  w = np.exp(logits)
  w = w / w.sum(-1, keepdims=True)
  y = np.einsum('bhqk,bkhd->bqhd', w, v)
  return np.einsum('bqhd,hdf->bqf', y, p['out']['kernel'])


def np_classifier(params, ids, cfg, max_len):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  enc = p['encoder']
  mask = ids > 0
  x = enc['embed']['embedding'][ids]
  cls = np.broadcast_to(enc['cls'], (ids.shape[0], 1, x.shape[-1]))
  x = np.concatenate([cls, x], 1)
  mask = np.concatenate([mask[:, :1], mask], 1)
  x = x + models.sinusoidal_table(max_len + 1, x.shape[-1])[None, :x.shape[1]]
  for i in range(cfg.num_layers):
    blk = enc[f'block_{i}']
    h = np_layer_norm(x, blk['ln_attention'], cfg.layer_norm_eps)
    x = x + np_attention(h, blk['attention'], mask, cfg.num_heads)
    h = np_layer_norm(x, blk['ln_mlp'], cfg.layer_norm_eps)
    h = h @ blk['mlp']['dense_in']['kernel'] + blk['mlp']['dense_in']['bias']
    h = np_gelu_tanh(h)
    h = h @ blk['mlp']['dense_out']['kernel'] + blk['mlp']['dense_out']['bias']
    x = x + h
  x = np_layer_norm(x, enc['encoder_norm'], cfg.layer_norm_eps)
  h = x[:, 0]
  h = np.maximum(h @ p['head']['hidden_0']['kernel'] +
                 p['head']['hidden_0']['bias'], 0)
  return h @ p['head']['logits']['kernel'] + p['head']['logits']['bias']


def test_classifier_matches_numpy_reference():
  cfg = small_model_config()
  model = models.create_model(cfg, vocab_size=20, num_classes=5, max_len=11,
                              dual=False)
  ids = ids_batch(np.random.default_rng(0))
  params = model.init(jax.random.PRNGKey(0), {'inputs': ids},
                      deterministic=True)['params']
  # Make the zero-initialised CLS vector non-trivial.
  params['encoder']['cls'] = 0.3 * jnp.ones_like(params['encoder']['cls'])
  logits = model.apply({'params': params}, {'inputs': ids},
                       deterministic=True)
  ref = np_classifier(params, ids, cfg, max_len=11)
  np.testing.assert_allclose(np.asarray(logits), ref, rtol=2e-4, atol=2e-5)


def test_lra_initialisation():
  cfg = small_model_config(emb_dim=64, qkv_dim=64)
  model = models.create_model(cfg, vocab_size=300, num_classes=2, max_len=8,
                              dual=False)
  p = model.init(jax.random.PRNGKey(0), {'inputs': np.ones((1, 8), np.int32)},
                 deterministic=True)['params']
  enc = p['encoder']
  assert abs(float(jnp.std(enc['embed']['embedding'])) - 1.0) < 0.05
  assert float(jnp.abs(enc['cls']).max()) == 0.0
  mlp_bias = enc['block_0']['mlp']['dense_in']['bias']
  assert 0 < float(jnp.abs(mlp_bias).max()) < 1e-5
  assert 'bias' not in enc['block_0']['attention']['query']
  q = enc['block_0']['attention']['query']['kernel']  # Xavier on [64, 64].
  assert abs(float(jnp.std(q)) - np.sqrt(2 / 128)) < 0.01


def test_torch_initialisation_has_attention_biases():
  cfg = small_model_config(init_style='torch', attention_bias=True,
                           emb_init_std=0.02)
  model = models.create_model(cfg, vocab_size=50, num_classes=2, max_len=8,
                              dual=False)
  p = model.init(jax.random.PRNGKey(0), {'inputs': np.ones((1, 8), np.int32)},
                 deterministic=True)['params']['encoder']
  assert 'bias' in p['block_0']['attention']['query']
  bound = 1 / np.sqrt(16)
  k = p['block_0']['mlp']['dense_in']['kernel']
  assert float(jnp.abs(k).max()) <= bound
  assert abs(float(jnp.std(p['embed']['embedding'])) - 0.02) < 0.005


def test_cls_mask_copies_first_token():
  enc = models.Encoder(vocab_size=10, max_len=4, num_layers=1, emb_dim=8,
                       num_heads=2, qkv_dim=8, mlp_dim=8, use_cls=True)
  ids = np.array([[0, 3, 0, 0], [2, 0, 0, 0]])
  variables = enc.init(jax.random.PRNGKey(0), ids, deterministic=True)
  _, mask = enc.apply(variables, ids, deterministic=True)
  np.testing.assert_array_equal(mask, [[0, 0, 1, 0, 0], [1, 1, 0, 0, 0]])


def test_sinusoidal_table_interleaved():
  t = models.sinusoidal_table(5, 6)
  w = np.exp(-np.arange(0, 6, 2) * np.log(10000.0) / 6)
  np.testing.assert_allclose(t[3, 0::2], np.sin(3 * w), rtol=1e-6)
  np.testing.assert_allclose(t[3, 1::2], np.cos(3 * w), rtol=1e-6)


@pytest.mark.parametrize('mode', models.POOLINGS)
def test_pooling_modes(mode):
  x = jnp.arange(2 * 3 * 2, dtype=jnp.float32).reshape(2, 3, 2)
  mask = jnp.array([[1, 1, 0], [1, 0, 0]], bool)
  out = models.pool(x, mask, mode, zero_padded=False)
  expected = {
      'CLS': x[:, 0], 'MEAN': x.mean(1), 'SUM': x.sum(1),
      'MASKED_MEAN': jnp.stack([x[0, :2].mean(0), x[1, :1].mean(0)]),
      'FLATTEN': x.reshape(2, 6)}[mode]
  np.testing.assert_allclose(out, expected)


def test_zero_padded_mean_divides_by_full_length():
  x = jnp.ones((1, 4, 2))
  mask = jnp.array([[1, 1, 0, 0]], bool)
  np.testing.assert_allclose(models.pool(x, mask, 'MEAN', zero_padded=True),
                             [[0.5, 0.5]])


def test_dual_encoder_shares_weights_and_combines():
  for interaction, hidden in (('concat', (8, 4)), ('nli', (8,))):
    cfg = small_model_config(dual_interaction=interaction, head_hidden=hidden)
    model = models.create_model(cfg, vocab_size=20, num_classes=2, max_len=9,
                                dual=True)
    rng = np.random.default_rng(1)
    batch = {'inputs': ids_batch(rng, length=9, pad_from=(9, 4, 2)),
             'inputs2': ids_batch(rng, length=9, pad_from=(5, 9, 1))}
    variables = model.init(jax.random.PRNGKey(0), batch, deterministic=True)
    p = variables['params']
    assert set(p) == {'encoder', 'head'}
    assert 'cls' not in p['encoder']  # no CLS token in the dual encoder
    width = 2 if interaction == 'concat' else 4
    assert p['head']['hidden_0']['kernel'].shape == (width * 16, 8)
    logits = model.apply(variables, batch, deterministic=True)
    assert logits.shape == (3, 2)
    swapped = model.apply(variables, {'inputs': batch['inputs2'],
                                      'inputs2': batch['inputs']},
                          deterministic=True)
    assert not np.allclose(logits, swapped)  # order matters: [u, v] != [v, u]


def test_input_longer_than_max_len_raises():
  model = models.create_model(small_model_config(), vocab_size=20,
                              num_classes=2, max_len=4, dual=False)
  with pytest.raises(ValueError, match='max_len'):
    model.init(jax.random.PRNGKey(0), {'inputs': np.ones((1, 6), np.int32)},
               deterministic=True)


class _CountingTables(nn.Module):
  """A shared module: one table for the whole model."""
  features: int

  @nn.compact
  def __call__(self):
    return self.param('table', nn.initializers.normal(1.0), (self.features,))


class _SharedUser(attention.Attention):
  """Test mechanism: softmax attention plus a model-level shared vector."""

  @nn.nowrap
  def shared_module(self, *, features, max_len, name):
    # Called on a layer built like the model's: its fields are theirs.
    assert self.causal is False and self.num_heads == 4
    return _CountingTables(features=features, name=name)

  @nn.compact
  def attend(self, x, *, padding_mask, deterministic, shared=None):
    if shared is None:
      raise ValueError('shared is required')
    y = attention.SoftmaxAttention(num_heads=self.num_heads,
                                   qkv_features=self.qkv_features,
                                   name='inner')(
                                       x, padding_mask=padding_mask,
                                       deterministic=deterministic)
    return y + shared


def test_shared_module_is_created_once_and_reaches_every_layer(monkeypatch):
  monkeypatch.setitem(attention.REGISTRY, 'shared_user', _SharedUser)
  cfg = small_model_config(attention='shared_user', num_layers=3)
  model = models.create_model(cfg, vocab_size=20, num_classes=2, max_len=6,
                              dual=False)
  batch = {'inputs': np.ones((2, 6), np.int32)}
  variables = model.init(jax.random.PRNGKey(0), batch, deterministic=True)
  enc = variables['params']['encoder']
  assert enc['attention_shared']['table'].shape == (16,)
  for i in range(3):
    assert 'attention_shared' not in enc[f'block_{i}']['attention']

  def loss(table):
    p = jax.tree.map(lambda a: a, variables['params'])
    p['encoder']['attention_shared']['table'] = table
    return jnp.sum(model.apply({'params': p}, batch, deterministic=True))
  grad = jax.grad(loss)(enc['attention_shared']['table'])
  assert float(jnp.abs(grad).sum()) > 0
