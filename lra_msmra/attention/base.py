"""Shared pieces of every attention mechanism: the contract and numerics helpers.

Every mechanism is a Linen module that subclasses `Attention`, so they all take
the same leading fields and are called the same way::

  layer = REGISTRY[name](num_heads=4, qkv_features=64, dropout_rate=0.1,
                         causal=False, dtype=jnp.float32, **mechanism_knobs)
  y = layer.apply(variables, x, padding_mask=mask, deterministic=True,
                  rngs={'dropout': key})

`x` is `[batch, length, features]`, `padding_mask` is `[batch, length]` bool
with True = real token, and `y` is `[batch, length, out_features]`.

A mechanism that needs parameters owned by the whole model (shared by every
layer, e.g. CST's multi-scale position tables) overrides `shared_module`. The
encoder then creates that module once, calls it once per forward pass, and hands
its output to every attention layer as the keyword argument `shared`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Dtype = Any

# Logit bias of a masked entry in the LRA reference attention (PROTOCOL §3.1).
LRA_MASK_BIAS = -1e10


class Attention(nn.Module):
  """Base class of all mechanisms: the shared fields of the contract.

  Attributes:
    num_heads: number of attention heads.
    qkv_features: total width of queries/keys/values (heads x head_dim);
      defaults to the input width.
    out_features: output width; defaults to the input width.
    dropout_rate: dropout on attention probabilities (where the mechanism has
      them).
    causal: if True, output i may depend on inputs j <= i only. A mechanism
      that has no causal form raises `NotImplementedError`.
    dtype: computation dtype of activations; parameters stay float32 and
      softmax/normalisers are computed in float32.
    use_bias: biases on the Q/K/V/output projections (False in LRA, True in
      the PyTorch protocol of Xiong et al.).
    kernel_init: initialiser of projection kernels (Xavier-uniform in LRA).
    bias_init: initialiser of projection biases.
  """
  num_heads: int = 8
  qkv_features: Optional[int] = None
  out_features: Optional[int] = None
  dropout_rate: float = 0.0
  causal: bool = False
  dtype: Dtype = jnp.float32
  use_bias: bool = False
  kernel_init: Callable[..., Array] = nn.initializers.xavier_uniform()
  bias_init: Callable[..., Array] = nn.initializers.zeros

  @classmethod
  def shared_module(cls, attention_kw: Mapping[str, Any], *, features: int,
                    max_len: int, name: str,
                    causal: bool = False) -> Optional[nn.Module]:
    """Returns a module of model-level parameters shared by all layers, or None.

    The encoder calls this once inside its own `compact` method, calls the
    returned module with no arguments, and passes the result to every layer as
    `shared=...`.

    Args:
      attention_kw: the mechanism knobs the layers are built with.
      features: model width.
      max_len: longest sequence the model sees (CLS included).
      name: the name to give the module (its parameter scope).
      causal: whether the layers are built in causal mode.
    """
    del attention_kw, features, max_len, name, causal
    return None

  # -- helpers for subclasses ------------------------------------------------

  def head_dims(self, x: Array) -> tuple[int, int, int]:
    """Returns (qkv_features, head_dim, out_features) for input `x`."""
    features = x.shape[-1]
    qkv = self.qkv_features or features
    if qkv % self.num_heads:
      raise ValueError(
          f'qkv_features={qkv} is not divisible by num_heads={self.num_heads}; '
          'choose qkv_dim as a multiple of num_heads.')
    return qkv, qkv // self.num_heads, self.out_features or features

  def projection(self, head_dim: int, name: str) -> nn.Module:
    """A `[..., features] -> [..., heads, head_dim]` projection."""
    return nn.DenseGeneral(
        features=(self.num_heads, head_dim), axis=-1, use_bias=self.use_bias,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        dtype=self.dtype, param_dtype=jnp.float32, name=name)

  def output_projection(self, out_features: int, name: str = 'out') -> nn.Module:
    """A `[..., heads, head_dim] -> [..., out_features]` projection."""
    return nn.DenseGeneral(
        features=out_features, axis=(-2, -1), use_bias=self.use_bias,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        dtype=self.dtype, param_dtype=jnp.float32, name=name)

  def attention_dropout(self, probs: Array, deterministic: bool) -> Array:
    """Dropout on attention probabilities, element-wise (not broadcast)."""
    if deterministic or self.dropout_rate == 0.0:
      return probs
    keep = 1.0 - self.dropout_rate
    mask = jax.random.bernoulli(self.make_rng('dropout'), keep, probs.shape)
    return jnp.where(mask, probs / keep, 0.0).astype(probs.dtype)


def default_padding_mask(x: Array, padding_mask: Optional[Array]) -> Array:
  """Returns `padding_mask` as bool `[batch, length]`, all True if None."""
  if padding_mask is None:
    return jnp.ones(x.shape[:2], dtype=bool)
  if padding_mask.shape != x.shape[:2]:
    raise ValueError(
        f'padding_mask has shape {padding_mask.shape}, expected '
        f'{x.shape[:2]} ([batch, length], True = real token).')
  return padding_mask.astype(bool)


def safe_softmax(logits: Array, valid: Array, axis: int = -1) -> Array:
  """Softmax over the valid entries; rows with no valid entry give zeros.

  Computed in float32 whatever the input dtype. Gradients are finite for any
  pattern of `valid`, including rows that are entirely invalid.

  Args:
    logits: scores, any shape.
    valid: bool, broadcastable to `logits`; False entries get zero weight.
    axis: the axis to normalise over.

  Returns:
    float32 weights of `logits`' shape.
  """
  logits = logits.astype(jnp.float32)
  valid = jnp.broadcast_to(valid, logits.shape)
  masked = jnp.where(valid, logits, -jnp.inf)
  row_max = jnp.max(masked, axis=axis, keepdims=True)
  row_max = jax.lax.stop_gradient(
      jnp.where(jnp.isfinite(row_max), row_max, 0.0))
  unnorm = jnp.exp(masked - row_max)
  total = jnp.sum(unnorm, axis=axis, keepdims=True)
  return unnorm / jnp.where(total > 0, total, 1.0)


def safe_softmax_parts(logits: Sequence[Array], valid: Sequence[Array]
                       ) -> list[Array]:
  """`safe_softmax` over the last axis of the concatenated `logits`, in parts.

  The parts share their leading axes; one row maximum and one row total over
  all of them (a multi-part log-sum-exp) give the weights of the
  concatenation without building it, so no second copy of the logits or of
  their masks exists. Same numerics as `safe_softmax`: float32, zeros for
  rows without a valid entry, finite gradients.

  Args:
    logits: the parts `[..., keys_p]`.
    valid: bool, one per part, broadcastable to it.

  Returns:
    float32 weights, one array per part.
  """
  masked = [jnp.where(m, l.astype(jnp.float32), -jnp.inf)
            for l, m in zip(logits, valid)]
  row_max = masked[0].max(-1, keepdims=True)
  for m in masked[1:]:
    row_max = jnp.maximum(row_max, m.max(-1, keepdims=True))
  row_max = jax.lax.stop_gradient(
      jnp.where(jnp.isfinite(row_max), row_max, 0.0))
  unnorm = [jnp.exp(m - row_max) for m in masked]
  total = unnorm[0].sum(-1, keepdims=True)
  for u in unnorm[1:]:
    total = total + u.sum(-1, keepdims=True)
  total = jnp.where(total > 0, total, 1.0)
  return [u / total for u in unnorm]


def causal_mask(q_len: int, k_len: Optional[int] = None) -> Array:
  """Bool `[q_len, k_len]`, True where key j <= query i."""
  k_len = q_len if k_len is None else k_len
  return jnp.arange(k_len)[None, :] <= jnp.arange(q_len)[:, None]


def pad_to_multiple(x: Array, padding_mask: Array, multiple: int
                    ) -> tuple[Array, Array, int]:
  """Right-pads `[batch, length, ...]` to a multiple of `multiple`.

  The added positions are marked as padding. Returns the padded array, the
  padded mask and the original length (to crop the output back).
  """
  length = x.shape[1]
  extra = (-length) % multiple
  if extra == 0:
    return x, padding_mask, length
  pad = [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)
  return (jnp.pad(x, pad), jnp.pad(padding_mask, [(0, 0), (0, extra)]),
          length)
