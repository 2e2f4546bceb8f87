"""Local attention: softmax attention inside fixed blocks (registry `local`).

The LRA paper's simple local baseline. Block-local attention is the "local
attention" of Liu et al., "Generating Wikipedia by Summarizing Long
Sequences", ICLR 2018 (arXiv:1801.10198): the sequence is cut into blocks of
`block_size` tokens and every token attends, with one softmax, to the tokens
of its own block only. Official LRA code: google-research/long-range-arena,
`lra_benchmarks/models/local/` (`local_attention.py`, class
`LocalAttention`); block size 50 on ListOps, Text and Retrieval (the
encoder's default) and 64 on the image tasks (their `local_base.py`).

Cost: O(N B d) time and O(N B) score memory per head for blocks of B.

Causal form: keys of the own block up to the query (the official module's
`causal_mask`, which LRA never turns on).

`grouping` picks which tokens share a softmax:

* `'contiguous'` (default): blocks of consecutive positions [g B, (g+1) B),
  as the name, the paper and the official code's own padding mask intend.
* `'strided'`: the groups the official code actually forms. It reshapes
  `[batch, N', ...]` to `[batch, B, N'/B, ...]` and attends over the axis
  of size B, so position p joins the group p mod G (G = N'/B), whose B
  members are G positions apart. N' = (N // B + 1) B, as the official code
  always pads by B - N mod B (a whole block when B divides N), so G follows
  from N exactly as there.

Departures from the official code:

* Padding. The official code builds its padding mask from contiguous blocks
  while the attention runs over the strided groups, so it masks the wrong
  keys (real keys masked, padded keys attended), and pads its mask with
  -1e9, which counts as a real token. We mask the padded keys of each group
  exactly, in both groupings; this bug is not reproduced.
* Padded queries output exactly zero (project convention); rows without a
  real key give zeros, never NaN (`base.safe_softmax` numerics).
* `'contiguous'` pads N to a multiple of B only (with masked positions),
  then crops; the official always adds B - N mod B positions.
* Attention dropout is element-wise, as the official LRA block passes
  `broadcast_dropout=False`.
"""

from __future__ import annotations

from typing import Optional

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
  block_size: int = DEFAULT_BLOCK_SIZE
  grouping: str = 'contiguous'

  def _check_knobs(self) -> None:
    if self.block_size < 1:
      raise ValueError(f'block_size={self.block_size} must be >= 1.')
    if self.grouping not in GROUPINGS:
      raise ValueError(f'grouping={self.grouping!r}; valid: {GROUPINGS}.')

  @nn.compact
  def __call__(self, x: Array, *, padding_mask: Optional[Array] = None,
               deterministic: bool = True) -> Array:
    """Applies the attention.

    Args:
      x: `[batch, length, features]`.
      padding_mask: `[batch, length]` bool, True = real token; None = all
        real.
      deterministic: disables attention dropout.

    Returns:
      `[batch, length, out_features]`, zero at padded positions.
    """
    self._check_knobs()
    padding_mask = base.default_padding_mask(x, padding_mask)
    _, head_dim, out_features = self.head_dims(x)
    batch, length = x.shape[:2]
    block = self.block_size
    n = padded_length(length, block, self.grouping)
    x = jnp.pad(x, [(0, 0), (0, n - length), (0, 0)]).astype(self.dtype)
    mask = jnp.pad(padding_mask, [(0, 0), (0, n - length)])

    q = self.projection(head_dim, 'query')(x)
    k = self.projection(head_dim, 'key')(x)
    v = self.projection(head_dim, 'value')(x)
    q = q / jnp.sqrt(head_dim).astype(self.dtype)

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
    y = self.output_projection(out_features)(out)
    # Padded query rows are exactly zero after the projection's bias too.
    return jnp.where(padding_mask[..., None], y, 0).astype(y.dtype)
