"""AdaMRA's routed multi-resolution heads (query side) as Pallas kernels.

The mechanism (`lra_msmra.attention.adamra`, docs/mechanisms/adamra.md)
sends every query to one of H resolution heads. Each head h has, per subhead
s, small summaries of its landmarks, KV_hs = sum_j phi(k_j) v_j^T `[d, d]`
and z_hs = sum_j phi(k_j) `[d]` (computed in XLA: reductions to tiny arrays).
This module computes, for every query i routed to head h = choice_i,

    pre_s = q_i W_hs + b_hs   (per-head maps, `'stacked'`), or the given
                              subhead query q_is (maps shared by heads),
    y_is  = gate_ih * (phi(pre_s) KV_hs) / (phi(pre_s) . z_hs + epsilon),

in one pass over tiles of `block` queries: one program per (batch row,
query tile) projects its queries with every head's map (stacked), keeps each
query's routed head by a select, applies the feature map and the routed
head's summaries, which stay in VMEM / shared memory, and normalises. Nothing
of size H x N reaches memory; stacked, the routed pre-activations are kept
for the backward pass (`[B, S, N, d]`, the size of the output).

The backward pass (`jax.custom_vjp`) is two kernels:

* one per query tile: the cotangents of the pre-activations (and, stacked,
  of the first-stage queries, summed over heads and subheads in the kernel)
  and of the gate;
* one per (batch row, head, subhead, chunk of query tiles): the cotangents
  of KV_hs and z_hs summed over the chunk's queries routed to h (the chunks'
  partial sums are added in XLA).

The per-head maps' gradients, sums over all queries of q_i^T dpre_i per
head, are H large matrix products left to XLA.

The gate's cotangent is that of y = sum_h gate_h y_h masked to the routed
head; with `all_gate_gradients` (the straight-through router) every head's
share <y_h, dy> is returned, unrouted heads included, as
`adamra._tap_gate_gradient` does.

The subhead queries, outputs and their cotangents are read and written in
the model's layout `[batch, N, S, d]` through the BlockSpecs (stacked: the
first-stage queries `[batch, N, F]`); the TPU form, whose blocks need the
sequence and the width as their last two axes, gets them heads-major
`[batch, S, N, d]`, transposed around its kernels, and so do subheads of
128 and wider on every platform (the dQ kernel's strided rows spilled
registers there on an H200). Per-query values are
columns `[N, 1]`; head dims below 16 or not powers of two are zero-padded
(Triton's products need 16), which changes nothing: padded features meet
zero rows of KV and z. Subheads wider than SUMMARY_SPAN are worked in
spans of it (rows as tuples of spans, KV one [span, span] block at a
time), so that no tile outgrows those of head dim 128. The kernels run on
every platform through
`flash.on_every_platform` (Triton on NVIDIA GPUs, Mosaic on TPUs, the
interpreter on the CPU). `reference` is the same function in plain XLA.
"""

from __future__ import annotations

import functools
import operator
from typing import NamedTuple, Optional

import jax
from jax import lax
from jax.experimental import pallas as pl
import jax.numpy as jnp

from lra_msmra.kernels import flash
from lra_msmra.kernels import mesh as mesh_lib

Array = jax.Array
# flash's tile product and platform dispatch, shared by every kernel here.
_dot = flash.dot
_on_every_platform = flash.on_every_platform

FEATURE_MAPS = ('relu', 'elu_plus_one')
DEFAULT_BLOCK = flash.DEFAULT_BLOCK
# Query tiles summed by one program of the summary-gradient kernel (at most;
# a divisor of the number of tiles).
CHUNK_TILES = 16
# The stacked projection's maps are read PROJECT_SPAN input rows at a time
# (a [span, d] slice of W_hs per matrix product): a whole [F, d] float32
# map, F = 512 and d = 128, needs 288 KiB of shared memory on GPUs, beyond
# the H100's 227 KiB. A multiple of 128 lanes, as TPUs need.
PROJECT_SPAN = 128
# Subheads wider than this are worked in spans of it: each head's [d, d]
# summary is read SUMMARY_SPAN x SUMMARY_SPAN at a time, and each query's
# d-wide rows as SUMMARY_SPAN-wide parts. Whole, a float32 summary at
# d = 256 is 256 KiB, beyond the shared memory of an H100 / H200 block
# (227 KiB); in spans every tile is one of d = 128, the widest that
# compiles whole. A multiple of 128 lanes, as TPUs need.
SUMMARY_SPAN = 128


class _Static(NamedTuple):
  """Everything static about one call."""
  block: int
  heads: int
  subheads: int
  feature_map: str
  epsilon: float
  stacked: bool
  has_bias: bool
  all_gate_gradients: bool
  chunk: int  # query tiles per program of the summary-gradient kernel
  # The per-subhead arrays' layout: 'bnhd' (`[batch, n, S, d]`, the
  # model's) read through the BlockSpecs, transposed to 'bhnd' around the
  # TPU form (`flash.on_every_platform`), or 'bhnd'.
  layout: str = 'bnhd'
  # Subheads wider than SUMMARY_SPAN, worked in spans; stacked, their
  # first-stage queries' cotangent is left to XLA (`_backward`).
  wide: bool = False


# -- the kernel bodies -------------------------------------------------------


def _feature(pre: Array, feature_map: str) -> Array:
  """phi of float32 pre-activations (`adamra._feature`)."""
  if feature_map == 'relu':
    return jnp.maximum(pre, 0.0)
  return jnp.where(pre > 0, pre + 1.0, jnp.exp(jnp.minimum(pre, 0.0)))


