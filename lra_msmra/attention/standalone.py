"""One attention layer on its own, built and called as the encoder does.

`StandaloneAttention` builds a registered mechanism through the route the
encoder takes, `lra_msmra.attention.Mechanism` (the contract's fields plus
its knobs): it creates the mechanism's model-level shared module (if it has
one, e.g. CST's MS-VIPE tables) and calls the layer. Tests and the
benchmarks use it to reach any mechanism by name::

  layer = StandaloneAttention(mechanism='cst', kw={'slice_length': 8},
                              num_heads=4, qkv_features=256, max_len=4096)
  variables = layer.init(key, x, padding_mask=mask)
  y = layer.apply(variables, x, padding_mask=mask)

Parameters live under `attention` (the layer) and `attention_shared` (the
shared module), the names the encoder gives them.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
from flax.core import FrozenDict
import jax
import jax.numpy as jnp

from lra_msmra.attention import Mechanism


class StandaloneAttention(nn.Module):
  """One attention layer plus its shared module, called like the encoder.

  Attributes:
    mechanism: registry name (`lra_msmra.attention.REGISTRY`).
    kw: the mechanism's knobs (`Mechanism.knobs`; unknown keys fail when
      the layer is built).
    num_heads: heads of the layer.
    qkv_features: width of queries/keys/values (heads x head_dim).
    out_features: output width; None = the input width.
    dropout_rate: attention dropout.
    causal: build the causal form.
    dtype: activation dtype.
    use_bias: biases on the layer's projections (the contract's
      `use_bias`; they start at zero, `bias_init`'s default).
    max_len: the longest sequence the model would see; sizes the shared
      module (e.g. CST's slice-level position table).
  """
  mechanism: str
  kw: Mapping[str, Any] = FrozenDict()
  num_heads: int = 4
  qkv_features: int = 32
  out_features: Optional[int] = None
  dropout_rate: float = 0.0
  causal: bool = False
  dtype: Any = jnp.float32
  use_bias: bool = False
  max_len: int = 64

  @nn.compact
  def __call__(self, x: jax.Array, *, padding_mask: Optional[jax.Array] = None,
               deterministic: bool = True) -> jax.Array:
    """Applies the layer.

    Args:
      x: `[batch, length, features]`.
      padding_mask: bool `[batch, length]`, True = real token; None = all real.
      deterministic: disables dropout.

    Returns:
      `[batch, length, out_features]`.
    """
    mechanism = Mechanism(
        self.mechanism, self.kw,
        dict(num_heads=self.num_heads, qkv_features=self.qkv_features,
             out_features=self.out_features, dropout_rate=self.dropout_rate,
             causal=self.causal, dtype=self.dtype, use_bias=self.use_bias))
    shared = mechanism.shared_inputs(features=x.shape[-1], max_len=self.max_len)
    return mechanism.layer(name='attention')(
        x, padding_mask=padding_mask, deterministic=deterministic, **shared)
