"""Linformer: low-rank projection of keys and values (registry `linformer`).

Paper: Wang et al., arXiv:2006.04768, §4. Official LRA code: google-
research/long-range-arena, `lra_benchmarks/models/linformer/`.

Keys and values are projected along the sequence to `low_rank_features` rows by
one matrix E shared by keys, values and heads (and layers with `share_layers`);
padded positions are left out of the projection.

docs/mechanisms/linformer.md: the computation, every departure from the
official code and why, padding, the causal form (refused: `causal=True`
raises), the tested invariants and the LRA settings.
"""

from __future__ import annotations

from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base

Array = jax.Array

# The official module's default rank, which every LRA run used.
DEFAULT_LOW_RANK_FEATURES = 16


class _SharedProjection(nn.Module):
  """E shared by every layer (`share_layers=True`): `[max_len, k]`."""
  max_len: int
  low_rank_features: int
  kernel_init: Callable[..., Array] = nn.initializers.xavier_uniform()

  @nn.compact
  def __call__(self) -> Array:
    return self.param('low_rank_kernel', self.kernel_init,
                      (self.max_len, self.low_rank_features), jnp.float32)


class LinformerAttention(base.Attention):
  """Linformer attention (see the module docstring).

  Attributes:
    low_rank_features: k, projected rows of keys and values.
    max_len: rows of E (the longest input); None = the length of the input
      the layer is initialised with.
    share_layers: one E for all layers (a model-level parameter) instead of
      one per layer.
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('k4', {'low_rank_features': 4}),
      ('k3_shared_layers', {'low_rank_features': 3, 'share_layers': True}),
  )

  low_rank_features: int = DEFAULT_LOW_RANK_FEATURES
  max_len: Optional[int] = None
  share_layers: bool = False

  @nn.nowrap
  def shared_module(self, *, features: int, max_len: int,
                    name: str) -> Optional[nn.Module]:
    """The model-level E (`share_layers=True`), or None."""
    del features
    if not self.share_layers:
      return None
    return _SharedProjection(max_len=self.max_len or max_len,
                             low_rank_features=self.low_rank_features,
                             name=name)

  def check_knobs(self) -> None:
    if self.low_rank_features < 1:
      raise ValueError(
          f'low_rank_features={self.low_rank_features} must be >= 1.')
    if self.max_len is not None and self.max_len < 1:
      raise ValueError(f'max_len={self.max_len} must be >= 1 or None.')
    if self.causal:
      raise NotImplementedError(
          'linformer has no causal form: its projection mixes every '
          'position into every projected key (the official code ignores '
          'causal masks). Use a mechanism with a causal form.')

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array, deterministic: bool,
             shared: Optional[Array] = None) -> Array:
    """Applies Linformer attention; see `base.Attention.attend`.

    `shared`: E `[max_len, k]` from the model-level module
    (`share_layers=True` only).
    """
    out_features = self.head_dims(x).out_features
    length = x.shape[1]

    if self.share_layers:
      if shared is None:
        raise ValueError('share_layers=True needs the model-level E '
                         '(`shared`): build the layer through '
                         'lra_msmra.attention.Mechanism, whose shared_inputs '
                         'creates it, as the encoder does.')
      kernel = shared
    else:
      if shared is not None:
        raise ValueError('`shared` is only used with share_layers=True.')
      rows = self.max_len or length
      if self.has_variable('params', 'low_rank_kernel'):
        rows = self.get_variable('params', 'low_rank_kernel').shape[0]
      kernel = self.param('low_rank_kernel', self.kernel_init,
                          (rows, self.low_rank_features), jnp.float32)
    if length > kernel.shape[0]:
      raise ValueError(
          f'Input length {length} exceeds the {kernel.shape[0]} rows of '
          "linformer's projection E (max_len); build the model for the "
          'longest input.')

    q, k, v = self.project_qkv(x, scale_query=True)
    # E restricted to the real positions of each example: [batch, N, k].
    # The sums over the whole sequence run in float32.
    e = jnp.where(padding_mask[..., None], kernel[:length], 0.0)
    f32 = lambda a: a.astype(jnp.float32)
    k_bar = jnp.einsum('bnr,bnhd->brhd', e, f32(k)).astype(self.dtype)
    v_bar = jnp.einsum('bnr,bnhd->brhd', e, f32(v)).astype(self.dtype)
    logits = jnp.einsum('bqhd,brhd->bhqr', q, k_bar,
                        preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = self.attention_dropout(probs, deterministic).astype(self.dtype)
    out = jnp.einsum('bhqr,brhd->bqhd', probs, v_bar)
    return self.output_projection(out_features)(out)
