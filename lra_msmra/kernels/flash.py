"""Flash attention over a window of sequence keys and a set of extra keys.

One fused Pallas kernel family (forward, and a backward pass through
`jax.custom_vjp`) that computes, for every query i of one (batch, head),

    out_i = sum_j softmax_j(s_ij) v_j,   s_ij = q_i . k_j,

over one joint softmax whose keys are

* the sequence keys j that the static `Window` lets query i see: all of
  them ('full'), those of its segment widened by `left` / `right` keys
  ('segment', segments of `size` queries), or those within `left` before
  and `right` after it ('sliding'); optionally only j <= i (`causal`);
* and extra keys m (landmarks, slice or span summaries), seen under the
  static `Extra` rule: all of them ('all'), or only those of another group
  ('other_group') or of an earlier group ('earlier_group') than the
  query's, with groups of `key_group` extra keys and `query_group` queries;

each only where its validity flag is set. A query with no valid key
outputs zeros (`base.safe_softmax`'s rule). The queries come scaled.

Attention dropout (`dropout_rate`) drops normalised weights, as dropout
after a softmax does, with a keep mask drawn inside the kernel: a
counter-based hash of (seed, batch, head, query, key, part) (`keep_mask`,
the same function in plain jnp), so that no mask array exists in memory and
the backward pass redraws the same mask. The bits are not those of
`jax.random`: the same seed gives other masks than an XLA implementation
that draws with `jax.random.bernoulli`.

This one pattern is the hot path of several mechanisms: CST's local
attention inside slices (segments, no extras) and its global attention
over slice embeddings (full window), Transformer-LS's window plus
dynamic-projection landmarks under one softmax (segments or a sliding
window, extras for all queries or for later chunks), and Combiner-Fixed's
own-block keys plus the summaries of the other blocks.

Memory and work are those of FlashAttention (Dao et al. 2022): the scores
exist one tile of `block` queries by `block` keys at a time, in registers or
VMEM, with an online softmax; only the output and the per-row log-sum-exp
are written. The backward pass recomputes the tiles from them: one kernel
for dQ (looping over the keys each query tile sees; it also computes delta
= rowsum(dO * O) per query tile) and one for dK / dV of the sequence keys
and of the extra keys (looping over the query tiles that see each key
tile). Where the window is tile-local (`tile_local`: each query tile sees
keys of its own tile only), the dQ kernel also computes that tile's window
dK / dV, from the same scores (5 products per tile, not 7, and no dK / dV
kernel for the window). The loops visit only the key tiles inside the
window, so a banded window costs O(N (w + extras)) instead of O(N^2).
Inside a loop, a tile whose every (query, key) pair the rule lets through
and whose keys are all valid (`_full_tiles`, `valid_tiles`) takes a body
without the mask arithmetic; boundary tiles take the masked one.
Exponentials are exp2, log2(e) folded into the multiply-add that subtracts
the running maximum; the log-sum-exp the kernels write is natural.

Platforms: the same kernel body is lowered with Triton on NVIDIA GPUs and
with Mosaic on TPUs, and runs in Pallas' interpreter on the CPU (where it is
tested against the plain XLA formula, `reference`). `lax.platform_dependent`
picks the form when the program is lowered, so a program exported for
`cuda` or `tpu` on a CPU-only machine holds the real kernel (one platform
per program: the Triton and Mosaic parameters sit in separate branches,
which one program lowered for both platforms at once cannot hold). Each
call's settings per compiler are a `Launch`: on TPUs the scoped VMEM limit
and 'parallel' grid axes (a megacore chip, v4 or v5p, splits them over its
two cores); on GPUs Triton's warps and pipeline stages. A call's tile
fits its pattern (`fitted_block`: the largest whose visited tiles use at
least half of their scores), within a cap per head width (`max_block`);
the cap, the warps and the stages follow rules found by compiling every
mechanism for an H200 without a register spill, or the tile table that a
GPU sweep measured (`TILE_TABLE`). A dK / dV grid too small to fill a GPU
is split over query chunks (`query_chunks`).

On TPUs the whole-sequence operands (the keys and values of the forward
and dQ kernels, the queries and output gradients of the dK / dV kernel)
stay in HBM and stream through two-tile VMEM buffers, the next tile's copy
started before the current one is used (`_Rows`), so VMEM does not grow
with the sequence; Triton reads them from global memory tile by tile.

Kernel code avoids what one of the lowerings lacks: integer division is
`lax.div` on non-negative values (`//` lowers through `sign`, which Mosaic
resolves against the local device); key flags come as a row per key tile
`[tiles, t]` (a dynamic slice along the lane axis must be provably a
multiple of 128 lanes on TPUs; a row index may be anything), per-query
statistics as columns `[N, 1]` for the forward and dQ kernels and as rows
per query tile for the dK / dV kernel, which works on transposed tiles
(keys by queries); iotas are 2-D. `INTERPRET_TPU_FORM` runs the TPU form
(streaming, DMA semaphores) in Pallas' TPU interpreter on the CPU.
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton
import jax.numpy as jnp

from lra_msmra.kernels import mesh as mesh_lib

Array = jax.Array

# Score of a masked entry: finite, so that no tile computes inf - inf; the
# weights of masked entries are set to zero explicitly, never through it.
NEG = -1e30
# The kernels exponentiate with exp2: scores are taken in base 2 (log2(e)
# folded into the one multiply-add that subtracts the running maximum), the
# log-sum-exp they write stays natural.
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# Queries and keys per tile (tiles are smaller when the sequence is).
DEFAULT_BLOCK = 64
# Smallest tile: Triton's matrix product needs 16 rows and columns.
MIN_BLOCK = 16
WINDOW_KINDS = ('full', 'segment', 'sliding')
EXTRA_KINDS = ('all', 'other_group', 'earlier_group')


class Window(NamedTuple):
  """Which sequence keys j query i sees (static; see the module docstring).

  Attributes:
    kind: 'full', 'segment' (queries in segments of `size`; segment g sees
      keys [g size - left, (g + 1) size + right)) or 'sliding' (keys
      [i - left, i + right]).
    size: the segment length ('segment' only).
    left: keys before the segment or the query.
    right: keys after the segment or the query.
    causal: also require j <= i.
  """
  kind: str = 'full'
  size: int = 0
  left: int = 0
  right: int = 0
  causal: bool = False

  def check(self) -> None:
    if self.kind not in WINDOW_KINDS:
      raise ValueError(f'Window kind {self.kind!r}; valid: {WINDOW_KINDS}.')
    if self.kind == 'segment' and self.size < 1:
      raise ValueError(f'A segment window needs size >= 1, got {self.size}.')
    if self.left < 0 or self.right < 0:
      raise ValueError(f'Window left={self.left} and right={self.right} must '
                       'be >= 0.')

  def intervals(self) -> bool:
    """Each query's keys, and each key's queries, are exactly one
    `key_range` / `query_range` interval (`_full_tiles`)."""
    return True

  def mask(self, i: Array, j: Array) -> Optional[Array]:
    """Bool, broadcast of query positions `i` and key positions `j`."""
    ok = None
    if self.kind == 'segment':
      start = lax.div(i, self.size) * self.size
      ok = (j >= start - self.left) & (j < start + self.size + self.right)
    elif self.kind == 'sliding':
      ok = (j >= i - self.left) & (j <= i + self.right)
    if self.causal:
      ok = (j <= i) if ok is None else ok & (j <= i)
    return ok

  def key_range(self, i0: Array, i1: Array, n: int) -> tuple[Array, Array]:
    """Keys [lo, hi) that queries i0..i1 may see, within [0, n)."""
    lo, hi = jnp.int32(0), jnp.int32(n)
    if self.kind == 'segment':
      lo = lax.div(i0, self.size) * self.size - self.left
      hi = (lax.div(i1, self.size) + 1) * self.size + self.right
    elif self.kind == 'sliding':
      lo, hi = i0 - self.left, i1 + self.right + 1
    if self.causal:
      hi = jnp.minimum(hi, i1 + 1)
    return jnp.maximum(lo, 0), jnp.minimum(hi, n)

  def query_range(self, j0: Array, j1: Array, n: int) -> tuple[Array, Array]:
    """Queries [lo, hi) that may see one of the keys j0..j1, within [0, n)."""
    lo, hi = jnp.int32(0), jnp.int32(n)
    if self.kind == 'segment':
      first = lax.div(jnp.maximum(j0 - self.right, 0), self.size)
      last = lax.div(j1 + self.left, self.size)
      lo, hi = first * self.size, (last + 1) * self.size
    elif self.kind == 'sliding':
      lo, hi = j0 - self.right, j1 + self.left + 1
    if self.causal:
      lo = jnp.maximum(lo, j0)
    return jnp.maximum(lo, 0), jnp.minimum(hi, n)


class Extra(NamedTuple):
  """Which extra keys m query i sees (static; see the module docstring).

  Attributes:
    kind: 'all', 'other_group' (group of m differs from the query's) or
      'earlier_group' (group of m is before the query's).
    key_group: extra keys per group.
    query_group: queries per group.
  """
  kind: str = 'all'
  key_group: int = 1
  query_group: int = 1

  def check(self) -> None:
    if self.kind not in EXTRA_KINDS:
      raise ValueError(f'Extra kind {self.kind!r}; valid: {EXTRA_KINDS}.')
    if self.key_group < 1 or self.query_group < 1:
      raise ValueError('Extra key_group and query_group must be >= 1, got '
                       f'{self.key_group} and {self.query_group}.')

  def intervals(self) -> bool:
    """As `Window.intervals`: not 'other_group' (two intervals)."""
    return self.kind != 'other_group'

  def mask(self, i: Array, m: Array) -> Optional[Array]:
    if self.kind == 'all':
      return None
    gi, gm = lax.div(i, self.query_group), lax.div(m, self.key_group)
    return (gm != gi) if self.kind == 'other_group' else (gm < gi)

  def key_range(self, i0: Array, i1: Array, n: int) -> tuple[Array, Array]:
    del i0
    if self.kind == 'earlier_group':
      hi = lax.div(i1, self.query_group) * self.key_group
      return jnp.int32(0), jnp.minimum(hi, n)
    return jnp.int32(0), jnp.int32(n)

  def query_range(self, j0: Array, j1: Array, n: int) -> tuple[Array, Array]:
    del j1
    if self.kind == 'earlier_group':
      lo = (lax.div(j0, self.key_group) + 1) * self.query_group
      return jnp.minimum(lo, n), jnp.int32(n)
    return jnp.int32(0), jnp.int32(n)


class _Static(NamedTuple):
  """Everything static about one call. `layout`: of the sequence operands
  (queries, keys, values, the output and their gradients), 'bhnd' `[batch,
  heads, n, d]` or 'bnhd' `[batch, n, heads, d]`.

  `fold` (with 'bnhd' only): the call's batch rows that one array row
  holds side by side along its heads axis. An operand `[rows, n, fold *
  heads, d]` is then a call over `rows * fold` batch rows (row b * fold + f
  reads heads f * heads ...): a grid `[B, n, m, H, d]` viewed as `[B, n, m
  * H, d]` is a call over its B * m columns, with no transposed copy."""
  window: Optional[Window]
  extra: Optional[Extra]
  block: int
  heads: int = 1
  dropout_rate: float = 0.0
  extra_mass: bool = False
  layout: str = 'bhnd'
  fold: int = 1


LAYOUTS = ('bhnd', 'bnhd')


def _dims(x, layout: str, fold: int = 1) -> tuple[int, int, int, int]:
  """(batch, heads, n, d) of a sequence operand in `layout` (`_Static`'s
  `fold`)."""
  b, a, c, d = x.shape
  return (b, a, c, d) if layout == 'bhnd' else (b * fold, c // fold, a, d)


def _seq_shape(batch: int, heads: int, n: int, d: int, layout: str,
               fold: int = 1) -> tuple[int, int, int, int]:
  if layout == 'bhnd':
    return (batch, heads, n, d)
  return (batch // fold, n, heads * fold, d)


# Part tags of the keep mask's hash: sequence keys and extra keys.
WINDOW_PART, EXTRA_PART = 0, 1


def _mix(x: Array) -> Array:
  """A 32-bit finaliser (MurmurHash3's): every input bit moves every output
  bit."""
  x = x ^ lax.shift_right_logical(x, jnp.uint32(16))
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ lax.shift_right_logical(x, jnp.uint32(13))
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ lax.shift_right_logical(x, jnp.uint32(16))


def keep_mask(seed: Array, batch: Array, head: Array, query: Array,
              key: Array, part: int, heads: int, rate: float) -> Array:
  """Bool keep mask of attention dropout, broadcast over its index arrays.

  Args:
    seed: int32 or uint32 scalar (or `[1, 1]`), the layer's draw.
    batch, head, query, key: non-negative int32 indices (any broadcastable
      shapes); `key` counts within its part.
    part: WINDOW_PART or EXTRA_PART.
    heads: number of heads (batch and head make one stream).
    rate: the dropout rate; an entry is kept with probability 1 - rate
      (to within 2^-32).
  """
  u32 = lambda a: jnp.asarray(a).astype(jnp.uint32)
  stream = u32(batch) * jnp.uint32(heads) + u32(head)
  x = _mix(u32(seed) ^ jnp.uint32((0x9E3779B9 * (part + 1)) % 2**32))
  x = _mix(x ^ (stream * jnp.uint32(0x27D4EB2F)))
  x = _mix(x ^ (u32(query) * jnp.uint32(0x165667B1)))
  x = _mix(x ^ u32(key))
  threshold = min(int(round((1.0 - rate) * 2.0**32)), 2**32 - 1)
  return x < jnp.uint32(threshold)


# -- the kernel bodies -------------------------------------------------------


def dot(a: Array, b: Array, contract_a: int, contract_b: int) -> Array:
  """float32 product of two tiles over one axis each (for kernel bodies)."""
  return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())),
                         preferred_element_type=jnp.float32)


def _iota(shape: tuple[int, int], axis: int, start: Array) -> Array:
  return start + lax.broadcasted_iota(jnp.int32, shape, axis)


def _tile_mask(rule, valid_row: Array, i: Array, j: Array) -> Array:
  """Validity of a [queries, keys] tile: the key's flag and the rule."""
  ok = valid_row > 0
  extra = rule.mask(i, j)
  return ok if extra is None else ok & extra


def _tiles(lo: Array, hi: Array, block: int) -> tuple[Array, Array]:
  """Tile indices [first, last) covering [lo, hi) (empty if hi <= lo)."""
  first = lax.div(lo, block)
  last = jnp.maximum(lax.div(hi + block - 1, block), first)
  return first, last


def _full_tiles(rule, a0: Array, a1: Array, n: int, block: int,
                queries: bool = False) -> tuple[Array, Array]:
  """Tile indices [first, last) of the tiles (of `block` keys, or with
  `queries` of `block` queries) whose every entry `rule` lets through for
  every query (every key) of a0..a1: the tiles inside the intersection of
  the single positions' ranges. Only for a rule whose `intervals()` says
  that each position's visible set is exactly its `key_range` /
  `query_range`, with ends that never decrease with the position; empty
  for any other rule (every tile then takes the masked path)."""
  if not _has_interior(rule):
    return jnp.int32(0), jnp.int32(0)
  span = rule.query_range if queries else rule.key_range
  lo, hi = span(a1, a1, n)[0], span(a0, a0, n)[1]
  first = lax.div(lo + block - 1, block)
  return first, jnp.maximum(lax.div(hi, block), first)


def _is_full(full_range: tuple[Array, Array], tile: Array,
             tile_valid: Array) -> Array:
  """Whether `tile` is an interior tile: inside `full_range` and (int32
  scalar `tile_valid`) with every key valid."""
  return (tile >= full_range[0]) & (tile < full_range[1]) & (tile_valid > 0)


def _has_interior(rule) -> bool:
  """Whether `rule` can have interior tiles (its `intervals()`)."""
  return getattr(rule, 'intervals', lambda: False)()


def _per_tile(rule, full_range: tuple[Array, Array], tile: Array,
              tile_valid: Array, body, *operands):
  """`body(*operands, masked=...)` for one tile: unmasked for an interior
  tile (`_is_full`), masked for the others; for a rule without interior
  tiles, only the masked body (no branch)."""
  if not _has_interior(rule):
    return body(*operands, masked=True)
  return lax.cond(_is_full(full_range, tile, tile_valid),
                  functools.partial(body, masked=False),
                  functools.partial(body, masked=True), *operands)


def _parts(static: _Static, refs: list, nk: int, nm: int) -> list:
  """(rule, keys, part tag, k_ref, v_ref, flags_ref, full_ref) per key
  part, taken from the front of `refs`: the window's, then the extra
  keys'."""
  parts = []
  if static.window is not None:
    parts.append((static.window, nk, WINDOW_PART,
                  *[refs.pop(0) for _ in range(4)]))
  if static.extra is not None:
    parts.append((static.extra, nm, EXTRA_PART,
                  *[refs.pop(0) for _ in range(4)]))
  return parts


def _stream(static: _Static, seed_ref) -> Optional[tuple[Array, ...]]:
  """(seed, global batch row, head) of this program for the keep mask, or
  None without dropout. The seed operand is `[[seed, first batch row]]`
  (the row offset of this batch shard, `mesh.batch_parallel`). Read at the
  kernel's top level: Pallas' interpreter has no program ids inside
  loops."""
  if not static.dropout_rate:
    return None
  return (seed_ref[:, pl.ds(0, 1)], seed_ref[:, pl.ds(1, 1)]
          + pl.program_id(0), pl.program_id(1))


def _dropper(static: _Static, stream, part: int, i: Array, j: Array):
  """`x -> x` with dropped entries zeroed and kept ones scaled by
  1 / (1 - rate), for the tile of queries `i` and keys `j` (index arrays
  that broadcast to it: a query column and a key row, or the transposed
  tile's query row and key column, so that the hash's query round runs
  once per query, not per entry); identity without dropout."""
  if stream is None:
    return lambda x: x
  seed, batch, head = stream
  keep = keep_mask(seed, batch, head, i, j, part, static.heads,
                   static.dropout_rate)
  scale = 1.0 / (1.0 - static.dropout_rate)
  return lambda x: jnp.where(keep, x * scale, 0.0)


class _Rows:
  """Tiles of `t` rows of one (batch, head)'s whole-sequence operands, read
  by a loop over tiles.

  On GPUs and in the interpreter the operands are VMEM / global-memory
  blocks read at the tile's offset. On TPUs (`scratch` given) they stay in
  HBM: each tile is copied into a two-slot VMEM buffer while the previous
  one is computed on, so a kernel's VMEM holds two tiles per operand, not
  the sequence (a 16K sequence of float32 keys and values would not fit the
  16 MiB of a v4 chip).
  """

  def __init__(self, refs: list, scratch: Optional[list], t: int):
    self.refs, self.scratch, self.t = refs, scratch, t
    # Program ids at the kernel's top level: Pallas' interpreter has none
    # inside loops.
    self.batch, self.head = pl.program_id(0), pl.program_id(1)

  def _copies(self, tile: Array, slot: Array) -> list:
    return [pltpu.make_async_copy(
        ref.at[self.batch, self.head, pl.ds(tile * self.t, self.t), :],
        buf.at[slot], sem.at[slot])
            for ref, (buf, sem) in zip(self.refs, self.scratch)]

  def loop(self, first: Array, last: Array, body, carry):
    """`body(tile, tiles, carry)` for tile in [first, last), `tiles` the
    operands' rows of that tile."""
    t = self.t
    if self.scratch is None:
      def direct(tile, carry):
        j0 = pl.multiple_of(tile * t, t)
        return body(tile, [ref[pl.ds(j0, t), :] for ref in self.refs],
                    carry)
      return lax.fori_loop(first, last, direct, carry)

    @pl.when(first < last)
    def _():
      for copy in self._copies(first, lax.rem(first, 2)):
        copy.start()

    def streamed(tile, carry):
      slot = lax.rem(tile, 2)
      for copy in self._copies(tile, slot):
        copy.wait()

      @pl.when(tile + 1 < last)
      def _():
        for copy in self._copies(tile + 1, 1 - slot):
          copy.start()
      return body(tile, [buf[slot] for buf, _ in self.scratch], carry)
    return lax.fori_loop(first, last, streamed, carry)


def _scratch(refs: list, count: int, streamed: bool) -> Optional[list]:
  """The (buffer, semaphores) pairs of `count` streamed operands, taken
  from the end of `refs` (None when not streamed)."""
  if not streamed:
    return None
  pairs = []
  for _ in range(count):
    sem, buf = refs.pop(), refs.pop()
    pairs.append((buf, sem))
  return pairs[::-1]


def _forward_kernel(*refs, static: _Static, nq: int, nk: int, nm: int,
                    streamed: bool = False):
  """One query tile: online softmax over its window and extra key tiles."""
  refs = list(refs)
  seed_ref = refs.pop(0) if static.dropout_rate else None
  q_ref = refs.pop(0)
  parts = _parts(static, refs, nk, nm)
  scratch = _scratch(refs, 2 * len(parts), streamed)
  # With `extra_mass`, the log-sum-exp and the mass share one [t, 2] block:
  # a third output's pointer, live through the loops, made ptxas spill
  # (Transformer-LS's training step on H100 / H200).
  o_ref, stats_ref = refs[:2]
  stream = _stream(static, seed_ref)
  t = static.block
  i0 = pl.program_id(2) * t
  q = q_ref[...]
  i = _iota((t, t), 0, i0)
  # The dropout hash's query column: its query round runs once per row.
  q_ids = _iota((t, 1), 0, i0)
  acc = jnp.zeros(q.shape, jnp.float32)
  m = jnp.full((t, 1), NEG, jnp.float32)
  l = jnp.zeros((t, 1), jnp.float32)
  # The extra keys' part of `l` (the same running maximum), for the mass.
  lx = jnp.zeros((t, 1), jnp.float32)
  for p_index, (rule, n, tag, k_ref, v_ref, valid_ref,
                full_ref) in enumerate(parts):
    full = _full_tiles(rule, i0, i0 + t - 1, n, t)

    def weights(tile, s, m, masked, rule=rule, valid_ref=valid_ref):
      """The tile's weights against the new running maximum, and that
      maximum (base 2: exp(s - max) = exp2(s log2 e - m))."""
      if masked:
        ok = _tile_mask(rule, valid_ref[pl.ds(tile, 1), :], i,
                        _iota((t, t), 1, tile * t))
        s = jnp.where(ok, s, NEG)
      m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True) * LOG2E)
      p = jnp.exp2(s * LOG2E - m_new)
      return (jnp.where(ok, p, 0.0) if masked else p), m_new

    def body(tile, kv, carry, rule=rule, tag=tag, weights=weights,
             full=full, full_ref=full_ref):
      acc, m, l, lx = carry
      k, v = kv
      # Interior tiles skip the mask arithmetic.
      p, m_new = _per_tile(rule, full, tile, full_ref[0, tile], weights,
                           tile, dot(q, k, 1, 1), m)
      scale = jnp.exp2(m - m_new)
      # The normaliser counts every weight; dropout acts on the weights.
      row_sum = jnp.sum(p, axis=1, keepdims=True)
      l = l * scale + row_sum
      if static.extra_mass and tag == EXTRA_PART:  # Zero before (`_parts`).
        lx = lx * scale + row_sum
      dropped = _dropper(static, stream, tag, q_ids,
                         _iota((1, t), 1, tile * t))(p)
      acc = acc * scale + dot(dropped.astype(v.dtype), v, 1, 0)
      return acc, m_new, l, lx
    rows = _Rows([k_ref, v_ref],
                 scratch and scratch[2 * p_index:2 * p_index + 2], t)
    first, last = _tiles(*rule.key_range(i0, i0 + t - 1, n), t)
    acc, m, l, lx = rows.loop(first, last, body, (acc, m, l, lx))
  seen = l > 0
  total = jnp.where(seen, l, 1.0)
  o_ref[...] = (acc / total).astype(o_ref.dtype)
  lse = jnp.where(seen, m * LN2 + jnp.log(total), 0.0)
  stats_ref[...] = (jnp.concatenate([lse, lx / total], axis=1)
                    if static.extra_mass else lse)


def _dq_kernel(*refs, static: _Static, nq: int, nk: int, nm: int,
               streamed: bool = False, fused: bool = False):
  """One query tile's dQ: recompute its weights from the log-sum-exp.
  Also writes the tile's delta (rowsum(dO * O), which the dK / dV kernels
  read).

  With `fused` (a tile-local window, `tile_local`), the window's keys and
  values come as this tile's block, and the kernel also writes their dK and
  dV: the tile's five products (S, dP, dV, dK, dQ), where the split passes
  take seven."""
  refs = list(refs)
  seed_ref = refs.pop(0) if static.dropout_rate else None
  q_ref, do_ref, o_ref, lse_ref = refs[:4]
  refs = refs[4:]
  parts = _parts(static, refs, nk, nm)
  scratch = _scratch(refs, 2 * (len(parts) - fused), streamed)
  if fused:
    dq_ref, delta_ref, dk_ref, dv_ref = refs
  else:
    dq_ref, delta_ref = refs
  stream = _stream(static, seed_ref)
  t = static.block
  query_tile = pl.program_id(2)
  i0 = query_tile * t
  q, do = q_ref[...], do_ref[...]
  delta = jnp.sum(do.astype(jnp.float32) * o_ref[...].astype(jnp.float32),
                  axis=1, keepdims=True)
  delta_ref[...] = delta
  # The log-sum-exp in base 2, once per row.
  lse = lse_ref[...] * LOG2E
  i = _iota((t, t), 0, i0)
  # The dropout hash's query column: its query round runs once per row.
  q_ids = _iota((t, 1), 0, i0)
  dq = jnp.zeros(q.shape, jnp.float32)
  for p_index, (rule, n, tag, k_ref, v_ref, valid_ref,
                full_ref) in enumerate(parts):
    full = _full_tiles(rule, i0, i0 + t - 1, n, t)

    def weights(tile, s, masked, rule=rule, valid_ref=valid_ref):
      p = jnp.exp2(s * LOG2E - lse)
      if not masked:  # An interior tile: no mask arithmetic.
        return p
      ok = _tile_mask(rule, valid_ref[pl.ds(tile, 1), :], i,
                      _iota((t, t), 1, tile * t))
      return jnp.where(ok, p, 0.0)

    def score_grads(tile, k, v, rule=rule, tag=tag, weights=weights,
                    full=full, full_ref=full_ref):
      """Key tile `tile`'s weights P, its dropout and dS = P (dP - delta)."""
      p = _per_tile(rule, full, tile, full_ref[0, tile], weights, tile,
                    dot(q, k, 1, 1))
      drop = _dropper(static, stream, tag, q_ids, _iota((1, t), 1, tile * t))
      return p, drop, p * (drop(dot(do, v, 1, 1)) - delta)

    if fused and p_index == 0:
      # The window's one key tile, the query tile's own: its keys' dK and
      # dV from the same weights (products contracting the query axis).
      k, v = k_ref[...], v_ref[...]
      p, drop, ds = score_grads(query_tile, k, v)
      dq = dq + dot(ds.astype(k.dtype), k, 1, 0)
      dv_ref[...] = dot(drop(p).astype(do.dtype), do, 0, 0).astype(
          dv_ref.dtype)
      dk_ref[...] = dot(ds.astype(q.dtype), q, 0, 0).astype(dk_ref.dtype)
      continue

    def body(tile, kv, dq, score_grads=score_grads):
      k, v = kv
      ds = score_grads(tile, k, v)[2]
      return dq + dot(ds.astype(k.dtype), k, 1, 0)
    at = 2 * (p_index - fused)  # Its streaming buffers (TPU).
    rows = _Rows([k_ref, v_ref], scratch and scratch[at:at + 2], t)
    first, last = _tiles(*rule.key_range(i0, i0 + t - 1, n), t)
    dq = rows.loop(first, last, body, dq)
  dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkv_kernel(*refs, static: _Static, rule, tag: int, nq: int,
                streamed: bool = False, chunks: int = 1,
                chunk_tiles: int = 0):
  """One key tile's dK and dV, over the query tiles that see it; with
  `chunks` > 1, over those of one chunk of `chunk_tiles` query tiles (the
  grid's last axis runs over key tiles x chunks, and the chunks' partial
  sums are added outside).

  The tiles are transposed, keys by queries (`sT = k q^T`), so that the
  per-query log-sum-exp and delta are rows `[1, t]` (one row per query
  tile, read at a sublane offset) and the key tile's flags a column
  `[t, 1]`: no lane-offset reads, no transposes, and every product
  contracts the last axis of its left operand."""
  refs = list(refs)
  seed_ref = refs.pop(0) if static.dropout_rate else None
  scratch = _scratch(refs, 2, streamed)
  (q_ref, do_ref, lse_ref, delta_ref, k_ref, v_ref, valid_ref, full_ref,
   dk_ref, dv_ref) = refs
  stream = _stream(static, seed_ref)
  t = static.block
  x = pl.program_id(2)
  key_tile = lax.div(x, chunks) if chunks > 1 else x
  j0 = key_tile * t
  k, v = k_ref[...], v_ref[...]
  valid = valid_ref[...]
  # The query tiles that see every key of this tile, if all are valid.
  full = _full_tiles(rule, j0, j0 + t - 1, nq, t, queries=True)
  key_tile_valid = full_ref[0, key_tile]
  j = _iota((t, t), 0, j0)
  # The dropout hash's key column: its key round alone is per entry.
  k_ids = _iota((t, 1), 0, j0)

  def weights(tile, s, masked):
    p = jnp.exp2(s * LOG2E - lse_ref[pl.ds(tile, 1), :] * LOG2E)
    if not masked:  # An interior tile: no mask arithmetic.
      return p
    ok = _tile_mask(rule, valid, _iota((t, t), 1, tile * t), j)
    return jnp.where(ok, p, 0.0)

  def body(tile, q_do, carry):
    dk, dv = carry
    q, do = q_do
    p = _per_tile(rule, full, tile, key_tile_valid, weights, tile,
                  dot(k, q, 1, 1))
    drop = _dropper(static, stream, tag, _iota((1, t), 1, tile * t),
                    k_ids)
    dv = dv + dot(drop(p).astype(do.dtype), do, 1, 0)
    ds = p * (drop(dot(v, do, 1, 1)) - delta_ref[pl.ds(tile, 1), :])
    dk = dk + dot(ds.astype(q.dtype), q, 1, 0)
    return dk, dv

  first, last = _tiles(*rule.query_range(j0, j0 + t - 1, nq), t)
  if chunks > 1:
    chunk = lax.rem(x, chunks)
    first = jnp.maximum(first, chunk * chunk_tiles)
    last = jnp.maximum(jnp.minimum(last, (chunk + 1) * chunk_tiles), first)
  rows = _Rows([q_ref, do_ref], scratch, t)
  dk, dv = rows.loop(first, last, body,
                     (jnp.zeros(k.shape, jnp.float32),
                      jnp.zeros(v.shape, jnp.float32)))
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# -- pallas_call plumbing ----------------------------------------------------


# Triton keeps a kernel's [tile, width] operand tiles and accumulators, and
# its [tile, tile] scores, in registers. The deviceless compile sweep
# (`python -m lra_msmra_tools.kernels`, sm_90a: H100 / H200, failing on any
# spill) found the largest tiles with which no flash kernel spills, dropout
# and every key rule included: [64, 128] in 2-byte dtypes with 8 warps; in
# float32 [32, 32] and [16, 64] ([64, 64] spills with 4 warps, [32, 128]
# with 4 or 8 in long_short's dQ kernel, [32, 64] in Combiner-Axial's dK/dV
# kernel) and [16, 128] (MIN_BLOCK). TILE_ELEMENTS holds those limits per
# element size; the tile they give holds on every platform, since it fixes
# the padding and the layout of the key flags.
TILE_ELEMENTS = {1: 8192, 2: 8192, 4: 1024}
# Tiles of this many elements and more run on 8 warps, smaller ones on 4,
# and those under NARROW_TILE_ELEMENTS on 2: the fitted 16-row tiles of a
# narrow window ([16, 32] in float32 spilled in Transformer-LS's dK / dV
# kernel with 4 warps on an H200; with 2 it compiles clean).
WIDE_TILE_ELEMENTS = 8192
NARROW_TILE_ELEMENTS = 1024
# Triton's software-pipelining stages where neither the call nor the tile
# table sets them.
DEFAULT_STAGES = 2

# The tile table: measured choices that replace the rules above, per padded
# head width and element size (`max_tile`: the largest tile) and per tile
# and width (`launch`: Triton's warps and stages). The GPU tile sweep
# (`python -m lra_msmra_tools.benchmark.tile_sweep`, run by
# launch/gpu_benchmark.sh) writes it from timings beside cuDNN's; without
# the file, or without an entry, the rules hold. The compile checks
# (`python -m lra_msmra_tools.kernels`, tests/kernels/test_compile.py)
# compile the kernels with the table as it is read here.
TILE_TABLE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               'tile_table.json')


