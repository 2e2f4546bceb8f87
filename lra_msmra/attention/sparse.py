"""Sparse Transformer attention, fixed pattern (registry `sparse`).

Paper: Child et al., arXiv:1904.10509, §4.3. Official LRA code: google-
research/long-range-arena, `lra_benchmarks/models/sparse_transformer/`.

Each query sees its own block of l positions and the summary positions of every
block (one softmax over the union); causal in the encoder too, as the official
code (`pattern_causal`), with the prefix (CLS) rows and columns open.

docs/mechanisms/sparse.md: the computation, every departure from the official
code and why, padding, the causal form, the tested invariants and the LRA
settings.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra.attention import base
from lra_msmra.attention import block_sparse

Array = jax.Array

# The values LRA passes for every task (utils/train_utils.py).
DEFAULT_BLOCK_SIZE = 50
DEFAULT_SUMMARY_SIZE = 10


def summary_offsets(block_size: int, summary_size: int) -> np.ndarray:
  """Offsets inside a block that are summary positions: 0 and l - c .. l-1."""
  offsets = np.arange(block_size)
  return offsets[(offsets == 0) | (offsets >= block_size - summary_size)]


class SparseAttention(base.Attention):
  """Sparse Transformer fixed attention (see the module docstring).

  Attributes:
    block_size: l, the block length of A(1) and A(2).
    summary_size: c, summary positions at the end of every block (the
      block's first position is always one too).
    pattern_causal: keep only keys j <= i even when `causal=False` (the
      official LRA encoder does); False gives the symmetric pattern.
    num_prefix_tokens: p leading tokens (e.g. CLS) outside the pattern:
      they see every key and every query sees them.
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('l4_c1', {'block_size': 4, 'summary_size': 1}),
      ('l3_c1_symmetric_cls', {
          'block_size': 3, 'summary_size': 1, 'pattern_causal': False,
          'num_prefix_tokens': 1}),
  )

  block_size: int = DEFAULT_BLOCK_SIZE
  summary_size: int = DEFAULT_SUMMARY_SIZE
  pattern_causal: bool = True
  num_prefix_tokens: int = 0

  def check_knobs(self) -> None:
    if self.block_size < 1:
      raise ValueError(f'block_size={self.block_size} must be >= 1.')
    if not 0 <= self.summary_size <= self.block_size:
      raise ValueError(f'summary_size={self.summary_size} must be in '
                       f'[0, block_size={self.block_size}].')
    if self.num_prefix_tokens < 0:
      raise ValueError(
          f'num_prefix_tokens={self.num_prefix_tokens} must be >= 0.')

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies fixed-pattern attention; see `base.Attention.attend`."""
    out_features = self.head_dims(x).out_features
    batch, length = x.shape[:2]
    l = self.block_size
    prefix = min(self.num_prefix_tokens, length)
    rest = -(-(length - prefix) // l) * l
    n = prefix + rest
    groups = rest // l
    x, mask = base.pad_to_length(x, padding_mask, n)
    q, k, v = map(block_sparse.heads_major,
                  self.project_qkv(x, scale_query=True))
    directional = self.causal or self.pattern_causal
    dropout = lambda: block_sparse.dropout_args(self, deterministic)

    outputs = []
    if prefix:
      # Prefix queries see every key (earlier ones only when causal).
      valid = mask[:, None, None, None, :]
      if self.causal:
        valid = valid & base.causal_mask(prefix, n)[None, None, None]
      out, _ = block_sparse.attend(
          q[:, :, None, :prefix], [block_sparse.Part(k, v, valid)], **dropout())
      outputs.append(out[:, :, 0])
    if groups:
      key_mask = mask[:, prefix:].reshape(batch, groups, l)
      # A(1): the own block.
      own_valid = key_mask[:, None, :, None, :]
      if directional:
        own_valid = own_valid & base.causal_mask(l)[None, None, None]
      parts = [block_sparse.Part(
          block_sparse.to_blocks(k[:, :, prefix:], l),
          block_sparse.to_blocks(v[:, :, prefix:], l), own_valid)]
      # A(2): summary keys of the other blocks (own block's are in A(1)).
      offsets = summary_offsets(l, self.summary_size)
      summary = (np.arange(groups)[:, None] * l + offsets[None, :]).reshape(-1)
      key_block = summary // l
      query_block = np.arange(groups)
      pattern = (key_block[None, :] < query_block[:, None] if directional
                 else key_block[None, :] != query_block[:, None])
      positions = prefix + summary
      parts.append(block_sparse.Part(
          k[:, :, positions], v[:, :, positions],
          jnp.asarray(pattern)[None, None, :, None, :]
          & mask[:, positions][:, None, None, None, :]))
      if prefix:
        parts.append(block_sparse.Part(
            k[:, :, :prefix], v[:, :, :prefix],
            mask[:, :prefix][:, None, None, None, :]))
      out, _ = block_sparse.attend(
          block_sparse.to_blocks(q[:, :, prefix:], l), parts, **dropout())
      outputs.append(block_sparse.from_blocks(out))

    out = jnp.concatenate(outputs, axis=2) if len(outputs) > 1 else outputs[0]
    out = block_sparse.positions_major(out)[:, :length]
    return self.output_projection(out_features)(out)
