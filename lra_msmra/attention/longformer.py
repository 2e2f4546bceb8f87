"""Longformer attention: sliding window plus global tokens (`longformer`).

Paper: Beltagy et al., arXiv:2004.05150, §3.1. Official LRA code: google-
research/long-range-arena, `lra_benchmarks/models/longformer/`.

A window of `window_size` keys around each query, computed in blocks, plus
`num_global_tokens` leading positions with global attention (none in LRA) and
their own projections.

docs/mechanisms/longformer.md: the computation, every departure from the
official code and why, padding, the causal form, the tested invariants and the
LRA settings.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra.attention import base
from lra_msmra.attention import block_sparse

Array = jax.Array

# The official LRA encoder's default window.
DEFAULT_WINDOW_SIZE = 512
# Queries per block of the window computation (at most).
QUERY_BLOCK = 128


def window_sides(window_size: int) -> tuple[int, int]:
  """(left, right): query i sees [i - left + 1, i + right]."""
  right = window_size // 2
  return window_size - right, right


class LongformerAttention(base.Attention):
  """Sliding window plus global attention (see the module docstring).

  Attributes:
    window_size: w, keys per sliding window (the query included).
    num_global_tokens: g, leading positions with global attention.
    global_projections: separate Q/K/V projections for global queries (only
      used when g > 0).
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('w4', {'window_size': 4}),
      ('w5_g2', {'window_size': 5, 'num_global_tokens': 2}),
  )

  window_size: int = DEFAULT_WINDOW_SIZE
  num_global_tokens: int = 0
  global_projections: bool = True

  def check_knobs(self) -> None:
    if self.window_size < 1:
      raise ValueError(f'window_size={self.window_size} must be >= 1.')
    if self.num_global_tokens < 0:
      raise ValueError(
          f'num_global_tokens={self.num_global_tokens} must be >= 0.')

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies Longformer attention; see `base.Attention.attend`."""
    length = x.shape[1]
    out_features = self.head_dims(x).out_features
    left, right = window_sides(self.window_size)
    if self.causal:
      right = 0
    g = min(self.num_global_tokens, length)
    block = min(self.window_size, QUERY_BLOCK, length)
    n = -(-length // block) * block
    groups = n // block
    # Keys beyond the sequence are never visible: a window wider than the
    # sequence needs no wider tile (same function, smaller tiles).
    left, right = min(left, n), min(right, n - 1)
    x, mask = base.pad_to_length(x, padding_mask, n)
    dropout = lambda: block_sparse.dropout_args(self, deterministic)

    def project(inputs, *roles, scale_query=False):
      return map(block_sparse.heads_major,
                 self.project_qkv(inputs, roles, scale_query=scale_query))
    q, k, v = project(x, 'query', 'key', 'value', scale_query=True)

    # Window keys of block b: positions [b B - (left - 1), (b + 1) B + right).
    index = block_sparse.window_index(groups, block, left - 1, right, n)
    k_pad, mask_pad = block_sparse.append_empty(k, mask)
    v_pad, _ = block_sparse.append_empty(v, mask)
    slots = index.shape[1]
    offset = (np.arange(slots)[None, :] - (left - 1)
              - np.arange(block)[:, None])  # key - query, [B, S]
    band = (offset >= -(left - 1)) & (offset <= right)
    # Global keys are in their own part; drop them from the windows.
    not_global = index >= g  # [G, S]; the empty slot (index n) is >= g too.
    pattern = band[None, :, :] & not_global[:, None, :]  # [G, B, S]
    parts = [block_sparse.Part(
        block_sparse.gather_tiles(k_pad, index),
        block_sparse.gather_tiles(v_pad, index),
        jnp.asarray(pattern)[None, None]
        & block_sparse.gather_valid(mask_pad, index))]
    if g:
      visible = mask[:, None, None, None, :g]
      if self.causal:
        rows = np.arange(n).reshape(groups, block)
        visible = visible & jnp.asarray(
            np.arange(g)[None, None, :] <= rows[:, :, None])[None, None]
      parts.append(block_sparse.Part(k[:, :, :g], v[:, :, :g], visible))
    out, _ = block_sparse.attend(block_sparse.to_blocks(q, block), parts,
                                 **dropout())
    out = block_sparse.from_blocks(out)

    if g:
      if self.global_projections:
        q_g, = project(x[:, :g], 'query_global', scale_query=True)
        k_g, v_g = project(x, 'key_global', 'value_global')
      else:
        q_g, k_g, v_g = q[:, :, :g], k, v
      visible = mask[:, None, None, None, :]
      if self.causal:
        visible = visible & base.causal_mask(g, n)[None, None, None]
      out_g, _ = block_sparse.attend(
          q_g[:, :, None], [block_sparse.Part(k_g, v_g, visible)], **dropout())
      out = jnp.concatenate([out_g[:, :, 0], out[:, :, g:]], axis=2)

    out = block_sparse.positions_major(out)[:, :length]
    return self.output_projection(out_features)(out)