def _slope(pre: Array, feature_map: str) -> Array:
  """phi'(pre): ReLU's is 1 where pre > 0 (as `adamra._relu`), ELU + 1's
  exp(pre) below 0."""
  if feature_map == 'relu':
    return jnp.where(pre > 0, 1.0, 0.0)
  return jnp.where(pre > 0, 1.0, jnp.exp(jnp.minimum(pre, 0.0)))


def _spans(width: int, most: int = PROJECT_SPAN) -> list[tuple[int, int]]:
  """The static column spans of a row `width` wide, at most `most` each
  (one, the whole, up to it): a first-stage query row's (PROJECT_SPAN), or
  a (padded) subhead's (SUMMARY_SPAN)."""
  step = min(width, most)
  return [(c, c + step) for c in range(0, width, step)]


def _dims(width: int) -> list[tuple[int, int]]:
  """The spans of a (padded) subhead `width` wide (`_spans`)."""
  return _spans(width, SUMMARY_SPAN)


def _total(parts) -> Array:
  """The sum of a sequence of arrays (the first itself if it is alone)."""
  return functools.reduce(operator.add, parts)


def _row_dot(xs, ys) -> Array:
  """<x, y> per row, a column `[t, 1]`, of two rows given as their
  spans."""
  return _total([jnp.sum(x * y, axis=1, keepdims=True)
                 for x, y in zip(xs, ys)])


def _pick(parts, index: Array) -> Array:
  """parts[index] for a traced index, by selects (no dynamic lane slice)."""
  out = parts[0]
  for i, part in enumerate(parts[1:], 1):
    out = jnp.where(index == i, part, out)
  return out


def _cols(ref, lead: tuple, c0: int, c1: int):
  """`ref[lead]` restricted to columns [c0, c1) of its last axis: the
  whole of it, read as before, where the span covers the axis."""
  if (c0, c1) == (0, ref.shape[-1]):
    return ref[lead]
  middle = (slice(None),) * (len(ref.shape) - len(lead) - 1)
  return ref[lead + middle + (slice(c0, c1),)]


def _at(i: Array, step: int, count: int):
  """Span i of `count` spans `step` wide: static where there is one (a
  dynamic offset on the lanes must be a provable multiple of 128 on TPUs;
  steps of SUMMARY_SPAN and PROJECT_SPAN are)."""
  if count == 1:
    return slice(0, step)
  return pl.ds(pl.multiple_of(i * step, step), step)


def _blocked(rows: int, width: int, ins: int, outs: int, operand, block,
             product) -> tuple:
  """sum over spans i of product(operand(i), block(i, o)) for every span o,
  a tuple of `outs` [rows, width] float32 spans: one (i, o) block per loop
  iteration (unrolled, the blocks were live at once: register spills on
  an H200)."""
  def step(n, acc):
    i, o = lax.div(n, outs), lax.rem(n, outs)
    part = product(operand(i), block(i, o))
    return tuple(jnp.where(o == j, a + part, a) for j, a in enumerate(acc))
  zeros = tuple(jnp.zeros((rows, width), jnp.float32) for _ in range(outs))
  return lax.fori_loop(0, ins * outs, step, zeros)


def _apply(x, kv_ref, lead: tuple, dims, transposed: bool = False
           ) -> tuple:
  """x KV, or x KV^T (`transposed`), of the summary `kv_ref[lead]` (read
  one [span, span] block at a time); x and the result as spans
  (`_dims`)."""
  contract = 1 if transposed else 0
  if len(dims) == 1:
    return (_dot(x[0], kv_ref[lead], 1, contract),)
  n, span = len(dims), dims[0][1]

  def block(i, o):  # x's span i, the result's span o.
    k, v = (o, i) if transposed else (i, o)
    return kv_ref[lead + (_at(k, span, n), _at(v, span, n))]
  return _blocked(x[0].shape[0], span, n, n, lambda i: _pick(x, i), block,
                  lambda a, kv: _dot(a, kv, 1, contract))


def _dot_z(phi, z_ref, lead: tuple, dims) -> Array:
  """phi . z (`z_ref[lead]`, `[1, d]`) per query, a column `[t, 1]`; phi
  given as its spans."""
  return _row_dot(phi, [_cols(z_ref, lead, k0, k1) for k0, k1 in dims])


def _project(q_ref, w_ref, b_ref, h: int, s: int, dtype, dims) -> tuple:
  """Head h's subhead-s query map as spans of its columns (`_dims`),
  rounded as the XLA projection is (one float32 sum over spans of the
  input width, PROJECT_SPAN). Wide subheads read the map one [span, span]
  block at a time (`_blocked`)."""
  spans = _spans(q_ref.shape[-1])
  if len(dims) == 1:
    pre = None
    for c0, c1 in spans:
      part = _dot(q_ref[:, c0:c1], w_ref[h, s, c0:c1, :], 1, 0)
      pre = part if pre is None else pre + part
    pre = (pre,)
  else:
    step, span = spans[0][1], dims[0][1]
    pre = _blocked(
        q_ref.shape[0], span, len(spans), len(dims),
        lambda c: q_ref[:, _at(c, step, len(spans))],
        lambda c, k: w_ref[h, s, _at(c, step, len(spans)),
                           _at(k, span, len(dims))],
        lambda x, w: _dot(x, w, 1, 0))
  pre = tuple(p.astype(dtype) for p in pre)
  if b_ref is not None:
    pre = tuple(p + _cols(b_ref, (h, s), k0, k1).astype(dtype)
                for p, (k0, k1) in zip(pre, dims))
  return pre


