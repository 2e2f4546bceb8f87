"""Standard multi-head softmax attention, numerically as in the LRA reference.

This is the baseline every efficient mechanism is compared with, and the
reference the tests compare them against. It follows the attention of the LRA
Transformer (google-research/long-range-arena, `models/transformer`, via the
old `flax.nn.attention`), docs/protocol.md §3.1:

* Q, K, V and output projections, Xavier-uniform kernels, no biases by default;
* queries divided by sqrt(head_dim);
* the mask is the outer product of the query and key padding masks, applied as
  an additive bias of -1e10 (so a padded query row attends uniformly to all
  keys, as in LRA: only real-token outputs are meaningful);
* softmax in float32, then element-wise dropout on the probabilities.

With `causal=True` keys after the query are masked as well.
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base


class SoftmaxAttention(base.Attention):
  """Full softmax attention, O(N^2) time and memory (see module docstring)."""

  @nn.compact
  def __call__(self, x: jax.Array, *, padding_mask: Optional[jax.Array] = None,
               deterministic: bool = True) -> jax.Array:
    padding_mask = base.default_padding_mask(x, padding_mask)
    _, head_dim, out_features = self.head_dims(x)
    x = x.astype(self.dtype)
    q = self.projection(head_dim, 'query')(x)
    k = self.projection(head_dim, 'key')(x)
    v = self.projection(head_dim, 'value')(x)
    q = q / jnp.sqrt(head_dim).astype(self.dtype)
    # [batch, heads, q_len, k_len], accumulated and normalised in float32.
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k,
                        preferred_element_type=jnp.float32)
    valid = padding_mask[:, None, :, None] & padding_mask[:, None, None, :]
    if self.causal:
      valid = valid & base.causal_mask(x.shape[1])[None, None]
    logits = jnp.where(valid, logits, base.LRA_MASK_BIAS)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = self.attention_dropout(probs, deterministic).astype(self.dtype)
    y = jnp.einsum('bhqk,bkhd->bqhd', probs, v)
    return self.output_projection(out_features)(y)
