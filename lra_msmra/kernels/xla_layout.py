"""How the `'xla'` code lays out its memory: scheduling dependencies.

XLA decides when each operation runs and so how long each buffer lives.
Where its choice keeps large buffers alive for nothing, the `'xla'` code
adds a data dependency that orders the work (`after`). Values never change.
"""

from __future__ import annotations

import jax

Array = jax.Array


def after(anchor: Array, *arrays: Array) -> tuple[Array, ...]:
  """`arrays`, made to depend on `anchor` (adds 0 * one entry per row).

  XLA's CPU backend drops `lax.optimization_barrier` before scheduling, so
  work that only reads other values is free to run, or to be merged with an
  identical computation, long before `anchor` exists, and its full-size
  results then stay live in between (e.g. a backward pass recomputing
  forward values before the cotangent arrives). A data dependency on
  `anchor` keeps it after. On other backends the barrier already does this
  and the dependency is one small fused add.

  `anchor` and `arrays` share their leading (batch) axis, and row b of each
  array depends on row b of `anchor` only: under data parallelism every
  device reads its own rows. (A single entry of the whole `anchor` would
  cost one cross-device all-reduce per call.) The values are unchanged
  unless that entry of `anchor`'s row is not finite (then the row becomes
  NaN).
  """
  rows = anchor.shape[0]
  zero = 0.0 * anchor.reshape(rows, -1)[:, 0]
  for a in arrays:
    if a.shape[:1] != (rows,):
      raise ValueError(f'after: shape {a.shape} does not share the leading '
                       f'axis of the anchor {anchor.shape}.')
  return tuple(a + zero.reshape((rows,) + (1,) * (a.ndim - 1)).astype(a.dtype)
               for a in arrays)