def load_tile_table(path: str = TILE_TABLE_FILE) -> dict[str, Any]:
  """The tile table at `path` ({'max_tile': {}, 'launch': {}} without
  one); a malformed file is refused in one line."""
  table = {'max_tile': {}, 'launch': {}}
  if not os.path.exists(path):
    return table
  with open(path) as f:
    loaded = json.load(f)
  for section in table:
    for key, entry in loaded.get(section, {}).items():
      if section == 'max_tile' and not (
          isinstance(entry, int) and entry >= MIN_BLOCK
          and entry & (entry - 1) == 0):
        raise ValueError(f'{path}: max_tile[{key!r}] = {entry!r}; give a '
                         f'power of two >= {MIN_BLOCK}, or delete the file.')
      if section == 'launch' and not (
          isinstance(entry, dict) and set(entry) <= {'warps', 'stages'}):
        raise ValueError(f'{path}: launch[{key!r}] = {entry!r}; give '
                         '{"warps": W, "stages": S}, or delete the file.')
      table[section][key] = entry
  return table


TILE_TABLE = load_tile_table()


def table_key(width: int, dtype: Any) -> str:
  """The tile table's `max_tile` key: padded head width and element
  bytes, e.g. '64/2'."""
  return f'{width}/{jnp.dtype(dtype).itemsize}'


