"""Running one attention layer on its own, as the encoder would.

`AttentionHarness` builds a registered mechanism with the contract's fields,
creates its model-level shared module (if it has one) exactly as the encoder
does, and calls the layer. Tests use it to reach any mechanism by name.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
from flax.core import FrozenDict
import jax
import jax.numpy as jnp

from lra_msmra import attention

# Registry entry -> list of (id, knobs) that the contract tests exercise.
# A new mechanism adds its line here.
CONTRACT_CASES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    'softmax': [('default', {})],
    'adamra': [('default', {}),
               ('single_unmasked_st', {'projections': 'single',
                                       'segment_means': 'unmasked',
                                       'router_gate': 'straight_through',
                                       'compression_rates': (1, 1 / 4)})],
    'long_short': [('default', {}),
                   ('w3_r2', {'window_size': 3, 'num_landmarks': 2}),
                   ('conv', {'conv_kernel_size': 3})],
    'cst': [('l4', {'slice_length': 4}),
            ('l4_alpha2_max_untied_global_first',
             {'slice_length': 4, 'alpha': 2, 'aggregation': 'max',
              'share_local_global': False, 'composition': 'global_first'})],
    'combiner': [
        ('fixed', {'variant': 'fixed'}),
        ('logsparse', {'variant': 'logsparse'}),
        ('axial-vertical', {'variant': 'axial', 'axial_plan': 'vertical'}),
        ('axial-horizontal', {'variant': 'axial',
                              'axial_plan': 'horizontal'}),
        ('axial-rowmajor', {'variant': 'axial', 'axial_plan': 'rowmajor'}),
        ('mixture-average', {'variant': 'mixture',
                             'mixture_mode': 'average'}),
        ('mixture-joint', {'variant': 'mixture',
                           'mixture_mode': 'joint_softmax'}),
    ],
}


class AttentionHarness(nn.Module):
  """One attention layer plus its shared module, called like the encoder."""
  mechanism: str
  kw: Mapping[str, Any] = FrozenDict()
  num_heads: int = 4
  qkv_features: int = 32
  out_features: int | None = None
  dropout_rate: float = 0.0
  causal: bool = False
  dtype: Any = jnp.float32
  max_len: int = 64

  @nn.compact
  def __call__(self, x, *, padding_mask=None, deterministic=True):
    cls = attention.get_attention(self.mechanism)
    shared_module = cls.shared_module(dict(self.kw), features=x.shape[-1],
                                      max_len=self.max_len,
                                      name='attention_shared')
    call_kw = {} if shared_module is None else {'shared': shared_module()}
    layer = cls(num_heads=self.num_heads, qkv_features=self.qkv_features,
                out_features=self.out_features,
                dropout_rate=self.dropout_rate, causal=self.causal,
                dtype=self.dtype, name='attention', **dict(self.kw))
    return layer(x, padding_mask=padding_mask, deterministic=deterministic,
                 **call_kw)


def all_cases():
  """pytest params: (mechanism, case id, knobs) for every registered entry."""
  missing = sorted(set(attention.REGISTRY) - set(CONTRACT_CASES))
  if missing:
    raise AssertionError(f'Registered mechanisms without contract cases: '
                         f'{missing}; add them to CONTRACT_CASES.')
  return [(name, cid, kw) for name in sorted(CONTRACT_CASES)
          for cid, kw in CONTRACT_CASES[name]]


def init_and_apply(harness: AttentionHarness, x, padding_mask, seed=0):
  variables = harness.init(jax.random.PRNGKey(seed), x,
                           padding_mask=padding_mask)
  return variables, harness.apply(variables, x, padding_mask=padding_mask)
