"""The one route from a mechanism's settings to its layers and its
model-level shared module (`lra_msmra.attention.Mechanism`), and the Q/K/V
projections the mechanisms start from (`base.Attention.project_qkv`)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import attention
from lra_msmra.attention import base
from lra_msmra.attention import cst
from tests.attention import harness

FIELDS = {'num_heads': 2, 'qkv_features': 8, 'dropout_rate': 0.1,
          'use_bias': True}
CASES = [(name, kw) for name, cases in sorted(harness.CONTRACT_CASES.items())
         for _, kw in cases]


@pytest.mark.parametrize('name,kw', CASES)
def test_every_layer_takes_the_knobs_and_the_shared_fields(name, kw):
  mechanism = attention.Mechanism(name, kw, FIELDS)
  assert mechanism.layer_class is attention.REGISTRY[name]
  mechanism.check()
  layer = mechanism.layer(parent=None)
  for key, value in {**FIELDS, **kw}.items():
    assert getattr(layer, key) == value
  # Fields given to `layer` (the encoder's initialisers, a name) win.
  assert mechanism.layer(parent=None, num_heads=4).num_heads == 4


def test_settings_are_checked_once_for_layers_and_shared_module():
  bad = attention.Mechanism('cst', {'slice_length': 3, 'alpha': 2})
  for build in (bad.check, bad.layer,
                lambda: bad.shared_module(features=8, max_len=16)):
    with pytest.raises(ValueError, match='even slice_length'):
      build()
  with pytest.raises(TypeError, match='slice_len'):
    attention.Mechanism('cst', {'slice_len': 4}).check()
  with pytest.raises(NotImplementedError, match='causal'):
    attention.Mechanism('linformer', {'share_layers': True},
                        {'causal': True}).shared_module(features=8,
                                                        max_len=16)
  with pytest.raises(ValueError, match='softmax'):
    attention.Mechanism('no_such_attention')


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('alpha', [1, 2, 3])
def test_cst_tables_are_sized_by_the_layers_own_fields(causal, alpha):
  mechanism = attention.Mechanism('cst', {'slice_length': 4, 'alpha': alpha},
                                  {'causal': causal})
  tables = mechanism.shared_module(features=8, max_len=30)
  assert (tables.local_len, tables.global_len, tables.features) == (
      cst.local_table_rows(4, alpha, causal), 8, 8)


class _TwoLayers(nn.Module):
  """The encoder's wiring: the shared module once, then the layers."""
  mechanism: attention.Mechanism

  @nn.compact
  def __call__(self, x):
    shared = self.mechanism.shared_inputs(features=x.shape[-1],
                                          max_len=x.shape[1])
    for i in range(2):
      x = x + self.mechanism.layer(name=f'layer_{i}')(x, **shared)
    return x


@pytest.mark.parametrize('name,kw,tables', [
    ('cst', {'slice_length': 4}, {'local', 'global'}),
    ('cst', {'slice_length': 4, 'position_embedding': 'none'}, None),
    ('linformer', {'low_rank_features': 3, 'share_layers': True},
     {'low_rank_kernel'}),
    ('linformer', {'low_rank_features': 3}, None),
    ('softmax', {}, None),
])
def test_shared_module_belongs_to_the_model(name, kw, tables):
  model = _TwoLayers(attention.Mechanism(name, kw, {'num_heads': 2}))
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          jnp.ones((1, 12, 8)))['params']
  layers = {'layer_0', 'layer_1'}
  if tables is None:
    assert set(params) == layers
  else:
    assert set(params) == layers | {'attention_shared'}
    assert set(params['attention_shared']) == tables


class _Projected(base.Attention):

  @nn.compact
  def project(self, x, roles, scale_query):
    return self.project_qkv(x, roles, scale_query=scale_query)


@pytest.mark.parametrize('scale_query', [False, True])
def test_project_qkv_is_one_projection_per_role(scale_query):
  layer = _Projected(num_heads=2, qkv_features=8, use_bias=True,
                     bias_init=nn.initializers.normal(1.0))
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 6))
  roles = ('query', 'value')
  variables = layer.init(jax.random.PRNGKey(1), x, roles, scale_query,
                         method=_Projected.project)
  assert set(variables['params']) == set(roles)
  got = layer.apply(variables, x, roles, scale_query,
                    method=_Projected.project)
  for i, (role, a) in enumerate(zip(roles, got)):
    p = variables['params'][role]
    want = np.einsum('bnf,fhd->bnhd', x, p['kernel']) + p['bias']
    if scale_query and i == 0:
      want = want / np.sqrt(4)
    assert a.shape == (2, 5, 2, 4)
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6)
  # The input is cast to the layer's dtype first.
  half = _Projected(num_heads=2, qkv_features=8, dtype=jnp.bfloat16)
  q, = half.apply(variables, x, ('query',), False, method=_Projected.project)
  assert q.dtype == jnp.bfloat16