def _sub(ref, s, lay: str, c: Optional[tuple[int, int]] = None):
  """Subhead s's `[t, d]` rows of a per-subhead block (their columns c):
  `[S, t, d]` in 'bhnd', `[t, S, d]` in 'bnhd' (the model's layout)."""
  if c is None or c == (0, ref.shape[-1]):
    return ref[s] if lay == 'bhnd' else ref[:, s, :]
  return ref[s, :, c[0]:c[1]] if lay == 'bhnd' else ref[:, s, c[0]:c[1]]


def _set_sub(ref, s, lay: str, value: Array,
             c: Optional[tuple[int, int]] = None) -> None:
  """Writes subhead s's `[t, d]` rows of a per-subhead block (or their
  columns c)."""
  if c is not None and c != (0, ref.shape[-1]):
    if lay == 'bhnd':
      ref[s, :, c[0]:c[1]] = value
    else:
      ref[:, s, c[0]:c[1]] = value
  elif lay == 'bhnd':
    ref[s] = value
  else:
    ref[:, s, :] = value


def _routed_gate(choice: Array, gate_ref, heads: int) -> Array:
  """The routed head's gate, a column `[t, 1]`."""
  g = jnp.zeros(choice.shape, jnp.float32)
  for h in range(heads):
    g = jnp.where(choice == h, gate_ref[h], g)
  return g


def _split(refs, static: _Static, names: tuple[str, ...]) -> dict:
  """Names the refs of a kernel; `w` and `b` only where they are passed."""
  refs, out = list(refs), {}
  for name in names:
    if name in ('w', 'pre') and not static.stacked:
      out[name] = None
    elif name == 'b' and not (static.stacked and static.has_bias):
      out[name] = None
    elif name == 'd_q' and not (static.stacked and not static.wide):
      out[name] = None
    else:
      out[name] = refs.pop(0)
  assert not refs, refs
  return out


_FORWARD_REFS = ('q', 'w', 'b', 'kv', 'z', 'choice', 'gate', 'y', 'pre')


def _forward_kernel(*refs, static: _Static, lay: str):
  """One query tile: route, project, features, summaries, normalise."""
  r = _split(refs, static, _FORWARD_REFS)
  choice = r['choice'][...]
  g = _routed_gate(choice, r['gate'], static.heads)
  # Rows are worked as spans of their columns (one, the whole, up to
  # SUMMARY_SPAN wide): every per-query [t, d] value is a tuple of them.
  dims = _dims(r['kv'].shape[-1])

  # One (subhead, head) pair per loop iteration, not unrolled (unrolled,
  # every pair's tiles were live at once: register spills on GPUs).
  def subhead(s, carry):
    phi = (None if static.stacked else  # One query for every head.
           tuple(_feature(_sub(r['q'], s, lay, k).astype(jnp.float32),
                          static.feature_map) for k in dims))

    def head(h, carry):
      num, den, pre_sel = carry
      pre = phi_h = phi
      if static.stacked:
        pre = _project(r['q'], r['w'], r['b'], h, s, r['y'].dtype, dims)
        phi_h = tuple(_feature(p.astype(jnp.float32), static.feature_map)
                      for p in pre)
      # Queries routed nowhere (tile padding) get head 0's.
      take = (choice == h) | (h == 0)
      num = tuple(jnp.where(take, y, x)
                  for x, y in zip(num, _apply(phi_h, r['kv'], (h, s), dims)))
      den = jnp.where(take, _dot_z(phi_h, r['z'], (h, s), dims), den)
      if static.stacked:
        pre_sel = tuple(jnp.where(take, p.astype(jnp.float32), x)
                        for x, p in zip(pre_sel, pre))
      return num, den, pre_sel

    tiles = tuple(jnp.zeros((choice.shape[0], c1 - c0), jnp.float32)
                  for c0, c1 in dims)
    num, den, pre_sel = lax.fori_loop(
        0, static.heads, head,
        (tiles, jnp.zeros(choice.shape, jnp.float32),
         tiles if static.stacked else jnp.zeros((), jnp.float32)))
    # As the XLA code: gate / (den + eps), times the numerator.
    ratio = g / (den + static.epsilon)
    for x, v in zip(num, dims):
      _set_sub(r['y'], s, lay, (x * ratio).astype(r['y'].dtype), v)
    if static.stacked:
      for x, k in zip(pre_sel, dims):
        _set_sub(r['pre'], s, lay, x.astype(r['pre'].dtype), k)
    return carry

  lax.fori_loop(0, static.subheads, subhead, 0)


_DQ_REFS = ('q', 'pre', 'w', 'b', 'kv', 'z', 'choice', 'gate', 'dy',
            'd_pre', 'd_q', 'd_gate')


