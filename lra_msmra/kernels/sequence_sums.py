"""Weighted sums over the sequence in the model's layout, per platform.

`weighted_sums(w, x)[b, h, r, d] = sum_n w[b, n, h, r] x[b, n, h, d]`: the
landmark projections of Transformer-LS (K̄, V̄) and the key summaries of
AdaMRA (KV), as their `implementation='pallas'` computes them.

The heads, a batch axis of these products, sit between the sequence and the
width in the model's `[B, N, H, ·]` layout. As a matrix product
(`jnp.einsum`) XLA's GPU compiler transposes both operands to put the batch
axes first, and the gradients back (a Transformer-LS layer at 16K tokens:
7 activation-sized transposes in its compiled H200 program, 3 with the form
below: `python -m lra_msmra_tools.benchmark.kernel_work --compiled h200`).
On GPUs the sums are therefore a multiply-reduce that XLA fuses into one
reduction, forward and backward, with no transposed copies; the work,
n x r x d per head, is small beside the attention's. On TPUs and the CPU
they stay the matrix product, as in `'xla'`. Both agree to float32 rounding.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

Array = jax.Array


def _product(w: Array, x: Array) -> Array:
  return jnp.einsum('bnhr,bnhd->bhrd', w, x)


def _reduce(w: Array, x: Array) -> Array:
  return jnp.sum(w[..., :, None] * x[..., None, :], axis=1)


def weighted_sums(w: Array, x: Array) -> Array:
  """`[B, N, H, r]` weights of `[B, N, H, d]` values -> `[B, H, r, d]`
  (in their common dtype), summed over the sequence: a fused multiply-
  reduce on GPUs, a matrix product elsewhere."""
  return lax.platform_dependent(w, x, cuda=_reduce, rocm=_reduce,
                                default=_product)
