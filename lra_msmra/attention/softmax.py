"""Standard multi-head softmax attention, numerically as in the LRA reference.

This is the baseline every efficient mechanism is compared with, and the
reference the tests compare them against. It follows the attention of the LRA
Transformer (google-research/long-range-arena, `models/transformer`, via the
old `flax.nn.attention`), docs/protocol.md §3.1:

* Q, K, V and output projections, Xavier-uniform kernels, no biases by default;
* queries divided by sqrt(head_dim);
* the mask is the outer product of the query and key padding masks (and,
  with `causal=True`, of the causal mask), applied as an additive bias of
  -1e10;
* softmax in float32, then element-wise dropout on the probabilities.

Padded query rows: the one exception to the padded-row rule of
`base.Attention` (`zero_padded_queries = False`). A padded row has every
logit at -1e10, so it attends uniformly to all positions (in causal form,
later ones included) and holds the mean of all values through W_o, as in
LRA. We keep it because the LRA protocol reads those rows: MEAN pooling
averages over padded positions (P9), and a black first pixel masks the CLS
query that Image pools on (P8). Real outputs never read them.
docs/mechanisms/softmax.md §2 and §3.2 give the details.

Implementations (the field `implementation`, `lra_msmra.kernels`): `'xla'`
is the code below, the LRA numerics and the default. `'cudnn'` (NVIDIA
GPUs, bfloat16 or float16) and `'tpu_flash'` (Cloud TPUs) compute the same
attention with a fused flash attention (`lra_msmra.kernels.softmax`), with
two differences: padded query rows are zero, as for every other mechanism,
and there is no attention dropout (a layer with `dropout_rate > 0` is
refused).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base
from lra_msmra.kernels import softmax as fused


class SoftmaxAttention(base.Attention):
  """Full softmax attention, O(N^2) time and memory (see module docstring)."""

  # LRA's values at padded queries (see the module docstring); the fused
  # implementations zero them in `attend`.
  zero_padded_queries = False

  def check_knobs(self) -> None:
    if self.implementation != 'xla':
      fused.check(self.implementation, dtype=self.dtype,
                  dropout_rate=self.dropout_rate)

  @nn.compact
  def attend(self, x: jax.Array, *, padding_mask: jax.Array,
             deterministic: bool) -> jax.Array:
    _, head_dim, out_features = self.head_dims(x)
    q, k, v = self.project_qkv(x)
    y = self.kernel('attention')(q, k, v, padding_mask, head_dim,
                                 deterministic)
    y = self.output_projection(out_features)(y)
    if self.implementation != 'xla':
      # The padded-row rule of the other mechanisms, output biases included.
      return jnp.where(padding_mask[..., None], y, jnp.zeros((), y.dtype))
    return y

  def _attention_xla(self, q, k, v, padding_mask, head_dim, deterministic):
    """LRA's code: the weights in memory, padded queries included."""
    q = q / jnp.sqrt(head_dim).astype(self.dtype)
    # [batch, heads, q_len, k_len], accumulated and normalised in float32.
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k,
                        preferred_element_type=jnp.float32)
    valid = padding_mask[:, None, :, None] & padding_mask[:, None, None, :]
    if self.causal:
      valid = valid & base.causal_mask(q.shape[1])[None, None]
    logits = jnp.where(valid, logits, base.LRA_MASK_BIAS)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = self.attention_dropout(probs, deterministic).astype(self.dtype)
    return jnp.einsum('bhqk,bkhd->bqhd', probs, v)

  def _attention_fused(self, q, k, v, padding_mask, head_dim, deterministic):
    """cuDNN's or the TPU's fused flash attention (no dropout: `check`)."""
    del deterministic
    return fused.attention(self.implementation, q, k, v, padding_mask,
                           causal=self.causal, scale=head_dim ** -0.5)

  KERNELS = {'xla': {'attention': _attention_xla},
             **dict.fromkeys(fused.IMPLEMENTATIONS,
                             {'attention': _attention_fused})}