def _dq_kernel(*refs, static: _Static, lay: str):
  """One query tile: cotangents of the pre-activations, queries and gate."""
  r = _split(refs, static, _DQ_REFS)
  choice = r['choice'][...]
  g = _routed_gate(choice, r['gate'], static.heads)
  eps = static.epsilon
  own_heads = static.stacked and static.all_gate_gradients

  # One (subhead, head) pair per loop iteration, in two passes over the
  # heads: the first makes per-query columns (the routed head's
  # denominator and <num, dy>, every head's gate term), the second the one
  # [t, d] cotangent. Unrolled, or carrying the routed head's [t, d] tiles,
  # the body spilled registers on GPUs.
  # Rows as spans of their columns (`_forward_kernel`).
  dims = _dims(r['kv'].shape[-1])

  def subhead(s, carry):
    terms, d_q = carry
    pre = tuple(_sub(r['pre'] if static.stacked else r['q'], s, lay,
                     k).astype(jnp.float32) for k in dims)
    phi = tuple(_feature(p, static.feature_map) for p in pre)
    dy = tuple(_sub(r['dy'], s, lay, v).astype(jnp.float32) for v in dims)
    column = jnp.zeros(choice.shape, jnp.float32)

    def columns(h, carry):
      terms, den, num_dy = carry
      # Head h's value at every query: its own queries for the
      # straight-through gate's share, else the routed queries (only read
      # where routed to h).
      phi_h = (tuple(_feature(p.astype(jnp.float32), static.feature_map)
                     for p in _project(r['q'], r['w'], r['b'], h, s,
                                       r['q'].dtype, dims))
               if own_heads else phi)
      num_dy_h = _row_dot(_apply(phi_h, r['kv'], (h, s), dims), dy)
      den_h = _dot_z(phi_h, r['z'], (h, s), dims)
      term = num_dy_h / (den_h + eps)
      terms = tuple(x + jnp.where(h == k, term, 0.0)
                    for k, x in enumerate(terms))
      # Queries routed nowhere (tile padding) get head 0's.
      take = (choice == h) | (h == 0)
      return (terms, jnp.where(take, den_h, den),
              jnp.where(take, num_dy_h, num_dy))

    terms, den, num_dy = lax.fori_loop(0, static.heads, columns,
                                       (terms, column, column))
    inv = 1.0 / (den + eps)
    ratio = g * inv
    # y = num * ratio: d_num = dy * ratio, d_den = -<num, dy> g / (den+eps)^2.
    d_den = -num_dy * ratio * inv

    def cotangent(h, d_phi):
      take = (choice == h) | (h == 0)
      return tuple(
          jnp.where(take, y * ratio + d_den * _cols(r['z'], (h, s), *k), x)
          for x, y, k in zip(d_phi, _apply(dy, r['kv'], (h, s), dims, True),
                             dims))

    d_phi = lax.fori_loop(0, static.heads, cotangent,
                          tuple(jnp.zeros(p.shape, jnp.float32)
                                for p in phi))
    d_pre = tuple(x * _slope(p, static.feature_map)
                  for x, p in zip(d_phi, pre))
    for x, k in zip(d_pre, dims):
      _set_sub(r['d_pre'], s, lay, x.astype(r['d_pre'].dtype), k)
    if r['d_q'] is not None:
      def head_dq(h, d_q):  # d_q: a [t, span] float32 sum per span.
        d_pre_h = jnp.where(choice == h, d_pre[0], 0.0).astype(r['w'].dtype)
        return tuple(part + _dot(d_pre_h, r['w'][h, s, c0:c1, :], 1, 1)
                     for part, (c0, c1) in zip(d_q, spans))
      d_q = lax.fori_loop(0, static.heads, head_dq, d_q)
    return terms, d_q

  terms = tuple(jnp.zeros(choice.shape, jnp.float32)
                for _ in range(static.heads))
  # Wide subheads leave d_q to XLA: its [t, F] float32 sum, carried through
  # every (subhead, head) pair beside the spans' tiles, spilled registers.
  spans = _spans(r['q'].shape[-1]) if r['d_q'] is not None else []
  t = choice.shape[0]
  d_q = tuple(jnp.zeros((t, c1 - c0), jnp.float32) for c0, c1 in spans)
  terms, d_q = lax.fori_loop(0, static.subheads, subhead, (terms, d_q))
  for h in range(static.heads):
    term = terms[h]
    if not static.all_gate_gradients:
      term = jnp.where(choice == h, term, 0.0)
    r['d_gate'][h] = term
  for part, (c0, c1) in zip(d_q, spans):
    r['d_q'][:, c0:c1] = part.astype(r['d_q'].dtype)


def _summary_grad_kernel(pre_ref, dy_ref, choice_ref, gate_ref, kv_ref, z_ref,
                         d_kv_ref, d_z_ref, *, static: _Static):
  """d KV_hs and d z_hs over one chunk of query tiles (those routed to h).

  Wide subheads (more than one span, `_dims`): the program's part of the
  grid's last axis names one [span, span] block (k, v) of d KV_hs, and
  d z_hs's span k; every query's full row still gives its denominator and
  <num, dy>."""
  t = static.block
  h = pl.program_id(1)
  dims = _dims(kv_ref.shape[-1])
  whole = len(dims) == 1
  if whole:
    kv, z = kv_ref[...], z_ref[...]
  else:
    part = lax.rem(pl.program_id(3), len(dims) ** 2)
    k, v = lax.div(part, len(dims)), lax.rem(part, len(dims))
  eps = static.epsilon

  def body(tile, carry):
    d_kv, d_z = carry
    r0 = pl.multiple_of(tile * t, t)
    rows = pl.ds(r0, t)
    mine = choice_ref[rows, :] == h
    if whole:
      pre = pre_ref[rows, :].astype(jnp.float32)
      phi = _feature(pre, static.feature_map)
      dy = dy_ref[rows, :].astype(jnp.float32)
      inv = 1.0 / (jnp.sum(phi * z, axis=1, keepdims=True) + eps)
      num_dy = jnp.sum(_dot(phi, kv, 1, 0) * dy, axis=1, keepdims=True)
      phi_k, dy_v = phi, dy
    else:
      phi = tuple(_feature(pre_ref[rows, k0:k1].astype(jnp.float32),
                           static.feature_map) for k0, k1 in dims)
      dy = tuple(dy_ref[rows, v0:v1].astype(jnp.float32) for v0, v1 in dims)
      inv = 1.0 / (_dot_z(phi, z_ref, (), dims) + eps)
      num_dy = _row_dot(_apply(phi, kv_ref, (), dims), dy)
      phi_k, dy_v = _pick(phi, k), _pick(dy, v)
    ratio = gate_ref[rows, :] * inv
    d_num = jnp.where(mine, dy_v * ratio, 0.0)
    d_den = jnp.where(mine, -num_dy * ratio * inv, 0.0)
    d_kv = d_kv + _dot(phi_k, d_num, 0, 0)
    d_z = d_z + jnp.sum(phi_k * d_den, axis=0, keepdims=True)
    return d_kv, d_z

  d_kv, d_z = lax.fori_loop(
      0, static.chunk, body,
      (jnp.zeros(d_kv_ref.shape, jnp.float32),
       jnp.zeros(d_z_ref.shape, jnp.float32)))
  d_kv_ref[...] = d_kv
  d_z_ref[...] = d_z


