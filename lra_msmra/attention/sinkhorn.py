r"""Sparse Sinkhorn attention (registry `sinkhorn`).

Paper: Tay et al., ICML 2020, arXiv:2002.11296. Official LRA code: google-
research/long-range-arena, `lra_benchmarks/models/sinkhorn_transformer/`.

A SortNet maps each block's key summary to a soft permutation R over blocks
(softmax, or Sinkhorn balancing); every query attends to its own block and,
with a second softmax, to block i's sorted keys sum_j R_ij K_j; the two outputs
are added.

docs/mechanisms/sinkhorn.md: the computation, every departure from the official
code and why, padding, the causal form (softmax sorting only; 'sinkhorn'
sorting raises), the tested invariants and the LRA settings.
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base

Array = jax.Array

SORT_ACTIVATIONS = ('softmax', 'sinkhorn')


def sinkhorn_balance(logits: Array, valid: Array, iterations: int) -> Array:
  """Alternating row/column normalisation of exp(logits) in log space.

  Args:
    logits: float32 `[..., rows, cols]`.
    valid: bool, broadcastable; invalid entries get weight 0 and rows or
      columns without a valid entry stay 0.
    iterations: number of (row, column) normalisation pairs.

  Returns:
    float32 matrix of `logits`' shape.
  """
  valid = jnp.broadcast_to(valid, logits.shape)
  log_r = jnp.where(valid, logits, -jnp.inf)

  def normalise(a, axis):
    top = jax.lax.stop_gradient(jnp.max(a, axis=axis, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    total = jnp.sum(jnp.exp(a - top), axis=axis, keepdims=True)
    lse = top + jnp.log(jnp.where(total > 0, total, 1.0))
    return jnp.where(valid, a - lse, -jnp.inf)

  # A loop, not unrolled: the compiled program does not grow with
  # `iterations` (same values).
  log_r = jax.lax.fori_loop(
      0, iterations, lambda _, a: normalise(normalise(a, -1), -2), log_r)
  return jnp.where(valid, jnp.exp(log_r), 0.0)


class SinkhornAttention(base.Attention):
  """Sparse Sinkhorn attention (see the module docstring).

  Attributes:
    block_size: tokens per block b (official default 50; 64 on images).
    max_num_blocks: width of the SortNet output; None = the number of blocks
      at initialisation.
    sort_activation: 'softmax' (official LRA) or 'sinkhorn'.
    sinkhorn_iterations: row/column normalisation pairs for 'sinkhorn'
      (official default 1).
    temperature: the SortNet logits are divided by it (official 1.0).
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('b4', {'block_size': 4}),
      ('b3_sinkhorn', {
          'block_size': 3, 'sort_activation': 'sinkhorn',
          'sinkhorn_iterations': 3}),
  )

  block_size: int = 50
  max_num_blocks: Optional[int] = None
  sort_activation: str = 'softmax'
  sinkhorn_iterations: int = 1
  temperature: float = 1.0

  def check_knobs(self) -> None:
    if self.sort_activation not in SORT_ACTIVATIONS:
      raise ValueError(f'Unknown sort_activation {self.sort_activation!r}; '
                       f'valid: {SORT_ACTIVATIONS}.')
    if self.causal and self.sort_activation == 'sinkhorn':
      raise NotImplementedError(
          "Sinkhorn attention with sort_activation='sinkhorn' has no causal "
          'form: column normalisation lets later blocks change the sorting '
          "of earlier ones. Use sort_activation='softmax' (the official LRA "
          'choice) or causal=False.')
    for name in ('block_size', 'sinkhorn_iterations'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'Sinkhorn {name}={value!r} must be a positive int.')
    if self.max_num_blocks is not None and (
        not isinstance(self.max_num_blocks, int) or self.max_num_blocks < 1):
      raise ValueError(f'max_num_blocks={self.max_num_blocks!r} must be a '
                       'positive int or None.')
    if not self.temperature > 0:
      raise ValueError(f'temperature={self.temperature!r} must be > 0.')

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies Sinkhorn attention; see `base.Attention.attend`."""
    q, k, v = self.project_qkv(x)
    _, head_dim, out_features = self.head_dims(x)
    real, length = padding_mask, x.shape[1]
    b = self.block_size
    q, real_p, _ = base.pad_to_multiple(q, real, b)
    k, _, _ = base.pad_to_multiple(k, real, b)
    v, _, _ = base.pad_to_multiple(v, real, b)
    batch, padded = real_p.shape
    blocks = padded // b
    keep = real_p[:, :, None, None]
    k = jnp.where(keep, k, 0).astype(self.dtype)
    v = jnp.where(keep, v, 0).astype(self.dtype)
    split = lambda a: a.reshape(batch, blocks, b, *a.shape[2:])
    qb, kb, vb, rb = split(q), split(k), split(v), split(real_p)
    block_real = rb.any(-1)  # [batch, blocks]

    # SortNet: one summary per block and head -> logits over blocks.
    summary = kb[:, :, 0] if self.causal else kb.sum(axis=2)
    width = self.max_num_blocks or blocks
    if self.has_variable('params', 'sort'):
      width = self.get_variable('params', 'sort')['kernel'].shape[-1]
    if blocks > width:
      raise ValueError(
          f'Sinkhorn SortNet has {width} outputs but the input has {blocks} '
          f'blocks of {b}; set max_num_blocks >= {blocks} or a larger '
          'block_size (model.attention_kw).')
    sort_logits = nn.DenseGeneral(
        width, axis=-1, use_bias=self.use_bias, kernel_init=self.kernel_init,
        bias_init=self.bias_init, dtype=jnp.float32,
        param_dtype=jnp.float32, name='sort')(summary.astype(jnp.float32))
    sort_logits = jnp.moveaxis(sort_logits[..., :blocks], 2, 1)  # [b,h,i,j]
    sort_logits = sort_logits / self.temperature
    cols = block_real[:, None, None, :]
    if self.causal:
      cols = cols & (jnp.arange(blocks)[None, :]
                     < jnp.arange(blocks)[:, None])[None, None]
    if self.sort_activation == 'softmax':
      sort = base.safe_softmax(sort_logits, cols)
    else:
      sort = sinkhorn_balance(sort_logits,
                              cols & block_real[:, None, :, None],
                              self.sinkhorn_iterations)
    self.sow('intermediates', 'sort_matrix', sort)

    # Sorted keys and values of block i: sum_j R_ij K_j (slot by slot).
    sk = jnp.einsum('bhij,bjshd->bishd', sort.astype(self.dtype), kb)
    sv = jnp.einsum('bhij,bjshd->bishd', sort.astype(self.dtype), vb)
    slot_mass = jnp.einsum('bhij,bjs->bhis', sort,
                           rb.astype(jnp.float32))  # [b, h, i, s]

    qb = qb / jnp.sqrt(head_dim).astype(self.dtype)
    local_valid = rb[:, None, :, None, :]  # [b, 1, i, q, s]
    if self.causal:
      local_valid = local_valid & base.causal_mask(b)[None, None, None]
    local = base.safe_softmax(
        jnp.einsum('biqhd,bishd->bhiqs', qb, kb,
                   preferred_element_type=jnp.float32), local_valid)
    sorted_w = base.safe_softmax(
        jnp.einsum('biqhd,bishd->bhiqs', qb, sk,
                   preferred_element_type=jnp.float32),
        (slot_mass > 0)[:, :, :, None, :])
    local = self.attention_dropout(local, deterministic).astype(self.dtype)
    sorted_w = self.attention_dropout(sorted_w, deterministic).astype(
        self.dtype)
    out = (jnp.einsum('bhiqs,bishd->biqhd', local, vb)
           + jnp.einsum('bhiqs,bishd->biqhd', sorted_w, sv))
    out = out.reshape(batch, padded, self.num_heads, head_dim)[:, :length]
    out = out.astype(self.dtype)
    return self.output_projection(out_features)(out)