def launch_key(tile: int, width: int) -> str:
  """The tile table's `launch` key, e.g. '64x128'."""
  return f'{tile}x{width}'


def max_block(width: int, dtype: Any, block: int = DEFAULT_BLOCK) -> int:
  """The largest tile of at most `block` rows for [tile, width] tiles of
  `dtype`: the tile table's (`TILE_TABLE`), or else the largest (halving
  `block`) within TILE_ELEMENTS (at least MIN_BLOCK)."""
  measured = TILE_TABLE['max_tile'].get(table_key(width, dtype))
  if measured is not None:
    return max(MIN_BLOCK, min(block, measured))
  limit = TILE_ELEMENTS.get(jnp.dtype(dtype).itemsize, min(
      TILE_ELEMENTS.values()))
  while block > MIN_BLOCK and block * width > limit:
    block //= 2
  return block


def triton_warps(block: int, width: int) -> int:
  """Warps of a Triton kernel whose tiles are `block` rows by `width`
  columns (the padded head dimension): the tile table's, or else 8 for
  tiles of WIDE_TILE_ELEMENTS and more, 2 for those under
  NARROW_TILE_ELEMENTS, 4 between."""
  entry = TILE_TABLE['launch'].get(launch_key(block, width), {})
  if 'warps' in entry:
    return entry['warps']
  if block * width >= WIDE_TILE_ELEMENTS:
    return 8
  return 4 if block * width >= NARROW_TILE_ELEMENTS else 2