# -- pallas_call plumbing ----------------------------------------------------


# Triton's settings of the forward and dQ kernels, whose loops over the
# (subhead, head) pairs each load a [d, d] float32 summary: 8 warps, and no
# software pipelining (a second stage buffers each summary twice in shared
# memory). Wide heads take short tiles (`routed_attention`): with these, no
# kernel spills registers on an H100 / H200 at head dims 32 to 128.
TILE_WARPS = 8
TILE_STAGES = 1
# The dQ kernel of 'single' projections (one query map for every head): at
# 8 warps ptxas settled on 128 registers and spilled (ListOps' and Text's
# configs, 8 and 4 heads of 64); 4 warps do not. Subheads of SUMMARY_SPAN
# and wider keep TILE_WARPS: at 4, each [span, span] float32 block of a
# summary takes 128 registers a thread, and d = 256 spilled.
SINGLE_DQ_WARPS = 4
# The largest query tile at padded head dims of 128 and more.
WIDE_HEAD_BLOCK = 16


def _launch(specs, arrays, tile: int, width: int, axes: int,
            warps: Optional[int] = None, stages: int = 2) -> flash.Launch:
  """Compiler settings of a call (`flash.Launch`): every grid axis is
  parallel (each program writes blocks of its own)."""
  return flash.Launch.of(specs, arrays, tile, width, ('parallel',) * axes,
                         warps, stages)


def _whole(shape: tuple[int, ...]):
  """An operand every program reads whole (weights)."""
  return pl.BlockSpec(shape, lambda b, x: (0,) * len(shape))


def _batch_whole(shape: tuple[int, ...]):
  """One batch row's whole slice of `[batch, *shape]` (summaries)."""
  return pl.BlockSpec((None,) + shape,
                      lambda b, x: (b,) + (0,) * len(shape))


def _rows(lead: tuple[int, ...], t: int, width: int):
  """One tile of `t` rows of `[batch, *lead, n, width]`."""
  return pl.BlockSpec((None,) + lead + (t, width),
                      lambda b, x: (b,) + (0,) * len(lead) + (x, 0))


def _sub_rows(subheads: int, t: int, width: int, lay: str):
  """One tile of `t` rows of a per-subhead array in `lay`: `[batch, S, n,
  width]` ('bhnd') or `[batch, n, S, width]` ('bnhd')."""
  if lay == 'bhnd':
    return _rows((subheads,), t, width)
  return pl.BlockSpec((None, t, subheads, width), lambda b, x: (b, x, 0, 0))


def _sub_shape(batch: int, subheads: int, n: int, width: int, lay: str
               ) -> tuple[int, ...]:
  return ((batch, subheads, n, width) if lay == 'bhnd'
          else (batch, n, subheads, width))


# The layout a call's kernel reads ('bhnd' on TPUs) and the relayout of its
# flagged per-subhead operands around the TPU form: flash's, whose statics
# carry the same `layout` field.
_lay = flash._layout_of
_relayout = flash._relayout


def _tile_args(static: _Static, q, w, b, kv, z, choice, gate, lay: str):
  """Operands of the per-tile kernels (forward, dq), their specs in `lay`,
  and which of them are per-subhead (transposed for the TPU form)."""
  t = static.block
  if static.stacked:
    q_spec = _rows((), t, q.shape[2])
  else:
    q_spec = _sub_rows(static.subheads, t, q.shape[3], lay)
  args, specs = [q], [q_spec]
  if static.stacked:
    args.append(w)
    specs.append(_whole(w.shape))
    if static.has_bias:
      args.append(b)
      specs.append(_whole(b.shape))
  args += [kv, z, choice, gate]
  specs += [_batch_whole(kv.shape[1:]), _batch_whole(z.shape[1:]),
            _rows((), t, 1), _rows((static.heads,), t, 1)]
  flags = [not static.stacked] + [False] * (len(args) - 1)
  return args, specs, flags


