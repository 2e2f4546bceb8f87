"""Combiner's span pooling and grid layout, shared by its implementations.

The pieces of `lra_msmra.attention.combiner` that its `'xla'` code and its
fused kernels (`lra_msmra.kernels.combiner`) both use: pooling over the
real members of a span or of every prefix (suffix) of an axis, and the
`[batch, rows, row_length]` grid of the axial variants.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
from jax import lax
import jax.numpy as jnp

Array = jax.Array


def masked_pool(x: Array, valid: Array, axis: int, kind: str
                ) -> tuple[Array, Array]:
  """Pools `x` over `axis` using valid members only.

  Args:
    x: values to pool.
    valid: bool, broadcastable to `x`, same rank.
    axis: the axis to pool over (removed).
    kind: 'max' or 'mean'.

  Returns:
    (pooled, has_member): `pooled` is 0 where no member is valid.
  """
  has = jnp.any(valid, axis=axis)
  if kind == 'max':
    pooled = jnp.max(jnp.where(valid, x, -jnp.inf), axis=axis)
  else:
    total = jnp.sum(jnp.where(valid, x.astype(jnp.float32), 0.0), axis=axis)
    count = jnp.sum(valid.astype(jnp.float32), axis=axis)
    pooled = total / jnp.maximum(count, 1.0)
  return jnp.where(has, pooled, 0).astype(x.dtype), has


def shift(x: Array, axis: int, reverse: bool, fill: Any) -> Array:
  """Moves `x` one step along `axis` (forward, or backward if `reverse`)."""
  size = x.shape[axis]
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, 1) if reverse else (1, 0)
  x = jnp.pad(x, pad, constant_values=fill)
  return lax.slice_in_dim(x, 1 if reverse else 0, size + (1 if reverse else 0),
                          axis=axis)


def prefix_pool(x: Array, valid: Array, axis: int, kind: str, reverse: bool
                ) -> tuple[Array, Array]:
  """Exclusive prefix (suffix if `reverse`) pooling over valid members.

  Entry t pools the members strictly before t (after t if `reverse`) along
  `axis`: the abstraction of "the part of this column above the query's row".

  Returns:
    (pooled, has_member), shaped like `x` and `valid`; pooled is 0 where the
    prefix has no valid member.
  """
  count = lax.cumsum(valid.astype(jnp.float32), axis=axis, reverse=reverse)
  count = shift(count, axis, reverse, 0.0)
  has = count > 0
  if kind == 'max':
    inclusive = lax.cummax(jnp.where(valid, x, -jnp.inf), axis=axis,
                           reverse=reverse)
    pooled = shift(inclusive, axis, reverse, -jnp.inf)
  else:
    inclusive = lax.cumsum(jnp.where(valid, x.astype(jnp.float32), 0.0),
                           axis=axis, reverse=reverse)
    pooled = shift(inclusive, axis, reverse, 0.0) / jnp.maximum(count, 1.0)
  return jnp.where(has, pooled, 0).astype(x.dtype), has


def to_grid(x: Array, offset: int, row_length: int,
            rows: Optional[int] = None, columns: Optional[int] = None
            ) -> Array:
  """`[B, N, ...]` -> `[B, rows, columns, ...]`: `offset` leading cells,
  the sequence in rows of `row_length`, zeros after it. `rows`: at least
  those the sequence fills (None: those); `columns`: at least
  `row_length` (None: it), the added ones empty."""
  length = x.shape[1]
  if rows is None:
    rows = -(-(offset + length) // row_length)
  back = rows * row_length - offset - length
  if offset or back:
    x = jnp.pad(x, [(0, 0), (offset, back)] + [(0, 0)] * (x.ndim - 2))
  x = x.reshape(x.shape[0], rows, row_length, *x.shape[2:])
  if columns is not None and columns > row_length:
    x = jnp.pad(x, [(0, 0), (0, 0), (0, columns - row_length)]
                + [(0, 0)] * (x.ndim - 3))
  return x


def from_grid(x: Array, offset: int, length: int,
              row_length: Optional[int] = None) -> Array:
  """Inverse of `to_grid`: `[B, n, m, ...]` -> `[B, length, ...]`;
  `row_length`: the columns that hold the sequence (None: all m)."""
  if row_length is not None and x.shape[2] > row_length:
    x = x[:, :, :row_length]
  x = x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
  return x[:, offset:offset + length]
