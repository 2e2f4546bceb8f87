"""Local attention: softmax inside fixed blocks (registry `local`).

Block-local attention as in Liu et al., ICLR 2018, arXiv:1801.10198, the LRA
paper's local baseline. Official LRA code: google-research/long-range- arena,
`lra_benchmarks/models/local/`.

Every token attends, with one softmax, to the real tokens of its own group of
`block_size`: contiguous blocks (default) or the official code's strided groups
(`grouping='strided'`).

docs/mechanisms/local.md: the computation, every departure from the official
code and why, padding, the causal form, the tested invariants and the LRA
settings.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base
from lra_msmra.attention import block_sparse

Array = jax.Array

GROUPINGS = ('contiguous', 'strided')
# The official LRA encoder's default block size (ListOps, Text, Retrieval).
DEFAULT_BLOCK_SIZE = 50


def padded_length(length: int, block_size: int, grouping: str) -> int:
  """The internal length: a multiple of B (strided: the official N')."""
  if grouping == 'strided':
    return (length // block_size + 1) * block_size
  return -(-length // block_size) * block_size


class LocalAttention(base.Attention):
  """Block-local softmax attention (see the module docstring).

  Attributes:
    block_size: B, the tokens that share one softmax.
    grouping: `'contiguous'` (blocks of consecutive tokens) or `'strided'`
      (the official code's groups of tokens G apart).
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('b4', {'block_size': 4}),
      ('b5_strided', {'block_size': 5, 'grouping': 'strided'}),
  )

  block_size: int = DEFAULT_BLOCK_SIZE
  grouping: str = 'contiguous'

  def check_knobs(self) -> None:
    if self.block_size < 1:
      raise ValueError(f'block_size={self.block_size} must be >= 1.')
    if self.grouping not in GROUPINGS:
      raise ValueError(f'grouping={self.grouping!r}; valid: {GROUPINGS}.')

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies block-local attention; see `base.Attention.attend`."""
    _, head_dim, out_features = self.head_dims(x)
    batch, length = x.shape[:2]
    block = self.block_size
    n = padded_length(length, block, self.grouping)
    x, mask = base.pad_to_length(x, padding_mask, n)
    q, k, v = self.project_qkv(x, scale_query=True)

    strided = self.grouping == 'strided'

    def groups(a):
      """`[batch, n, heads, d] -> [batch, heads, G, B, d]`."""
      a = block_sparse.heads_major(a)
      if strided:
        # Position m * G + g is member m of group g.
        a = a.reshape(batch, a.shape[1], block, n // block, a.shape[-1])
        return jnp.swapaxes(a, 2, 3)
      return block_sparse.to_blocks(a, block)

    m = mask.reshape((batch, block, n // block) if strided
                     else (batch, n // block, block))
    if strided:
      m = jnp.swapaxes(m, 1, 2)
    valid = m[:, None, :, None, :]  # [batch, 1, G, 1, B]
    if self.causal:
      # Members are in position order in both groupings.
      valid = valid & base.causal_mask(block)[None, None, None]
    dropout = lambda: block_sparse.dropout_args(self, deterministic)
    part = block_sparse.Part(groups(k), groups(v), valid)
    out, _ = block_sparse.attend(groups(q), [part], **dropout())

    if strided:
      out = jnp.swapaxes(out, 2, 3)
    out = out.reshape(batch, self.num_heads, n, head_dim)
    out = block_sparse.positions_major(out)[:, :length]
    return self.output_projection(out_features)(out)