def _forward(static: _Static, q, w, b, kv, z, choice, gate):
  batch, n = choice.shape[:2]
  t, s_, d = static.block, static.subheads, kv.shape[-1]
  dtype = q.dtype
  outs = 2 if static.stacked else 1

  def plumbing(lay):
    args, specs, flags = _tile_args(static, q, w, b, kv, z, choice, gate,
                                    lay)
    out_shape = [jax.ShapeDtypeStruct(_sub_shape(batch, s_, n, d, lay),
                                      dtype)] * outs
    return args, specs, flags, out_shape, [_sub_rows(s_, t, d, lay)] * outs

  def call(params, interpret):
    lay = _lay(static, params)
    _, specs, _, out_shape, out_specs = plumbing(lay)
    return pl.pallas_call(
        functools.partial(_forward_kernel, static=static, lay=lay),
        grid=(batch, n // t), in_specs=specs, out_specs=out_specs,
        out_shape=out_shape, compiler_params=params, interpret=interpret,
        name='adamra_routed_forward')
  args, specs, flags, out_shape, out_specs = plumbing('bhnd')
  launch = _launch(specs + out_specs, args + out_shape, t, d, 2,
                   warps=TILE_WARPS, stages=TILE_STAGES)
  result = _on_every_platform(call, launch, _relayout(
      static, flags, [True] * outs))(*args)
  return result[0], (result[1] if static.stacked else None)


def _summary_grads(static: _Static, pre, dy, choice, gate, kv, z):
  """d KV `[batch, H, S, d, d]` and d z `[..., 1, d]`: the chunks' partial
  sums, added."""
  batch, n = choice.shape[:2]
  s_, d = static.subheads, kv.shape[-1]
  h_, t = static.heads, static.block
  rows = static.chunk * t
  chunks = n // rows
  kernel = functools.partial(_summary_grad_kernel, static=static)
  # Wide subheads: each chunk's programs are (k, v) blocks of d KV, span
  # wide; each writes d z's span k into a slot of its own v.
  spans = len(_dims(d))
  span = d // spans
  parts = spans * spans
  if parts == 1:
    chunk_of = lambda c: c
    kv_block = dz_block = lambda b, h, s, c: (b, h, s, c, 0, 0)
  else:
    chunk_of = lambda c: lax.div(c, parts)
    kv_block = lambda b, h, s, c: (
        b, h, s, lax.div(c, parts), lax.div(lax.rem(c, parts), spans),
        lax.rem(c, spans))
    dz_block = lambda b, h, s, c: (
        b, h, s, lax.div(c, parts) * spans + lax.rem(c, spans), 0,
        lax.div(lax.rem(c, parts), spans))

  def seq(width, lay):  # One subhead's chunk of rows.
    if lay == 'bhnd':
      return pl.BlockSpec((None, None, rows, width),
                          lambda b, h, s, c: (b, s, chunk_of(c), 0))
    return pl.BlockSpec((None, rows, None, width),
                        lambda b, h, s, c: (b, chunk_of(c), s, 0))
  in_specs = [
      seq(d, 'bhnd'), seq(d, 'bhnd'),
      pl.BlockSpec((None, rows, 1), lambda b, h, s, c: (b, chunk_of(c), 0)),
      pl.BlockSpec((None, None, rows, 1),
                   lambda b, h, s, c: (b, h, chunk_of(c), 0)),
      pl.BlockSpec((None, None, None, d, d),
                   lambda b, h, s, c: (b, h, s, 0, 0)),
      pl.BlockSpec((None, None, None, 1, d),
                   lambda b, h, s, c: (b, h, s, 0, 0))]
  out_specs = [
      pl.BlockSpec((None, None, None, None, span, span), kv_block),
      pl.BlockSpec((None, None, None, None, 1, span), dz_block)]
  out_shape = [
      jax.ShapeDtypeStruct((batch, h_, s_, chunks, d, d), jnp.float32),
      jax.ShapeDtypeStruct((batch, h_, s_, chunks * spans, 1, d),
                           jnp.float32)]

  def call(params, interpret):
    lay = _lay(static, params)
    return pl.pallas_call(
        kernel, grid=(batch, h_, s_, chunks * parts),
        in_specs=[seq(d, lay), seq(d, lay)] + in_specs[2:],
        out_specs=out_specs, out_shape=out_shape, compiler_params=params,
        interpret=interpret, name='adamra_routed_summary_grad')
  args = [pre, dy, choice, gate, kv, z]
  launch = _launch(in_specs + out_specs, args + out_shape, rows, d, 4,
                   *((TILE_WARPS, TILE_STAGES) if spans > 1 else ()))
  d_kv, d_z = _on_every_platform(call, launch, _relayout(
      static, [True, True] + [False] * 4, [False, False]))(*args)
  # Every v slot holds the same d z: the first's.
  d_z = d_z.reshape(batch, h_, s_, chunks, spans, 1, d)[:, :, :, :, 0]
  return jnp.sum(d_kv, axis=3), jnp.sum(d_z, axis=3)


def _backward(static: _Static, q, w, b, kv, z, choice, gate, pre, dy):
  batch, n = choice.shape[:2]
  t, s_, h_, d = static.block, static.subheads, static.heads, kv.shape[-1]
  if not static.stacked:
    pre = q

  def plumbing(lay):
    args, specs, flags = _tile_args(static, q, w, b, kv, z, choice, gate,
                                    lay)
    sub = _sub_rows(s_, t, d, lay)
    if static.stacked:
      args.insert(1, pre)
      specs.insert(1, sub)
      flags.insert(1, True)
    args.append(dy)
    specs.append(sub)
    flags.append(True)
    out_shape = [jax.ShapeDtypeStruct(_sub_shape(batch, s_, n, d, lay),
                                      pre.dtype)]
    out_specs, out_flags = [sub], [True]
    if static.stacked and not static.wide:
      out_shape.append(jax.ShapeDtypeStruct(q.shape, q.dtype))
      out_specs.append(_rows((), t, q.shape[2]))
      out_flags.append(False)
    out_shape.append(jax.ShapeDtypeStruct((batch, h_, n, 1), jnp.float32))
    out_specs.append(_rows((h_,), t, 1))
    out_flags.append(False)
    return args, specs, flags, out_shape, out_specs, out_flags

  def call(params, interpret):
    lay = _lay(static, params)
    _, specs, _, out_shape, out_specs, _ = plumbing(lay)
    return pl.pallas_call(
        functools.partial(_dq_kernel, static=static, lay=lay),
        grid=(batch, n // t), in_specs=specs, out_specs=out_specs,
        out_shape=out_shape, compiler_params=params, interpret=interpret,
        name='adamra_routed_dq')
  args, specs, flags, out_shape, out_specs, out_flags = plumbing('bhnd')
  launch = _launch(specs + out_specs, args + out_shape, t, d, 2,
                   warps=(TILE_WARPS if static.stacked or d >= SUMMARY_SPAN
                          else SINGLE_DQ_WARPS),
                   stages=TILE_STAGES)
  outs = _on_every_platform(call, launch, _relayout(static, flags,
                                                    out_flags))(*args)
  d_pre, d_gate = outs[0], outs[-1]

  d_kv, d_z = _summary_grads(static, pre, dy, choice, gate, kv, z)

  if not static.stacked:
    return d_pre, None, None, d_kv, d_z, d_gate
  # The per-head maps: each a sum over every query routed to h of
  # q^T dpre, one large product per head; wide subheads' d_q likewise, a
  # sum over heads of dpre W_h^T where routed to h.
  d_w, d_b = [], []
  d_q = None if static.wide else outs[1]
  bnhd = static.layout == 'bnhd'
  for h in range(h_):
    # [batch, n, 1, 1] ('bnhd') or [batch, 1, n, 1].
    mine = (choice == h)[:, :, None] if bnhd else (choice == h)[:, None]
    d_pre_h = jnp.where(mine, d_pre, jnp.zeros((), d_pre.dtype))
    d_w.append(jnp.einsum('bnf,bnsd->sfd' if bnhd else 'bnf,bsnd->sfd', q,
                          d_pre_h, preferred_element_type=jnp.float32))
    if static.wide:
      part = jnp.einsum('bnsd,sfd->bnf' if bnhd else 'bsnd,sfd->bnf',
                        d_pre_h.astype(w.dtype), w[h],
                        preferred_element_type=jnp.float32)
      d_q = part if d_q is None else d_q + part
    if static.has_bias:
      d_b.append(jnp.sum(d_pre_h.astype(jnp.float32),
                         axis=(0, 1) if bnhd else (0, 2))[:, None])
  if static.wide:
    d_q = d_q.astype(q.dtype)
  d_w = jnp.stack(d_w).astype(w.dtype)
  d_b = jnp.stack(d_b).astype(b.dtype) if static.has_bias else None
  return d_q, d_w, d_b, d_kv, d_z, d_gate


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _routed(static: _Static, q, w, b, kv, z, choice, gate):
  return _forward(static, q, w, b, kv, z, choice, gate)[0]


def _routed_fwd(static, q, w, b, kv, z, choice, gate):
  y, pre = _forward(static, q, w, b, kv, z, choice, gate)
  return y, (q, w, b, kv, z, choice, gate, pre)


def _routed_bwd(static, residuals, dy):
  q, w, b, kv, z, choice, gate, pre = residuals
  d_q, d_w, d_b, d_kv, d_z, d_gate = _backward(
      static, q, w, b, kv, z, choice, gate, pre, dy)
  # The routed heads are integers: no cotangent.
  return d_q, d_w, d_b, d_kv, d_z, None, d_gate


_routed.defvjp(_routed_fwd, _routed_bwd)


# -- the public function -----------------------------------------------------


def _width(d: int) -> int:
  """A product dimension Triton takes: a power of two, at least 16."""
  size = flash.MIN_BLOCK
  while size < d:
    size *= 2
  return size


def _pad_to(x: Array, axis: int, size: int, value=0) -> Array:
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value) if size > x.shape[axis] \
      else x


def _chunk_tiles(tiles: int) -> int:
  """The largest divisor of `tiles` up to CHUNK_TILES."""
  return max(c for c in range(1, min(tiles, CHUNK_TILES) + 1)
             if tiles % c == 0)


def tile(n: int, d: int, dtype, block: int = DEFAULT_BLOCK) -> int:
  """The query tile of `routed_attention` for `n` queries of subheads `d`
  wide in `dtype`: `flash.tile_size` within `flash.max_block`, wide heads
  (padded to 128 and more) at most WIDE_HEAD_BLOCK."""
  dp = _width(d)
  return flash.tile_size(n, flash.max_block(
      dp, dtype, block if dp < 128 else min(block, WIDE_HEAD_BLOCK)))


def padded_length(length: int, multiple: int, *, head_dim: int, dtype,
                  block: int = DEFAULT_BLOCK) -> int:
  """The length a layer pads its input to, once, so that
  `routed_attention` pads nothing: a multiple of `multiple` (the layer's
  segments) and of the query tile (`flash.aligned_length`)."""
  return flash.aligned_length(
      length, multiple, lambda n: [tile(n, head_dim, dtype, block)])


def routed_attention(q: Array, kv: Array, z: Array, choice: Array,
                     gate: Array, *, weight: Optional[Array] = None,
                     bias: Optional[Array] = None,
                     feature_map: str = 'relu', epsilon: float = 1e-6,
                     all_gate_gradients: bool = False,
                     block: int = DEFAULT_BLOCK) -> Array:
  """Each query's routed head of kernel linear attention (module docstring).

  Args:
    q: with `weight`, first-stage queries `[batch, n, F]`, projected in the
      kernel by each head's map; else the subhead queries `[batch, n, S, d]`
      shared by every head.
    kv: float32 summaries sum_j phi(k_j) v_j^T `[batch, H, S, d, d]`.
    z: float32 summaries sum_j phi(k_j) `[batch, H, S, d]`.
    choice: int `[batch, n]`, each query's routed head.
    gate: float32 `[batch, n, H]`; the routed head's entry scales the query's
      output.
    weight: per-head maps `[H, F, S, d]` (`'stacked'` projections), or None.
    bias: their biases `[H, S, d]`, or None.
    feature_map: 'relu' or 'elu_plus_one' (phi).
    epsilon: added to the denominator.
    all_gate_gradients: give every head's gate the cotangent <y_h, dy>, not
      only the routed one (the straight-through router).
    block: queries per tile (a power of two >= 16; shorter sequences, head
      dims of 128 or more (at most WIDE_HEAD_BLOCK) and wide float32 heads
      (`flash.max_block`) get smaller tiles).

  Returns:
    `[batch, n, S, d]` in `q`'s dtype. Differentiable in `q`, `kv`, `z`,
    `gate`, `weight` and `bias`.
  """
  if feature_map not in FEATURE_MAPS:
    raise ValueError(f'feature_map={feature_map!r}; valid: {FEATURE_MAPS}.')
  stacked = weight is not None
  batch, n = choice.shape
  heads, subheads, d = kv.shape[1], kv.shape[2], kv.shape[3]
  dp = _width(d)
  t = tile(n, d, q.dtype, block)
  n_pad = -(-n // t) * t
  # Wide subheads are read heads-major: in the model's layout the dQ
  # kernel's strided [t, S, d] rows spill registers on an H200 at d = 128.
  layout = 'bnhd' if dp < 128 else 'bhnd'
  if stacked:
    f = q.shape[2]
    fp = _width(f)
    q_in = _pad_to(_pad_to(q, 1, n_pad), 2, fp)
    w = jnp.transpose(weight, (0, 2, 1, 3)).astype(q.dtype)  # [H, S, F, d]
    w = _pad_to(_pad_to(w, 2, fp), 3, dp)
    b = (None if bias is None
         else _pad_to(bias.astype(q.dtype)[:, :, None, :], 3, dp))
  elif layout == 'bnhd':  # The model's layout, read as it is.
    q_in = _pad_to(_pad_to(q, 1, n_pad), 3, dp)
    w = b = None
  else:
    q_in = _pad_to(_pad_to(jnp.transpose(q, (0, 2, 1, 3)), 2, n_pad), 3, dp)
    w = b = None
  kv_in = _pad_to(_pad_to(kv.astype(jnp.float32), 3, dp), 4, dp)
  z_in = _pad_to(z.astype(jnp.float32)[:, :, :, None, :], 4, dp)
  # Tile padding is routed to no head: it outputs zero and adds nothing.
  choice_in = _pad_to(choice.astype(jnp.int32), 1, n_pad, heads)[..., None]
  gate_in = _pad_to(jnp.transpose(gate.astype(jnp.float32), (0, 2, 1)), 2,
                    n_pad)[..., None]
  static = _Static(block=t, heads=heads, subheads=subheads,
                   feature_map=feature_map, epsilon=float(epsilon),
                   stacked=stacked, has_bias=stacked and bias is not None,
                   all_gate_gradients=all_gate_gradients,
                   chunk=_chunk_tiles(n_pad // t), layout=layout,
                   wide=dp > SUMMARY_SPAN)
  # One call per batch shard inside a mesh (`mesh.batch_parallel`); the
  # maps are every shard's.
  y = mesh_lib.batch_parallel(
      lambda first_row, q, kv, z, choice, gate, w, b: _routed(
          static, q, w, b, kv, z, choice, gate),
      (q_in, kv_in, z_in, choice_in, gate_in), (w, b))
  if layout == 'bhnd':
    return jnp.transpose(y[:, :, :n, :d], (0, 2, 1, 3))
  return y[:, :n, :, :d]


def reference(q: Array, kv: Array, z: Array, choice: Array, gate: Array, *,
              weight: Optional[Array] = None, bias: Optional[Array] = None,
              feature_map: str = 'relu', epsilon: float = 1e-6,
              all_gate_gradients: bool = False) -> Array:
  """The same function in plain XLA: every head for every query, masked.

  Its gradients are those of `routed_attention`: through the routed head
  only, and to the gate of the routed head (of every head with
  `all_gate_gradients`).
  """
  heads = kv.shape[1]
  hard = jax.nn.one_hot(choice, heads, dtype=jnp.float32)
  gate = gate.astype(jnp.float32)
  if all_gate_gradients:
    # Value: the routed entry; gradient: every entry's.
    gate = hard * lax.stop_gradient(gate) + (gate - lax.stop_gradient(gate))
  else:
    gate = hard * gate
  y = 0.0
  for h in range(heads):
    if weight is None:
      pre = q
    else:
      pre = jnp.einsum('bnf,fsd->bnsd', q, weight[h].astype(q.dtype))
      if bias is not None:
        pre = pre + bias[h].astype(q.dtype)
    phi = _feature(pre.astype(jnp.float32), feature_map)
    num = jnp.einsum('bnsk,bskv->bnsv', phi, kv[:, h])
    den = jnp.einsum('bnsk,bsk->bns', phi, z[:, h])
    y = y + num * (gate[..., h, None] / (den + epsilon))[..., None]
  return y.astype(q.dtype)
