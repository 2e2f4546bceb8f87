"""Running one attention layer on its own, as the encoder would.

`AttentionHarness` (`lra_msmra.attention.standalone.StandaloneAttention`)
builds a registered mechanism with the contract's fields, creates its
model-level shared module (if it has one) exactly as the encoder does, and
calls the layer. Tests use it to reach any mechanism by name.
"""

from __future__ import annotations

from typing import Any

from lra_msmra import attention
from lra_msmra.attention import standalone

# Registry entry -> list of (id, knobs) that the contract tests exercise.
# A new mechanism adds its line here.
CONTRACT_CASES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    'softmax': [('default', {})],
    'local': [('b4', {'block_size': 4}),
              ('b5_strided', {'block_size': 5, 'grouping': 'strided'})],
    'sparse': [('l4_c1', {'block_size': 4, 'summary_size': 1}),
               ('l3_c1_symmetric_cls', {'block_size': 3, 'summary_size': 1,
                                        'pattern_causal': False,
                                        'num_prefix_tokens': 1})],
    'longformer': [('w4', {'window_size': 4}),
                   ('w5_g2', {'window_size': 5, 'num_global_tokens': 2})],
    'bigbird': [('b2_r1', {'block_size': 2, 'num_random_blocks': 1}),
                ('b3_r2_nolimit', {'block_size': 3, 'num_random_blocks': 2,
                                   'random_limit': None})],
    'linformer': [('k4', {'low_rank_features': 4}),
                  ('k3_shared_layers', {'low_rank_features': 3,
                                        'share_layers': True})],
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
    'linear': [('default', {})],
    'performer': [('softmax', {'kernel': 'softmax', 'num_features': 16}),
                  ('relu', {'kernel': 'relu'})],
    # Two cases cover the three parts with and without the dot product.
    'synthesizer': [('random', {}),
                    ('dense_factorized_only', {
                        'synthesizer_mode': 'dense+factorized_random',
                        'factorized_k': 4, 'ignore_dot_product': True})],
    'reformer': [('b4', {'num_buckets': 4}),
                 ('b2_h2_chunk3_norm_self', {'num_buckets': 2, 'num_hashes': 2,
                                             'chunk_length': 3,
                                             'normalize_keys': True,
                                             'mask_self': True})],
    'sinkhorn': [('b4', {'block_size': 4}),
                 ('b3_sinkhorn', {'block_size': 3,
                                  'sort_activation': 'sinkhorn',
                                  'sinkhorn_iterations': 3})],
}


# The encoder's way of building one layer, shared with the benchmarks.
AttentionHarness = standalone.StandaloneAttention


def all_cases():
  """pytest params: (mechanism, case id, knobs) for every registered entry."""
  missing = sorted(set(attention.REGISTRY) - set(CONTRACT_CASES))
  if missing:
    raise AssertionError(f'Registered mechanisms without contract cases: '
                         f'{missing}; add them to CONTRACT_CASES.')
  return [(name, cid, kw) for name in sorted(CONTRACT_CASES)
          for cid, kw in CONTRACT_CASES[name]]
