"""Composite Slice Attention's two attentions as fused Pallas kernels.

`implementation='pallas'` of `cst` (lra_msmra/attention/cst.py) computes the
same layer as `'xla'` with the same parameters; only its two attention
cores run as kernels of `lra_msmra.kernels.flash`:

* the local attention inside slices: every token attends to the real
  tokens of its own slice (causal: of its slice up to itself), one segment
  window of L keys (`flash.Window('segment', size=L)`). Tiles of 64 tokens
  hold 64 / L slices, so the scores of a whole slice and its keys stay in
  registers; no `[slices, L, L]` array is written.
* the global attention among slice embeddings, with real slices as keys
  (causal: the inclusive-causal form that the layer then shifts by one
  slice): flash attention over the n = N / L slices
  (`flash.Window('full')`), never an `[n, n]` array, forward or backward.

What stays in XLA, shared with `'xla'`: the projections, MS-VIPE's
projected table rows (added to queries and keys before the kernels), the
slice aggregation and the broadcast-add, which XLA fuses into the
neighbouring projections (mean, max and linear aggregation alike, and every
composition). Attention dropout is drawn inside the kernels
(`flash.keep_mask`), so under dropout the two implementations drop other
entries; without it they agree to float32 rounding.

Covered: every knob but alpha > 1. With alpha > 1 a key is seen by two
slices at two offsets, each with its own MS-VIPE row, so its position term
depends on the query's slice and cannot be added to the key once; the
layer refuses `implementation='pallas'` with alpha > 1.
"""

from __future__ import annotations

from typing import Optional

import jax

from lra_msmra.kernels import flash

Array = jax.Array


def local_attention(q: Array, k: Array, v: Array, mask: Array, *,
                    causal: bool, dropout_rate: float = 0.0,
                    dropout_seed: Optional[Array] = None) -> Array:
  """Attention inside slices (alpha = 1).

  Args:
    q: scaled queries `[batch, slices, L, heads, d]`, positions added.
    k: keys `[batch, slices, L, heads, d]`, positions added.
    v: values `[batch, slices, L, heads, d]`.
    mask: bool `[batch, slices, L]`, True = real token.
    causal: token l of a slice sees tokens <= l of its slice only.
    dropout_rate: attention dropout (with `dropout_seed`).
    dropout_seed: int32 scalar.

  Returns:
    `[batch, slices, L, heads, d]` in `v`'s dtype; zero for a query whose
    slice holds no real key it may see.
  """
  batch, slices, size, heads, _ = q.shape
  # The model's layout, read by the kernels as it is ('bnhd').
  flat = lambda a: a.reshape(batch, slices * size, heads, a.shape[-1])
  out = flash.flash_attention(
      flat(q), flat(k), flat(v), mask.reshape(batch, slices * size),
      window=flash.Window('segment', size=size, causal=causal),
      dropout_rate=dropout_rate, dropout_seed=dropout_seed, layout='bnhd')
  return out.reshape(batch, slices, size, heads,
                     v.shape[-1]).astype(v.dtype)


def global_attention(q: Array, k: Array, v: Array, slice_valid: Array, *,
                     causal: bool, dropout_rate: float = 0.0,
                     dropout_seed: Optional[Array] = None) -> Array:
  """Attention among slice embeddings.

  Args:
    q: scaled queries `[batch, slices, heads, d]`.
    k: keys `[batch, slices, heads, d]`.
    v: values `[batch, slices, heads, d]`.
    slice_valid: bool `[batch, slices]`, False for slices without real
      tokens.
    causal: inclusive-causal (slice t sees slices <= t).
    dropout_rate: attention dropout (with `dropout_seed`).
    dropout_seed: int32 scalar.

  Returns:
    `[batch, slices, heads, d]` in `v`'s dtype; zero for a query that sees
    no valid slice.
  """
  out = flash.flash_attention(
      q, k, v, slice_valid, window=flash.Window('full', causal=causal),
      dropout_rate=dropout_rate, dropout_seed=dropout_seed, layout='bnhd')
  return out.astype(v.dtype)


def padded_length(length: int, *, slice_length: int, rows: int,
                  head_dim: int, dtype, causal: bool, with_global: bool
                  ) -> int:
  """The length a layer pads its input to, once, so that neither kernel
  call pads again: a multiple of the slice, of the local call's tile, and
  of the slice times the global call's tile (`flash.aligned_length`).

  Args:
    length: the input's length.
    slice_length: L.
    rows: batch x heads.
    head_dim: the queries' and values' width.
    dtype: the queries' dtype.
    causal: the causal form.
    with_global: the layer has the global attention (every composition
      but 'local_only').
  """
  def tiles(n: int) -> list[int]:
    call = lambda nq, window: flash.call_tile(
        nq, nq, rules=(window, None), rows=rows, width=head_dim,
        dtype=dtype)
    out = [call(n, flash.Window('segment', size=slice_length,
                                causal=causal))]
    if with_global:
      slices = n // slice_length
      out.append(slice_length * call(slices, flash.Window('full',
                                                          causal=causal)))
    return out
  return flash.aligned_length(length, slice_length, tiles)

