"""BigBird attention: window, global and random blocks (registry `bigbird`).

Paper: Zaheer et al., NeurIPS 2020, arXiv:2007.14062. Official LRA code:
google-research/long-range-arena, `lra_benchmarks/models/bigbird/`.

Blocked ITC form: the first and last blocks are global, every other block
attends to its three window blocks, the global blocks and `num_random_blocks`
random blocks fixed per layer and head from a process-stable seed.

docs/mechanisms/bigbird.md: the computation, every departure from the official
code and why, padding, the causal form (refused: `causal=True` raises), the
tested invariants and the LRA settings.
"""

from __future__ import annotations

import zlib
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra.attention import base
from lra_msmra.attention import block_sparse

Array = jax.Array

# The official LRA values (`models/bigbird/bigbird.py`, `bigbird_attention`).
DEFAULT_BLOCK_SIZE = 64
DEFAULT_NUM_RANDOM_BLOCKS = 3
# `last_idx` of the official code: random blocks within the first 1024.
DEFAULT_RANDOM_LIMIT = 1024


def layer_seed(path: tuple[str, ...], seed: int) -> int:
  """The numpy seed of a layer: CRC32 of its module path and `seed`."""
  return zlib.crc32(('/'.join(path) + f'#{seed}').encode())


def random_blocks(num_blocks: int, block_size: int, num_random: int,
                  num_heads: int, random_limit: Optional[int],
                  seed: int) -> np.ndarray:
  """The random key blocks of every non-global query block, per head.

  Args:
    num_blocks: nb, blocks of the padded sequence.
    block_size: b.
    num_random: r.
    num_heads: heads (one independent draw each).
    random_limit: draw only among blocks within the first `random_limit`
      positions (when that span is longer than 2 b); None = all.
    seed: numpy seed.

  Returns:
    int `[heads, nb - 2, r]`: block ids for query blocks 1 .. nb - 2, -1 for
    an unused slot.
  """
  rng = np.random.RandomState(seed)
  usable = num_blocks
  if random_limit is not None:
    span = min(num_blocks * block_size, random_limit)
    if span > 2 * block_size:
      usable = span // block_size
  out = np.full((num_heads, max(num_blocks - 2, 0), num_random), -1,
                np.int64)
  for h in range(num_heads):
    for i in range(1, num_blocks - 1):
      candidates = np.array([c for c in range(1, min(usable, num_blocks - 1))
                             if abs(c - i) > 1], np.int64)
      pick = rng.permutation(candidates)[:num_random]
      out[h, i - 1, :len(pick)] = pick
  return out


class BigBirdAttention(base.Attention):
  """BigBird ITC block-sparse attention (see the module docstring).

  Attributes:
    block_size: b, tokens per block.
    num_random_blocks: r, random key blocks per query block and head.
    random_limit: random blocks only among the blocks within the first
      `random_limit` positions (the official 1024); None = anywhere.
    seed: combined with the layer's module path to draw the random blocks.
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('b2_r1', {'block_size': 2, 'num_random_blocks': 1}),
      ('b3_r2_nolimit', {
          'block_size': 3, 'num_random_blocks': 2, 'random_limit': None}),
  )

  block_size: int = DEFAULT_BLOCK_SIZE
  num_random_blocks: int = DEFAULT_NUM_RANDOM_BLOCKS
  random_limit: Optional[int] = DEFAULT_RANDOM_LIMIT
  seed: int = 0

  def check_knobs(self) -> None:
    if self.block_size < 1:
      raise ValueError(f'block_size={self.block_size} must be >= 1.')
    if self.num_random_blocks < 0:
      raise ValueError(
          f'num_random_blocks={self.num_random_blocks} must be >= 0.')
    if self.random_limit is not None and self.random_limit < 1:
      raise ValueError(f'random_limit={self.random_limit} must be >= 1 or '
                       'None (no limit).')
    if self.causal:
      raise NotImplementedError(
          'bigbird has no causal form: the official code falls back to '
          'dense causal attention for causal masks. Use the softmax '
          'mechanism with causal=True for that.')

  def pattern_seed(self) -> int:
    """The numpy seed of this layer's random blocks."""
    return layer_seed(tuple(self.scope.path), self.seed)

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies BigBird attention; see `base.Attention.attend`."""
    out_features = self.head_dims(x).out_features
    length = x.shape[1]
    b = self.block_size
    n = -(-length // b) * b
    nb = n // b
    x, mask = base.pad_to_length(x, padding_mask, n)
    q, k, v = map(block_sparse.heads_major,
                  self.project_qkv(x, scale_query=True))
    dropout = lambda: block_sparse.dropout_args(self, deterministic)

    # Global query blocks (first and last; all blocks when nb <= 3, where
    # the window and the global blocks cover every key anyway).
    global_rows = np.arange(n) if nb <= 3 else np.concatenate(
        [np.arange(b), np.arange(n - b, n)])
    everything = [block_sparse.Part(k, v, mask[:, None, None, None, :])]
    out_global, _ = block_sparse.attend(q[:, :, None, global_rows],
                                        everything, **dropout())
    out_global = out_global[:, :, 0]
    if nb <= 3:
      out = out_global
    else:
      groups = nb - 2
      k_pad, mask_pad = block_sparse.append_empty(k, mask)
      v_pad, _ = block_sparse.append_empty(v, mask)
      # Window blocks i - 1, i, i + 1 of middle block i = g + 1.
      window = (np.arange(groups)[:, None] * b
                + np.arange(3 * b)[None, :]).astype(np.int32)
      not_global = (window >= b) & (window < n - b)  # counted in `ends`.
      parts = [block_sparse.Part(
          block_sparse.gather_tiles(k, window),
          block_sparse.gather_tiles(v, window),
          jnp.asarray(not_global)[None, None, :, None, :]
          & block_sparse.gather_valid(mask, window))]
      ends = global_rows
      parts.append(block_sparse.Part(
          k[:, :, ends], v[:, :, ends], mask[:, ends][:, None, None, None]))
      if self.num_random_blocks:
        chosen = random_blocks(nb, b, self.num_random_blocks, self.num_heads,
                               self.random_limit, self.pattern_seed())
        slots = chosen[..., None] * b + np.arange(b)  # [h, G, r, b]
        slots = np.where(chosen[..., None] >= 0, slots, n).reshape(
            self.num_heads, groups, -1).astype(np.int32)
        parts.append(block_sparse.Part(
            block_sparse.gather_tiles(k_pad, slots),
            block_sparse.gather_tiles(v_pad, slots),
            block_sparse.gather_valid(mask_pad, slots)))
      q_mid = block_sparse.to_blocks(q[:, :, b:n - b], b)
      out_mid, _ = block_sparse.attend(q_mid, parts, **dropout())
      out = jnp.concatenate([out_global[:, :, :b],
                             block_sparse.from_blocks(out_mid),
                             out_global[:, :, b:]], axis=2)

    out = block_sparse.positions_major(out)[:, :length]
    return self.output_projection(out_features)(out)