def triton_stages(block: int, width: int) -> int:
  """Triton's pipelining stages for such a kernel: the tile table's, or
  DEFAULT_STAGES."""
  entry = TILE_TABLE['launch'].get(launch_key(block, width), {})
  return entry.get('stages', DEFAULT_STAGES)


# Mosaic keeps every block of a call in VMEM, twice (double buffering) for
# blocks whose index changes along the grid. A call's scoped VMEM limit is
# its blocks plus room for the body's tiles, at least Mosaic's default and
# at most the largest limit libtpu takes for every TPU generation this
# project targets (v4's, whose VMEM itself holds 16 MiB; v5e, v5p and v6e
# take up to 128 MiB). Whole-sequence operands stay in HBM (`_Rows`), so
# the blocks are a few tiles at any sequence length.
TPU_DEFAULT_VMEM = 16 * 2**20
TPU_MAX_VMEM = 32 * 2**20


def vmem_bytes(shape: tuple[int, ...], dtype: Any, buffers: int = 2) -> int:
  """VMEM of one block on a TPU: its last two axes padded to the (sublane,
  128-lane) tiling of its dtype."""
  itemsize = jnp.dtype(dtype).itemsize
  sublanes = 8 * max(1, 4 // itemsize)
  rows = shape[-2] if len(shape) > 1 else 1
  lead = 1
  for size in shape[:-2]:
    lead *= size
  padded = (lead * (-(-rows // sublanes) * sublanes)
            * (-(-shape[-1] // 128) * 128))
  return buffers * padded * itemsize


class Launch(NamedTuple):
  """Per-platform settings of one `pallas_call`.

  Attributes:
    block_bytes: VMEM of its blocks on a TPU (`vmem_bytes`); sets the
      call's scoped VMEM limit.
    tile: the rows of its tiles; with `width`, Triton's warps.
    width: the padded head dimension of its tiles.
    semantics: per grid axis, 'parallel' (programs independent: a
      megacore TPU splits them over its cores) or 'arbitrary'.
    warps: Triton's warps, where `triton_warps` does not fit the kernel.
    stages: Triton's software-pipelining stages of the kernel's loops
      (each stage buffers the loop's loads in shared memory once more),
      where `triton_stages` does not fit the kernel.
  """
  block_bytes: int = 0
  tile: int = DEFAULT_BLOCK
  width: int = 64
  semantics: tuple[str, ...] = ('parallel',) * 3
  warps: Optional[int] = None
  stages: Optional[int] = None

  @classmethod
  def of(cls, specs, arrays, tile: int, width: int,
         semantics: Optional[tuple[str, ...]] = None,
         warps: Optional[int] = None,
         stages: Optional[int] = None) -> 'Launch':
    """The launch of a call whose blocks are `specs` of `arrays` (inputs
    and outputs alike; arrays may be ShapeDtypeStructs), one semantics per
    grid axis ('parallel' on every axis by default: the grid's length is
    that of `semantics`)."""
    total = 0
    for spec, array in zip(specs, arrays):
      shape = tuple(size for size in spec.block_shape if size is not None)
      total += vmem_bytes(shape, array.dtype)
    return cls(total, tile, width,
               semantics if semantics is not None else cls.semantics, warps,
               stages)

  def tpu(self):
    # Room for the body's [t, t] float32 tiles and the accumulators.
    scratch = 16 * self.tile * max(self.tile, 128) * 4
    limit = min(max(TPU_DEFAULT_VMEM, self.block_bytes + scratch),
                TPU_MAX_VMEM)
    return pltpu.CompilerParams(dimension_semantics=self.semantics,
                                vmem_limit_bytes=int(limit))

  def triton(self):
    return pltriton.CompilerParams(
        num_warps=self.warps or triton_warps(self.tile, self.width),
        num_stages=self.stages or triton_stages(self.tile, self.width))


# On the CPU, run the kernels in the form they take on TPUs (their HBM
# streaming and semaphores), in Pallas' TPU interpreter, instead of the
# plain form (tests set it to check that form's numerics).
INTERPRET_TPU_FORM = False


def _relaid(fn, relayout):
  """`fn` (a call in the 'bhnd' layout) as a function of 'bnhd' operands:
  the flagged arguments and outputs (`relayout` = (argument flags, output
  flags, fold)) swap their sequence and head axes around it (with a
  `fold`, `[rows, n, fold * heads, d]` <-> `[rows * fold, heads, n, d]`);
  `fn` itself without `relayout`."""
  if relayout is None:
    return fn
  arg_flags, out_flags, fold = relayout

  def swap(x):  # [rows, n, fold * heads, d] -> [rows * fold, heads, n, d]
    rows, n, heads, d = x.shape
    x = x.reshape(rows, n, fold, heads // fold, d)
    return jnp.transpose(x, (0, 2, 3, 1, 4)).reshape(
        rows * fold, heads // fold, n, d)

  def unswap(x):  # The inverse.
    batch, heads, n, d = x.shape
    x = x.reshape(batch // fold, fold, heads, n, d)
    return jnp.transpose(x, (0, 3, 1, 2, 4)).reshape(
        batch // fold, n, fold * heads, d)

  def run(*args):
    outs = fn(*[swap(a) if f else a for a, f in zip(args, arg_flags)])
    single = not isinstance(outs, (list, tuple))
    swapped = [unswap(o) if f else o
               for o, f in zip([outs] if single else outs, out_flags)]
    return swapped[0] if single else type(outs)(swapped)
  return run


def on_every_platform(call, launch: Launch = Launch(), relayout=None):
  """`call(compiler_params, interpret)` as one program for every backend:
  Triton on NVIDIA and AMD GPUs, Mosaic on TPUs, Pallas' interpreter on the
  CPU, picked when the program is lowered (`lax.platform_dependent`). Other
  kernel modules dispatch their own `pallas_call`s through it; `launch`
  holds the settings each compiler gets.

  With `relayout` (flash's 'bnhd' calls), the TPU form gets its flagged
  operands in 'bhnd' (`_relaid`): Mosaic's blocks need the sequence and the
  head width as their last two axes, where Triton and the interpreter read
  the model's layout through the BlockSpecs."""
  def run(*args):
    tpu = lambda interpret: _relaid(call(launch.tpu(), interpret), relayout)
    return lax.platform_dependent(
        *args,
        cpu=lambda *a: (tpu(pltpu.InterpretParams())(*a)
                        if INTERPRET_TPU_FORM else call(None, True)(*a)),
        cuda=lambda *a: call(launch.triton(), False)(*a),
        rocm=lambda *a: call(launch.triton(), False)(*a),
        tpu=lambda *a: tpu(False)(*a))
  return run


def _folded(fold: int, heads: int):
  """(array row, heads-axis index) of the call's (batch row, head) under a
  'bnhd' `fold` (`_Static`)."""
  if fold == 1:
    return lambda b, h: (b, h)
  return lambda b, h: (lax.div(b, fold), lax.rem(b, fold) * heads + h)


def _tile_spec(t: int, d: int, chunks: int = 1, layout: str = 'bhnd',
               fold: int = 1, heads: int = 1):
  """A tile of `t` rows of one (batch, head): tile x of the grid's last
  axis, or x // chunks where it runs over tiles x chunks."""
  tile = (lambda x: x) if chunks == 1 else (lambda x: lax.div(x, chunks))
  if layout == 'bnhd':
    at = _folded(fold, heads)
    return pl.BlockSpec((None, t, None, d),
                        lambda b, h, x: (at(b, h)[0], tile(x), at(b, h)[1],
                                         0))
  return pl.BlockSpec((None, None, t, d), lambda b, h, x: (b, h, tile(x), 0))


def _whole_spec(n: int, d: int, layout: str = 'bhnd', fold: int = 1,
                heads: int = 1):
  """All `n` rows of one (batch, head)."""
  if layout == 'bnhd':
    at = _folded(fold, heads)
    return pl.BlockSpec((None, n, None, d),
                        lambda b, h, x: (at(b, h)[0], 0, at(b, h)[1], 0))
  return pl.BlockSpec((None, None, n, d), lambda b, h, x: (b, h, 0, 0))


def _flags_spec(tiles: int, t: int):
  """One batch row's flags, a row `[1, t]` per key tile (arrays `[batch,
  tiles, t]`): a kernel reads tile j's at a sublane offset, which Mosaic
  accepts at any index, where a lane offset must be a multiple of 128."""
  return pl.BlockSpec((None, tiles, t), lambda b, h, x: (b, 0, 0))


def valid_tiles(flags: Array) -> Array:
  """int32 `[batch, 1, tiles]`: 1 where every key of the tile is valid,
  from the flag rows `[batch, tiles, t]` (`_flags`)."""
  return (jnp.min(flags, axis=-1) > 0).astype(jnp.int32)[:, None, :]


def _valid_tiles_spec(tiles: int, params):
  """One batch row of `valid_tiles` (`[1, tiles]`: a block whose last two
  axes are the array's, as Mosaic requires), read one scalar at a time: in
  SMEM on TPUs."""
  space = {'memory_space': pltpu.SMEM} if _is_tpu(params) else {}
  return pl.BlockSpec((None, 1, tiles), lambda b, h, x: (b, 0, 0), **space)


def _rows_spec(tiles: int, t: int):
  """One (batch, head)'s per-query statistics, a row `[1, t]` per query
  tile (arrays `[batch, heads, tiles, t]`)."""
  return pl.BlockSpec((None, None, tiles, t), lambda b, h, x: (b, h, 0, 0))


def _column_spec(t: int, chunks: int = 1):
  """One key tile's flags as a column `[t, 1]` (arrays `[batch, n, 1]`)."""
  if chunks == 1:
    return pl.BlockSpec((None, t, 1), lambda b, h, x: (b, x, 0))
  return pl.BlockSpec((None, t, 1),
                      lambda b, h, x: (b, lax.div(x, chunks), 0))


def _is_tpu(params) -> bool:
  return isinstance(params, pltpu.CompilerParams)


class _Whole(NamedTuple):
  """Whole-sequence operands of a call: their specs in each form, and on
  TPUs their streaming buffers (`_Rows`)."""
  direct: list  # BlockSpecs of VMEM / global-memory blocks.
  hbm: list  # BlockSpecs leaving them in HBM (TPU).
  scratch: list  # Per operand, a two-tile VMEM buffer and its semaphores.
  tpu_bytes: int  # VMEM of those buffers.

  @classmethod
  def of(cls, arrays, t: int, layout: str = 'bhnd', fold: int = 1,
         heads: int = 1) -> '_Whole':
    direct, scratch, nbytes = [], [], 0
    for x in arrays:
      direct.append(_whole_spec(_dims(x, layout, fold)[2], x.shape[3],
                                layout, fold, heads))
      scratch += [pltpu.VMEM((2, t, x.shape[3]), x.dtype),
                  pltpu.SemaphoreType.DMA((2,))]
      nbytes += vmem_bytes((2, t, x.shape[3]), x.dtype, buffers=1)
    return cls(direct, [pl.BlockSpec(memory_space=pl.ANY)] * len(arrays),
               scratch, nbytes)

  def specs(self, params) -> list:
    return self.hbm if _is_tpu(params) else self.direct

  def scratch_shapes(self, params) -> tuple:
    return tuple(self.scratch) if _is_tpu(params) else ()


def _key_args(static: _Static, window_args, extra_args,
              tiled_window: bool = False):
  """The (k, v, flags, valid tiles) operands, window first; the keys and
  values as `_Whole` operands (but the window's with `tiled_window`, which
  a call reads as tiles: `_key_specs`), and the flags' specs and VMEM."""
  args, arrays, flag_specs, nbytes = [], [], [], 0
  for part, group in ((static.window, window_args),
                      (static.extra, extra_args)):
    if part is None:
      continue
    k, v, flags = group
    args += [k, v, flags, valid_tiles(flags)]
    if not (tiled_window and part is static.window):
      arrays += [k, v]
    flag_specs.append(_flags_spec(*flags.shape[1:]))
    nbytes += vmem_bytes(flags.shape[1:], flags.dtype)
  return (args, _Whole.of(arrays, static.block, static.layout, static.fold,
                          static.heads), flag_specs,
          nbytes)


def _key_specs(whole: _Whole, flag_specs: list, params,
               window_tiles: Optional[list] = None) -> list:
  """The specs of `_key_args`'s operands, in their order; with
  `window_tiles` (`_key_args`'s `tiled_window`), those of the window's keys
  and values."""
  kv = list(whole.specs(params))
  if window_tiles is not None:
    kv = list(window_tiles) + kv
  specs = []
  for index, flags in enumerate(flag_specs):
    specs += [kv[2 * index], kv[2 * index + 1], flags,
              _valid_tiles_spec(flags.block_shape[1], params)]
  return specs


def _sizes(static: _Static, q, window_args, extra_args):
  n = lambda x: _dims(x, static.layout, static.fold)[2]
  nk = n(window_args[0]) if window_args is not None else 0
  nm = n(extra_args[0]) if extra_args is not None else 0
  return n(q), nk, nm


def _value_dim(window_args, extra_args) -> int:
  return (window_args if window_args is not None else extra_args)[1].shape[3]


def _key_flags(static: _Static) -> list:
  """Which of `_key_args`'s operands are sequence operands (`_relaid`)."""
  parts = (static.window is not None) + (static.extra is not None)
  return [True, True, False, False] * parts


def _relayout(static: _Static, args: list, outs: list):
  """`on_every_platform`'s `relayout` of a call in `static.layout`."""
  if static.layout != 'bnhd':
    return None
  return (args, outs, getattr(static, 'fold', 1))


def _seed_args(static: _Static, seed):
  """The dropout seed and first batch row as a `[1, 2]` operand, or
  nothing."""
  if not static.dropout_rate:
    return [], []
  return [seed], [pl.BlockSpec((1, 2), lambda b, h, x: (0, 0))]


def _layout_of(static: _Static, params) -> str:
  """The layout a call's kernel reads: the static one, but 'bhnd' on TPUs
  (`_relaid`)."""
  return 'bhnd' if _is_tpu(params) else static.layout


def _specs_of(static: _Static, params):
  """`_tile_spec` and `_seq_shape` for the layout a call's kernel reads
  (`_layout_of`), with its fold (none in the TPU form, which `_relaid`
  unfolds)."""
  lay = _layout_of(static, params)
  fold = static.fold if lay == 'bnhd' else 1
  return (functools.partial(_tile_spec, layout=lay, fold=fold,
                            heads=static.heads),
          functools.partial(_seq_shape, layout=lay, fold=fold))


def _forward(static: _Static, seed, q, window_args, extra_args):
  batch, heads, nq, d = _dims(q, static.layout, static.fold)
  _, nk, nm = _sizes(static, q, window_args, extra_args)
  v_dim = _value_dim(window_args, extra_args)
  t = static.block
  args, whole, flag_specs, flag_bytes = _key_args(static, window_args,
                                                  extra_args)
  seed_args, seed_specs = _seed_args(static, seed)
  stats = 2 if static.extra_mass else 1
  launch = Launch(
      whole.tpu_bytes + flag_bytes + vmem_bytes((t, d), q.dtype)
      + vmem_bytes((t, v_dim), q.dtype)
      + vmem_bytes((t, stats), jnp.float32), t, max(d, v_dim))

  def call(params, interpret):
    kernel = functools.partial(_forward_kernel, static=static, nq=nq, nk=nk,
                               nm=nm, streamed=_is_tpu(params))
    seq_spec, seq_shape = _specs_of(static, params)
    return pl.pallas_call(
        kernel, grid=(batch, heads, nq // t),
        in_specs=seed_specs + [seq_spec(t, d)]
        + _key_specs(whole, flag_specs, params),
        out_specs=[seq_spec(t, v_dim), _tile_spec(t, stats)],
        out_shape=[
            jax.ShapeDtypeStruct(seq_shape(batch, heads, nq, v_dim),
                                 q.dtype),
            jax.ShapeDtypeStruct((batch, heads, nq, stats), jnp.float32)],
        scratch_shapes=whole.scratch_shapes(params),
        compiler_params=params, interpret=interpret,
        name='flash_window_forward')
  relayout = _relayout(
      static, [False] * len(seed_args) + [True] + _key_flags(static),
      [True, False])
  out, lse = on_every_platform(call, launch, relayout)(*seed_args, q, *args)
  # (output, log-sum-exp[, extra mass]).
  return (out, lse) if stats == 1 else (out, lse[..., :1], lse[..., 1:])


def _backward(static: _Static, seed, q, window_args, extra_args, out, lse,
              d_out):
  batch, heads, nq, d = _dims(q, static.layout, static.fold)
  _, nk, nm = _sizes(static, q, window_args, extra_args)
  v_dim = _value_dim(window_args, extra_args)
  t = static.block
  fused = (FUSED_BACKWARD and tile_local(static.window, nq, nk, t)
           and t * max(d, v_dim) <= FUSED_TILE_ELEMENTS[q.dtype.itemsize])
  args, whole, flag_specs, flag_bytes = _key_args(
      static, window_args, extra_args, tiled_window=fused)
  seed_args, seed_specs = _seed_args(static, seed)
  no_seed = [False] * len(seed_args)
  # With `fused`, the window's key and value tiles and their gradients.
  own_keys = [] if not fused else [
      (window_args[0].shape[3], window_args[0].dtype),
      (window_args[1].shape[3], window_args[1].dtype)]
  launch = Launch(
      whole.tpu_bytes + flag_bytes + 2 * vmem_bytes((t, d), q.dtype)
      + 2 * vmem_bytes((t, v_dim), q.dtype)
      + 2 * vmem_bytes((t, 1), jnp.float32)
      + sum(2 * vmem_bytes((t, w), dtype) for w, dtype in own_keys),
      t, max(d, v_dim))

  def dq_call(params, interpret):
    kernel = functools.partial(_dq_kernel, static=static, nq=nq, nk=nk,
                               nm=nm, streamed=_is_tpu(params), fused=fused)
    seq_spec, seq_shape = _specs_of(static, params)
    tiles = [seq_spec(t, w) for w, _ in own_keys]
    return pl.pallas_call(
        kernel, grid=(batch, heads, nq // t),
        in_specs=seed_specs + [seq_spec(t, d), seq_spec(t, v_dim),
                               seq_spec(t, v_dim), _tile_spec(t, 1)]
        + _key_specs(whole, flag_specs, params, tiles if fused else None),
        out_specs=[seq_spec(t, d), _tile_spec(t, 1)] + tiles,
        out_shape=[jax.ShapeDtypeStruct(
            seq_shape(batch, heads, nq, d), q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, nq, 1), jnp.float32)]
        + [jax.ShapeDtypeStruct(seq_shape(batch, heads, nq, w), dtype)
           for w, dtype in own_keys],
        scratch_shapes=whole.scratch_shapes(params),
        compiler_params=params, interpret=interpret,
        name='flash_window_fused_bwd' if fused else 'flash_window_dq')
  relayout = _relayout(
      static, no_seed + [True, True, True, False] + _key_flags(static),
      [True, False] + [True] * len(own_keys))
  d_q, delta, *own = on_every_platform(dq_call, launch, relayout)(
      *seed_args, q, d_out, out, lse, *args)

  # The dK / dV kernels read the statistics of each query tile as a row.
  rows = lambda x: x.reshape(batch, heads, nq // t, t)
  lse_rows, delta_rows = rows(lse), rows(delta)
  queries = _Whole.of([q, d_out], t, static.layout, static.fold, heads)
  grads = []
  for rule, tag, group in ((static.window, WINDOW_PART, window_args),
                           (static.extra, EXTRA_PART, extra_args)):
    if rule is None:
      grads.append(None)
      continue
    if fused and tag == WINDOW_PART:
      grads.append(tuple(own))
      continue
    k, v, flags = group
    n = _dims(k, static.layout, static.fold)[2]
    columns = flags.reshape(batch, n, 1)
    launch = Launch(
        queries.tpu_bytes + 2 * vmem_bytes((nq // t, t), jnp.float32)
        + 2 * vmem_bytes((t, k.shape[3]), k.dtype)
        + 2 * vmem_bytes((t, v.shape[3]), v.dtype)
        + vmem_bytes((t, 1), jnp.int32), t, max(d, v_dim),
        warps=_wide_float32_warps(q.dtype, t, max(d, v_dim)))

    chunks, chunk_tiles = query_chunks(batch * heads * (n // t), nq // t)

    def dkv_call(params, interpret, k=k, v=v, n=n, rule=rule, tag=tag,
                 chunks=chunks, chunk_tiles=chunk_tiles):
      kernel = functools.partial(_dkv_kernel, static=static, rule=rule,
                                 tag=tag, nq=nq, streamed=_is_tpu(params),
                                 chunks=chunks, chunk_tiles=chunk_tiles)
      seq_spec, seq_shape = _specs_of(static, params)
      # Partial sums per chunk in float32, added below.
      out = lambda a: jax.ShapeDtypeStruct(
          seq_shape(batch, heads, n * chunks, a.shape[3]),
          a.dtype if chunks == 1 else jnp.float32)
      return pl.pallas_call(
          kernel, grid=(batch, heads, (n // t) * chunks),
          in_specs=seed_specs + queries.specs(params) + [
              _rows_spec(nq // t, t), _rows_spec(nq // t, t),
              seq_spec(t, k.shape[3], chunks), seq_spec(t, v.shape[3], chunks),
              _column_spec(t, chunks), _valid_tiles_spec(n // t, params)],
          out_specs=[seq_spec(t, k.shape[3]), seq_spec(t, v.shape[3])],
          out_shape=[out(k), out(v)],
          scratch_shapes=queries.scratch_shapes(params),
          compiler_params=params, interpret=interpret,
          name='flash_window_dkv')
    relayout = _relayout(
        static, no_seed + [True, True, False, False, True, True, False,
                           False], [True, True])
    d_k, d_v = on_every_platform(dkv_call, launch, relayout)(
        *seed_args, q, d_out, lse_rows, delta_rows, k, v, columns,
        valid_tiles(flags))
    if chunks > 1:
      d_k, d_v = (_chunk_total(g, a, chunks, t, static.layout)
                  for g, a in ((d_k, k), (d_v, v)))
    grads.append((d_k, d_v))
  return d_q, grads[0], grads[1]


def _chunk_total(g: Array, a: Array, chunks: int, t: int, layout: str
                 ) -> Array:
  """The float32 partial sums `g` (per key tile, `chunks` blocks of `t`
  rows) added up, as `a` (its shape and dtype; 'bnhd' with any fold)."""
  if layout == 'bhnd':
    batch, heads, n, d = a.shape
    g = g.reshape(batch, heads, n // t, chunks, t, d).sum(3)
  else:
    rows, n, heads, d = a.shape
    g = g.reshape(rows, n // t, chunks, t, heads, d).sum(2)
  return g.reshape(a.shape).astype(a.dtype)


def _wide_float32_warps(dtype, t: int, width: int) -> Optional[int]:
  """Warps of a dK / dV kernel: 8 for float32 tiles of WIDE_FLOAT32_TILE
  elements and more (at a head dim of 256, Combiner's dK / dV kernels
  spilled 20 to 48 bytes at 255 registers on an H200 with 4), else
  `triton_warps`'."""
  if jnp.dtype(dtype).itemsize == 4 and t * width >= WIDE_FLOAT32_TILE:
    return 8
  return None


WIDE_FLOAT32_TILE = 4096


# The backward pass of a call whose window is tile-local (`tile_local`)
# fuses the window's dK / dV into the dQ kernel (tests switch it off to
# compare with the split passes).
FUSED_BACKWARD = True
# The largest [rows, head dim] tile the fused kernel takes, per itemsize:
# it holds the key tile, the value tile and their gradients beside the dQ
# kernel's, and at a float32 head dim of 256 (16 x 256 tiles) it spilled
# 3 KB on an H200, where the split passes do not spill.
FUSED_TILE_ELEMENTS = {1: 8192, 2: 8192, 4: 2048}


def tile_local(window, nq: int, nk: int, t: int) -> bool:
  """Whether every query tile of a call sees window keys of its own tile
  only (and so every key tile is seen by its own query tile only): the
  queries and keys are one tile, or the window is segments without margins
  that tile `t` holds whole. The backward pass then computes the window's
  dK / dV in the dQ kernel (`_dq_kernel`'s `fused`)."""
  if window is None or nq != nk:
    return False
  if nq == t:
    return True
  return (isinstance(window, Window) and window.kind == 'segment'
          and window.left == 0 and window.right == 0
          and t % window.size == 0)


def query_chunks(programs: int, query_tiles: int) -> tuple[int, int]:
  """(chunks, query tiles per chunk) that split a dK / dV grid of
  `programs` key-tile programs over the `query_tiles` it loops over, so
  that the grid has at least MIN_PROGRAMS programs: (1, query_tiles) when
  it has them already."""
  if programs >= MIN_PROGRAMS or query_tiles <= 1:
    return 1, query_tiles
  wanted = min(query_tiles, -(-MIN_PROGRAMS // programs))
  chunk_tiles = query_tiles // wanted
  return -(-query_tiles // chunk_tiles), chunk_tiles


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(static: _Static, seed, q, window_args, extra_args):
  """The output, and with `static.extra_mass` (output, extra mass)."""
  return _flash_fwd(static, seed, q, window_args, extra_args)[0]


def _flash_fwd(static, seed, q, window_args, extra_args):
  out, lse, *mass = _forward(static, seed, q, window_args, extra_args)
  primal = (out, mass[0]) if static.extra_mass else out
  return primal, (seed, q, window_args, extra_args, out, lse)


def _flash_bwd(static, residuals, cotangent):
  seed, q, window_args, extra_args, out, lse = residuals
  # The extra mass is a diagnostic without a gradient.
  d_out = cotangent[0] if static.extra_mass else cotangent
  d_q, d_window, d_extra = _backward(static, seed, q, window_args,
                                     extra_args, out, lse, d_out)
  # The validity flags are integers: no cotangent.
  if d_window is not None:
    d_window = (*d_window, None)
  if d_extra is not None:
    d_extra = (*d_extra, None)
  return None, d_q, d_window, d_extra


_flash.defvjp(_flash_fwd, _flash_bwd)


# -- the public function -----------------------------------------------------


def layer_dropout(module, deterministic: bool) -> dict:
  """The `dropout_rate` / `dropout_seed` arguments for an attention layer:
  its `dropout_rate` and a seed drawn from its 'dropout' RNG stream, or no
  dropout when deterministic or the rate is 0."""
  if deterministic or not module.dropout_rate:
    return {'dropout_rate': 0.0, 'dropout_seed': None}
  return {'dropout_rate': float(module.dropout_rate),
          'dropout_seed': jax.random.bits(module.make_rng('dropout'), (),
                                          jnp.uint32)}


def tile_size(length: int, block: int = DEFAULT_BLOCK) -> int:
  """The tile for a sequence of `length`: `block`, or the next power of two
  of a shorter sequence (at least MIN_BLOCK)."""
  size = MIN_BLOCK
  while size < min(length, block):
    size *= 2
  return size


def _pad(x: Array, axis: int, multiple: int, value=0) -> Array:
  extra = (-x.shape[axis]) % multiple
  if not extra:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def _flags(valid: Array, multiple: int) -> Array:
  """bool `[batch, n]` -> int32 `[batch, n padded / multiple, multiple]`,
  a row per key tile (padding False)."""
  flags = _pad(valid.astype(jnp.int32), 1, multiple)
  return flags.reshape(flags.shape[0], -1, multiple)


# A call's tile is the largest whose visited tiles hold at least this share
# of scores that a query may use (`fitted_block`).
USEFUL_SHARE = 0.5
# Programs a grid should have at least: two per SM of an H100 (132 SMs),
# so that no SM idles while another runs a second program.
MIN_PROGRAMS = 2 * 132


def _visible_counts(rule, i: Array, n: int) -> Array:
  """Keys among [0, n) that each query of `i` sees under `rule` (a Window,
  an Extra, or a rule with its own `visible_counts`), every key valid."""
  if hasattr(rule, 'visible_counts'):
    return rule.visible_counts(i, n)
  if isinstance(rule, Extra) and rule.kind == 'other_group':
    g = lax.div(i, rule.query_group)
    own = (jnp.minimum((g + 1) * rule.key_group, n)
           - jnp.minimum(g * rule.key_group, n))
    return n - own
  lo, hi = rule.key_range(i, i, n)
  return jnp.broadcast_to(jnp.maximum(hi - lo, 0), i.shape)


def useful_share(window: Optional[Window], extra: Optional[Extra], t: int,
                 nq: int, nk: int, nm: int) -> float:
  """Scores that queries may use over the scores that the visited tiles of
  `t` queries by `t` keys compute, for `nq` queries, `nk` sequence keys
  under `window` and `nm` extra keys under `extra` (each None when absent),
  every key valid. Evaluated when the call is traced."""
  pad = lambda n: -(-n // t) * t
  used = computed = 0
  with jax.ensure_compile_time_eval():
    starts = jnp.arange(0, pad(nq), t, dtype=jnp.int32)
    queries = jnp.arange(nq, dtype=jnp.int32)
    for rule, n in ((window, nk), (extra, nm)):
      if rule is None:
        continue
      lo, hi = rule.key_range(starts, starts + t - 1, pad(n))
      first, last = _tiles(lo, hi, t)
      tiles = jnp.broadcast_to(last - first, starts.shape)
      computed += int(jnp.sum(tiles)) * t * t
      used += int(jnp.sum(_visible_counts(rule, queries, n)))
  return used / computed if computed else 1.0


def fitted_block(window: Optional[Window], extra: Optional[Extra],
                 largest: int, nq: int, nk: int, nm: int,
                 rows: int = MIN_PROGRAMS) -> int:
  """The tile of a call, a power of two from MIN_BLOCK to `largest`.

  Among the tiles whose `useful_share` reaches USEFUL_SHARE, the largest
  whose grid (`rows` = batch x heads, times the query tiles) has
  MIN_PROGRAMS programs, else the one with the most programs; without
  such a tile, the one with the highest share (the larger of a tie). A
  narrow window (CST's slices of 8, a Transformer-LS segment) gets small
  tiles, a full one the largest that fills the GPU."""
  best, best_share = largest, -1.0
  useful = []
  t = largest
  while t >= MIN_BLOCK:
    share = useful_share(window, extra, t, nq, nk, nm)
    if share >= USEFUL_SHARE:
      useful.append(t)
      if rows * -(-nq // t) >= MIN_PROGRAMS:
        return t
    if share > best_share + 1e-9:
      best, best_share = t, share
    t //= 2
  return useful[-1] if useful else best


def call_tile(nq: int, nk: int = 0, nm: int = 0, *,
              rules: Optional[tuple[Optional[Window], Optional[Extra]]],
              rows: int, width: int, dtype: Any,
              block: int = DEFAULT_BLOCK) -> int:
  """The tile of a `flash_attention` call of `nq` queries, `nk` sequence
  keys and `nm` extra keys (0 when absent) under `rules` (window, extra
  rule; None: no fitting), `rows` = batch x heads, heads `width` wide (the
  widest of queries and values) in `dtype`, at most `block`: the largest
  allowed tile (`max_block`), fitted to the rules (`fitted_block`)."""
  t = tile_size(max(nq, nk, nm), max_block(tile_size(width, 2**30), dtype,
                                           block))
  if rules is None:
    return t
  return fitted_block(rules[0], rules[1], t, nq, nk, nm, rows=rows)


def aligned_length(length: int, multiple: int,
                   tiles: Callable[[int], Sequence[int]]) -> int:
  """A length from `length` up that is a multiple of `multiple` and of
  every tile that a layer's calls take at that length (`tiles`:
  padded length -> the multiples its calls need, e.g. `call_tile` of each,
  times the positions per query of a call over pooled positions), so that
  a layer padded to it once pads no call again.

  The next multiple of the least common multiple of `multiple` and the
  tiles met so far; that multiple only grows, within the least common
  multiple of `multiple` and the largest tiles, so this ends after a few
  rounds."""
  needed = multiple
  while True:
    padded = -(-length // needed) * needed
    more = math.lcm(needed, *tiles(padded))
    if more == needed:
      return padded
    needed = more


def _padded_operands(q: Array, window: Optional[tuple[Array, Array, Array]],
                     extra: Optional[tuple[Array, Array, Array]], block: int,
                     rules: Optional[tuple[Optional[Window],
                                           Optional[Extra]]] = None,
                     layout: str = 'bhnd'
                     ) -> tuple[int, Callable[[Array], Array], Any, Any]:
  """The tile t, the padding of queries and keys (to a multiple of t along
  the sequence, to a power of two of at least 16 along the head), and the
  padded (keys, values, flag rows) of the window and of the extra keys
  (each None when absent), all in `layout`. With the call's (window,
  extra) `rules`, the tile fits them (`fitted_block`); without, it is the
  largest allowed."""
  parts = [p for p in (window, extra) if p is not None]
  n = lambda a: _dims(a, layout)[2]
  widths = (tile_size(q.shape[3], 2**30), tile_size(parts[0][1].shape[3],
                                                     2**30))
  t = call_tile(n(q), 0 if window is None else n(window[0]),
                0 if extra is None else n(extra[0]),
                rules=rules, rows=q.shape[0] * _dims(q, layout)[1],
                width=max(widths), dtype=q.dtype, block=block)
  axis = 2 if layout == 'bhnd' else 1
  keys = lambda a: _pad(_pad(a, axis, t), 3, widths[0])
  values = lambda a: _pad(_pad(a, axis, t), 3, widths[1])
  padded = lambda p: (None if p is None else
                      (keys(p[0]), values(p[1]), _flags(p[2], t)))
  return t, keys, padded(window), padded(extra)


def _dropout_seed(dropout_rate: float, dropout_seed: Optional[Array]
                  ) -> Optional[Array]:
  """The kernels' int32 seed of `dropout_seed` (None without dropout), or
  a ValueError for a bad rate or a missing seed."""
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f'dropout_rate={dropout_rate} must be in [0, 1).')
  if not dropout_rate:
    return None
  if dropout_seed is None:
    raise ValueError('dropout_rate > 0 needs a dropout_seed (an int32 '
                     'scalar drawn from the dropout RNG).')
  return lax.bitcast_convert_type(
      jnp.asarray(dropout_seed).astype(jnp.uint32), jnp.int32)


def flash_attention(q: Array, k: Optional[Array] = None,
                    v: Optional[Array] = None,
                    key_valid: Optional[Array] = None, *,
                    window: Optional[Window] = Window(),
                    extra: Optional[tuple[Array, Array, Array]] = None,
                    extra_rule: Extra = Extra(),
                    block: int = DEFAULT_BLOCK,
                    dropout_rate: float = 0.0,
                    dropout_seed: Optional[Array] = None,
                    return_extra_mass: bool = False,
                    layout: str = 'bhnd') -> Any:
  """Softmax attention over a key window and extra keys (module docstring).

  Args (shapes in the default `layout`, 'bhnd'; with 'bnhd' every
  `[batch, heads, n, d]` below is `[batch, n, heads, d]`):
    q: scaled queries `[batch, heads, nq, d]`.
    k: sequence keys `[batch, heads, nk, d]` (None with `window=None`).
    v: sequence values `[batch, heads, nk, dv]`.
    key_valid: bool `[batch, nk]`, True = the key may be attended.
    window: which sequence keys each query sees; None: no sequence keys.
    extra: None, or (keys `[batch, heads, m, d]`, values `[batch, heads, m,
      dv]`, bool validity `[batch, m]`).
    extra_rule: which extra keys each query sees.
    block: queries and keys per tile, at most (a power of two >= 16;
      shorter sequences, and wide float32 heads (`max_block`), get smaller
      tiles). Within it the tile fits the window and the extra keys
      (`fitted_block`): the largest with at least USEFUL_SHARE of its
      scores used.
    dropout_rate: attention dropout on the normalised weights (0: none).
    dropout_seed: int32 or uint32 scalar; required with dropout. The keep
      mask is `keep_mask(seed, b, h, query, key, part, heads, rate)`.
    return_extra_mass: also return each query's total weight on the extra
      keys before dropout, float32 `[batch, heads, nq]` (no gradient).
    layout: 'bhnd' or 'bnhd' (the model's own: on GPUs and in the
      interpreter the kernels read it through their BlockSpecs, with no
      transpose; on TPUs Mosaic's tiling needs 'bhnd' blocks, and the
      operands are transposed around the kernels).

  Returns:
    `[batch, heads, nq, dv]` in `q`'s dtype (and the extra mass); zero for
    a query without a valid key. Differentiable in q, k, v and the extra
    keys and values. Head dimensions are zero-padded inside to a power of
    two of at least 16, as Triton's matrix products need; the values do
    not change.

  Traced inside a mesh with a `data` axis (`mesh.under_mesh`), the kernels
  run once per batch shard (`mesh.batch_parallel`); the dropout masks are
  those of the unsplit batch.
  """
  if window is None and extra is None:
    raise ValueError('flash_attention needs a window, extra keys or both.')
  if layout not in LAYOUTS:
    raise ValueError(f'layout={layout!r}; valid: {LAYOUTS}.')
  batch, heads, nq, _ = _dims(q, layout)
  if window is not None:
    window.check()
    nk = _dims(k, layout)[2]
    if window.causal and nk != nq:
      raise ValueError(f'A causal window needs as many keys as queries, got '
                       f'{nk} and {nq}.')
  if extra is not None:
    extra_rule.check()
  t, keys, window_args, extra_args = _padded_operands(
      q, (k, v, key_valid) if window is not None else None, extra, block,
      rules=(window, extra_rule if extra is not None else None),
      layout=layout)
  v_dim = (v if window is not None else extra[1]).shape[3]
  seed = _dropout_seed(dropout_rate, dropout_seed)
  mass = bool(return_extra_mass and extra is not None)
  static = _Static(window, extra_rule if extra is not None else None, t,
                   heads=heads, dropout_rate=float(dropout_rate),
                   extra_mass=mass, layout=layout)
  if layout == 'bhnd':
    cut = lambda o: o[:, :, :nq, :v_dim]
  else:
    cut = lambda o: o[:, :nq, :, :v_dim]

  def local(first_row, q, window_args, extra_args, seed):
    operand = None
    if seed is not None:
      operand = jnp.stack([seed, first_row]).reshape(1, 2)
    return _flash(static, operand, q, window_args, extra_args)
  out = mesh_lib.batch_parallel(local, (keys(q), window_args, extra_args),
                                (seed,))
  if not return_extra_mass:
    return cut(out)
  if not mass:  # No extra keys: no weight on them.
    return cut(out), jnp.zeros((batch, heads, nq), jnp.float32)
  out, weight = out
  return cut(out), lax.stop_gradient(weight[:, :, :nq, 0])


def reference(q: Array, k: Optional[Array] = None, v: Optional[Array] = None,
              key_valid: Optional[Array] = None, *,
              window: Optional[Window] = Window(),
              extra: Optional[tuple[Array, Array, Array]] = None,
              extra_rule: Extra = Extra(), dropout_rate: float = 0.0,
              dropout_seed: Optional[Array] = None) -> Array:
  """The same function in plain XLA (the whole score matrix in memory),
  with the same dropout mask."""
  logits, valid, values, keeps = [], [], [], []
  batch, heads = q.shape[:2]
  i = jnp.arange(q.shape[2])[:, None]
  b = jnp.arange(batch)[:, None, None, None]
  h = jnp.arange(heads)[None, :, None, None]

  def keep(n, part):
    if not dropout_rate:
      return None
    return keep_mask(jnp.asarray(dropout_seed).astype(jnp.uint32), b, h, i,
                     jnp.arange(n)[None, :], part, heads, dropout_rate)
  if extra is not None:
    kx, vx, x_valid = extra
    logits.append(jnp.einsum('bhqd,bhkd->bhqk', q, kx,
                             preferred_element_type=jnp.float32))
    rule = extra_rule.mask(i, jnp.arange(kx.shape[2])[None, :])
    ok = x_valid[:, None, None, :]
    valid.append(ok if rule is None else ok & rule)
    values.append(vx)
    keeps.append(keep(kx.shape[2], EXTRA_PART))
  if window is not None:
    logits.append(jnp.einsum('bhqd,bhkd->bhqk', q, k,
                             preferred_element_type=jnp.float32))
    rule = window.mask(i, jnp.arange(k.shape[2])[None, :])
    ok = key_valid[:, None, None, :]
    valid.append(ok if rule is None else ok & rule)
    values.append(v)
    keeps.append(keep(k.shape[2], WINDOW_PART))
  s = jnp.concatenate(logits, -1)
  ok = jnp.concatenate([jnp.broadcast_to(m, l.shape)
                        for m, l in zip(valid, logits)], -1)
  s = jnp.where(ok, s, -jnp.inf)
  top = jnp.max(s, -1, keepdims=True)
  top = lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
  p = jnp.where(ok, jnp.exp(s - top), 0.0)
  total = jnp.sum(p, -1, keepdims=True)
  p = p / jnp.where(total > 0, total, 1.0)
  if dropout_rate:
    kept = jnp.concatenate([jnp.broadcast_to(m, l.shape)
                            for m, l in zip(keeps, logits)], -1)
    p = jnp.where(kept, p / (1.0 - dropout_rate), 0.0)
  vals = jnp.concatenate(values, 2)
  return jnp.einsum('bhqk,bhkd->bhqd', p.astype(vals.dtype), vals,
                    preferred_element_type=jnp.float32).astype(q.dtype)
