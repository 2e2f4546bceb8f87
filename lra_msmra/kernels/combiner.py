"""Combiner's fixed and axial factorizations as fused Pallas kernels.

The `combiner` mechanism (`lra_msmra.attention.combiner`) says what a layer
computes; its `'xla'` implementation is the numerical reference. Its
`'pallas'` implementation computes the same function here, through the flash
kernels of `lra_msmra.kernels.flash` (Triton on NVIDIA GPUs, Mosaic on TPUs,
Pallas' interpreter on the CPU): no per-query logits or weights ever exist
outside a kernel tile, forward or backward.

Covered (`check` refuses the rest at construction):

* `variant='fixed'`, causal or not. Direct keys are the query's own block
  (a segment window of `block_size`, causal or not) and the extra keys are
  the block summaries k_Ω of the other (causal: earlier) blocks, under one
  softmax (`flash.flash_attention` with `Extra('other_group' |
  'earlier_group')`). A summary's logit is the plain q . k_Ω, so no bias is
  needed. The summaries themselves (masked pooling of each block, and its
  local expectation: one pooled query against the block's keys) cost O(N d)
  and are fused multiply-reduce loops in XLA, not batched tiny matmuls.
* `variant='axial'`, every plan, and `'mixture'`, either mode, causal or
  not. The query (r, c) of the
  n x m grid sees keys in its own row and in its own column (and span
  summaries stored in its row or column), under one softmax. No single
  order of the sequence puts both a row and a column in one window, so the
  joint softmax is split in two layouts: a row-major pass (own row, and
  summaries stored in the row) and a column-major pass (own column, and
  summaries stored in the column), each a flash kernel with a
  `GroupRule` mask. Their outputs and log-sum-exps are merged per query
  (`_joint`), and the backward pass runs each layout's flash backward
  kernels with the merged output and log-sum-exp, which is the gradient of
  the one joint softmax. The local expectations of the vertical (column
  above / below) and horizontal (row left / right) spans are themselves
  attentions with strict prefix or suffix masks (`GroupRule` 'lt' / 'gt'),
  one flash call each; rowmajor's row summaries are a flash call over full
  rows, its learned summary key stays in the mechanism (Flax). Mixture's
  'joint_softmax' is one joint softmax over both plans' summaries (the
  vertical ones stored in rows, the horizontal ones in columns); 'average'
  is the mean of two.

Everything else (projections, DeepSets maps, the grid and its padding,
pooling) is the mechanism's own code, so variables and the function are
those of `'xla'`. The layer sows nothing in either implementation.

Attention dropout as in 'xla' (docs/mechanisms/combiner.md §3, item 6): every
effective weight passes through one mask, direct weights after the joint
softmax and span members inside their local expectation. Flash drops every
key of a call, so with dropout the direct keys and the span summaries go to
separate calls under the one softmax (`_joint`). The masks are flash's
in-kernel hash (`flash.keep_mask`; Fixed's local expectations, computed in
XLA, use the same function), one seed per call (`Seeds`), so they are not
the 'xla' implementation's `jax.random` bits.

Inside a data mesh every kernel call runs once per batch shard
(`mesh.batch_parallel`), as flash's public function does.

Layout costs: Fixed without dropout works in the model's layout `[B, N,
H, d]` throughout (flash reads it through its BlockSpecs, `layout='bnhd'`);
with dropout its joint softmax is heads-major. For Axial and Mixture the
grid is put heads-major once, and the column-major pass needs a transposed
copy of q, k, v and, in its backward pass, of the output and its
cotangent: O(N d) copies next to the kernels' O(N (n + m) d) work.

Until `flash` exposes a joint softmax over several calls (its log-sum-exp as
a differentiable output) and mask rules beyond its `Window` / `Extra`, this
module drives flash's kernels through `_flash_forward`, `_flash_backward`
and `_flash_attend`, the only places that call flash's kernels directly.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp

from lra_msmra.kernels import combiner_spans
from lra_msmra.kernels import flash
from lra_msmra.kernels import mesh as mesh_lib
from lra_msmra.kernels import safe_softmax

# flash's kernels with other mask rules and merged softmaxes (see the module
# docstring), and the mechanism's pooling and grid helpers.
# pylint: disable=protected-access,g-import-not-at-top

Array = jax.Array

VARIANTS = ('fixed', 'axial', 'mixture')
# Queries and keys per kernel tile (at most; `flash.tile_size`).
BLOCK = flash.DEFAULT_BLOCK


def check(*, variant: str) -> None:
  """Refuses, at construction, what the Pallas implementation does not cover.

  Raises:
    ValueError: one line naming the knob and the way out.
  """
  if variant not in VARIANTS:
    raise ValueError(
        f"Combiner implementation='pallas' covers variant {VARIANTS}, not "
        f"variant={variant!r}: use implementation='xla'.")


# -- the mask rule -----------------------------------------------------------


class GroupRule(NamedTuple):
  """Query i sees key j in its own group, where their members relate.

  Queries come in groups of `queries` (query i: group i // queries, member
  i mod queries). Keys come in groups of `kinds * queries`: `kinds` runs of
  `queries` members, one per kind of key (e.g. the span summaries above and
  below a position, stored side by side per group): key j is member
  (j mod kinds * queries) mod queries. `relation` compares the key's member
  with the query's: 'all', 'le', 'lt', 'gt' or 'ne'.

  It is a flash mask rule (`mask`, `key_range`, `query_range`: the same
  protocol as `flash.Window`), usable in kernel code (`lax.div` on
  non-negative integers, no `//`).
  """
  queries: int
  kinds: int = 1
  relation: str = 'all'

  def _key_group(self) -> int:
    return self.kinds * self.queries

  def intervals(self) -> bool:
    """Whether each query's keys (each key's queries) are exactly its
    `key_range` (`query_range`), as flash's interior tiles need: the whole
    group, or with one kind of key a prefix or suffix of it; not 'ne', nor
    an order relation over several kinds."""
    return self.relation == 'all' or (self.kinds == 1
                                      and self.relation != 'ne')

  def visible_counts(self, i: Array, n: int) -> Array:
    """Keys among [0, n) that each query of `i` sees, every key valid (for
    `flash.useful_share`)."""
    q, size = self.queries, self._key_group()
    g = lax.div(i, q)
    ci = i - g * q
    a, b = {'all': (0, q), 'le': (0, ci + 1), 'lt': (0, ci),
            'gt': (ci + 1, q), 'ne': (0, q)}[self.relation]
    count = jnp.zeros_like(i)
    for kind in range(self.kinds):
      start = g * size + kind * q
      count += (jnp.clip(start + b, 0, n) - jnp.clip(start + a, 0, n))
      if self.relation == 'ne':
        count -= (start + ci < n).astype(count.dtype)
    return count

  def mask(self, i: Array, j: Array) -> Array:
    q, size = self.queries, self._key_group()
    gi = lax.div(i, q)
    ci = i - gi * q
    gj = lax.div(j, size)
    rj = j - gj * size
    cj = rj - lax.div(rj, q) * q
    ok = gi == gj
    if self.relation == 'le':
      ok &= cj <= ci
    elif self.relation == 'lt':
      ok &= cj < ci
    elif self.relation == 'gt':
      ok &= cj > ci
    elif self.relation == 'ne':
      ok &= cj != ci
    return ok

  def key_range(self, i0: Array, i1: Array, n: int) -> tuple[Array, Array]:
    """Keys [lo, hi) that queries i0..i1 may see, within [0, n)."""
    size = self._key_group()
    lo = lax.div(i0, self.queries) * size
    hi = (lax.div(i1, self.queries) + 1) * size
    if self.kinds == 1:  # Keys share the queries' positions.
      if self.relation == 'le':
        hi = jnp.minimum(hi, i1 + 1)
      elif self.relation == 'lt':
        hi = jnp.minimum(hi, i1)
      elif self.relation == 'gt':
        lo = jnp.maximum(lo, i0 + 1)
    return jnp.maximum(lo, 0), jnp.minimum(hi, n)

  def query_range(self, j0: Array, j1: Array, n: int) -> tuple[Array, Array]:
    """Queries [lo, hi) that may see one of the keys j0..j1, within [0, n)."""
    size = self._key_group()
    lo = lax.div(j0, size) * self.queries
    hi = (lax.div(j1, size) + 1) * self.queries
    if self.kinds == 1:
      if self.relation == 'le':
        lo = jnp.maximum(lo, j0)
      elif self.relation == 'lt':
        lo = jnp.maximum(lo, j0 + 1)
      elif self.relation == 'gt':
        hi = jnp.minimum(hi, j1)
    return jnp.maximum(lo, 0), jnp.minimum(hi, n)

  def any_key(self, valid: Array, queries: int) -> Array:
    """Whether each query sees a valid key (XLA, outside the kernels).

    Args:
      valid: bool `[batch, keys]`, per key.
      queries: the number of queries.

    Returns:
      bool `[batch, queries]`.
    """
    size = self._key_group()
    groups = -(-max(valid.shape[1], 1) // size)
    valid = jnp.pad(valid, [(0, 0), (0, groups * size - valid.shape[1])])
    batch = valid.shape[0]
    # [batch, groups, queries]: valid keys per member, over the kinds.
    per_member = valid.reshape(batch, groups, self.kinds, self.queries).astype(
        jnp.int32).sum(2)
    total = per_member.sum(-1, keepdims=True)
    inclusive = jnp.cumsum(per_member, -1)
    count = {'all': total + 0 * per_member,
             'ne': total - per_member,
             'le': inclusive,
             'lt': inclusive - per_member,
             'gt': total - inclusive}[self.relation]
    seen = (count > 0).reshape(batch, groups * self.queries)
    return jnp.pad(seen, [(0, 0), (0, max(queries - seen.shape[1], 0))]
                   )[:, :queries]


# -- flash's kernels, driven with GroupRule masks ----------------------------


class Keys(NamedTuple):
  """One set of keys, heads-major, in the order of one layout.

  Attributes:
    k: keys `[batch, heads, length, d]`.
    v: values `[batch, heads, length, dv]`.
    valid: bool `[batch, length]`.
    rule: which queries see which keys (`GroupRule`, or `flash.Extra` with
      `key_group=1`).
    direct: direct keys get attention dropout after the joint softmax; span
      summaries do not (their members got theirs in the local expectation).
  """
  k: Array
  v: Array
  valid: Array
  rule: Any
  direct: bool = True


class Seeds:
  """Independent dropout seeds for the flash calls of one layer call.

  Call c gets the layer's seed plus c times the golden ratio (mod 2^32),
  bit-cast to int32 as flash's kernels take it; `keep_mask` hashes the
  seed, so the calls' masks are unrelated.
  """

  def __init__(self, seed: Optional[Array]):
    self.seed = seed
    self.count = 0

  def next(self) -> Optional[Array]:
    if self.seed is None:
      return None
    self.count += 1
    seed = jnp.asarray(self.seed).astype(jnp.uint32) + jnp.uint32(
        (0x9E3779B9 * self.count) % 2**32)
    return lax.bitcast_convert_type(seed, jnp.int32)


def _any_key(keys: Keys, queries: int) -> Array:
  """bool `[batch, queries]`: whether each query sees a valid key."""
  rule = keys.rule
  if isinstance(rule, GroupRule):
    return rule.any_key(keys.valid, queries)
  # flash.Extra with one key per group of `query_group` queries.
  valid = keys.valid.astype(jnp.int32)
  total = valid.sum(-1, keepdims=True)
  count = (total - valid if rule.kind == 'other_group'
           else jnp.cumsum(valid, -1) - valid)
  seen = jnp.repeat(count > 0, rule.query_group, axis=1)
  return seen[:, :queries]


def _width(d: int) -> int:
  """A head dimension zero-padded to a power of two of at least 16, as
  Triton's matrix products need (flash's public function does the same)."""
  return flash.tile_size(d, 2**30)


def _pad_rows(x: Array, t: int) -> Array:
  """`[B, H, L, d]`: L to a multiple of the tile, d to `_width(d)`."""
  return flash._pad(flash._pad(x, 2, t), 3, _width(x.shape[3]))


def _pad_keys(keys: Optional[Keys], t: int):
  if keys is None:
    return None
  return (_pad_rows(keys.k, t), _pad_rows(keys.v, t),
          flash._flags(keys.valid, t))


def _seed_operand(seed: Optional[Array], first_row: Array
                  ) -> Optional[Array]:
  """flash's `[1, 2]` dropout operand: the seed and the global index of the
  first batch row of this call (`mesh.batch_parallel`)."""
  if seed is None:
    return None
  return jnp.stack([seed, first_row]).reshape(1, 2)


def _static(window: Optional[Keys], extra: Optional[Keys], t: int,
            heads: int, dropout_rate: float):
  return flash._Static(
      window.rule if window is not None else None,
      extra.rule if extra is not None else None, t, heads=heads,
      dropout_rate=float(dropout_rate))


def _flash_attend(q: Array, keys: Keys, t: int, dropout_rate: float = 0.0,
                  seed: Optional[Array] = None) -> Array:
  """Softmax attention of `q` over `keys` (one layout), differentiable;
  once per batch shard inside a mesh (`mesh.batch_parallel`)."""
  nq, dv = q.shape[2], keys.v.shape[3]
  # The tile fitted to the rule (`flash.fitted_block`).
  t = flash.fitted_block(keys.rule, None, t, nq, keys.k.shape[2], 0,
                         rows=q.shape[0] * q.shape[1])
  static = _static(keys, None, t, q.shape[1], dropout_rate)

  def local(first_row, q, keys, seed):
    return flash._flash(static, _seed_operand(seed, first_row), q, keys, None)
  out = mesh_lib.batch_parallel(local, (_pad_rows(q, t), _pad_keys(keys, t)),
                                (seed,))
  return out[:, :, :nq, :dv]


def _flash_forward(static, seed, q, window_args, extra_args):
  return flash._forward(static, seed, q, window_args, extra_args)


def _flash_backward(static, seed, q, window_args, extra_args, out, lse,
                    d_out):
  return flash._backward(static, seed, q, window_args, extra_args, out, lse,
                         d_out)


# -- one softmax over several calls and two layouts --------------------------


class _JointStatic(NamedTuple):
  """The passes' (flash._Static, layout) and the grid n x m."""
  passes: tuple
  n: int
  m: int


def _rows_of_cols(x: Array, n: int, m: int) -> Array:
  """`[B, H, m*n, ...]` column-major -> `[B, H, n*m, ...]` row-major."""
  b, h = x.shape[:2]
  x = x.reshape(b, h, m, n, *x.shape[3:])
  return jnp.swapaxes(x, 2, 3).reshape(b, h, n * m, *x.shape[4:])


def _cols_of_rows(x: Array, n: int, m: int) -> Array:
  """`[B, H, n*m, ...]` row-major -> `[B, H, m*n, ...]` column-major."""
  b, h = x.shape[:2]
  x = x.reshape(b, h, n, m, *x.shape[3:])
  return jnp.swapaxes(x, 2, 3).reshape(b, h, n * m, *x.shape[4:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _joint_core(static: _JointStatic, args, seen):
  """The merged output `[B, H, n*m, dv]` (dv padded as the values are) of
  the passes `args`, each (seed operand, queries, window, extra keys) in
  its layout, padded; `seen`: per pass, bool `[B, n*m]` row-major."""
  return _joint_fwd(static, args, seen)[0]


def _joint_fwd(static, args, seen):
  n, m = static.n, static.m
  size = n * m
  parts = []
  for (part_static, layout), (seed, q, window, extra), part_seen in zip(
      static.passes, args, seen):
    out, lse = _flash_forward(part_static, seed, q, window, extra)
    out, lse = out[:, :, :size].astype(jnp.float32), lse[:, :, :size, 0]
    if layout == 'cols':
      out, lse = _rows_of_cols(out, n, m), _rows_of_cols(lse, n, m)
    parts.append((out, lse, part_seen[:, None, :]))
  # One softmax: pass p's output weighs exp(lse_p - lse).
  top = functools.reduce(jnp.maximum, [jnp.where(s, l, -jnp.inf)
                                       for _, l, s in parts])
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  weights = [jnp.where(s, jnp.exp(l - top), 0.0) for _, l, s in parts]
  total = functools.reduce(jnp.add, weights)
  seen_any = total > 0
  total = jnp.where(seen_any, total, 1.0)
  merged = functools.reduce(jnp.add, [w[..., None] * o for w, (o, _, _)
                                      in zip(weights, parts)])
  out = (merged / total[..., None]).astype(args[0][1].dtype)
  lse = jnp.where(seen_any, top + jnp.log(total), 0.0)
  return out, (args, out, lse)


def _joint_bwd(static, residuals, d_out):
  # The gradient of one softmax over all passes: each pass's flash backward
  # kernels with the merged output (delta = dO . out) and log-sum-exp.
  args, out, lse = residuals
  n, m = static.n, static.m
  lse = lse[..., None]
  d_out = d_out.astype(out.dtype)
  with_flags = lambda g: None if g is None else (*g, None)
  cotangents = []
  for (part_static, layout), (seed, q, window, extra) in zip(static.passes,
                                                             args):
    o, l, d = out, lse, d_out
    if layout == 'cols':
      o, l, d = (_cols_of_rows(a, n, m) for a in (o, l, d))
    pad = lambda x, q=q: flash._pad(x, 2, q.shape[2])
    d_q, d_window, d_extra = _flash_backward(part_static, seed, q, window,
                                             extra, pad(o), pad(l), pad(d))
    cotangents.append((None, d_q, with_flags(d_window), with_flags(d_extra)))
  return tuple(cotangents), None


_joint_core.defvjp(_joint_fwd, _joint_bwd)


def _joint(queries: dict[str, Array], keys: dict[str, list[Keys]], n: int,
           m: int, t: int, dropout_rate: float = 0.0,
           seeds: Optional[Seeds] = None) -> Array:
  """One softmax per query over keys seen in row-major and column-major order.

  Args:
    queries: 'rows' (and 'cols' if used): the queries of the n x m grid,
      `[B, H, n*m, d]`, in row-major (column-major) order.
    keys: per layout, at most two `Keys` sets in that layout's order.
    n, m: the grid (for the sequence of `fixed`: n = 1, m = N).
    t: the tile.
    dropout_rate: attention dropout on the direct keys' weights.
    seeds: the dropout seeds (with `dropout_rate`).

  Returns:
    `[B, H, n*m, dv]` row-major, in the queries' dtype; zero for a query
    without a valid key.
  """
  statics, args, seen, seeds_used = [], [], [], []
  for layout in ('rows', 'cols'):
    sets = keys.get(layout, [])
    if dropout_rate:  # Direct keys drop, summaries do not: separate calls.
      groups = [([s for s in sets if s.direct], dropout_rate),
                ([s for s in sets if not s.direct], 0.0)]
    else:
      groups = [(sets, 0.0)]
    for group, rate in groups:
      if not group:
        continue
      window, extra = group[0], group[1] if len(group) > 1 else None
      q = queries[layout]
      # Each pass's own tile, fitted to its rules (`flash.fitted_block`).
      tp = flash.fitted_block(
          window.rule, extra.rule if extra is not None else None, t,
          q.shape[2], window.k.shape[2],
          extra.k.shape[2] if extra is not None else 0,
          rows=q.shape[0] * q.shape[1])
      statics.append((_static(window, extra, tp, q.shape[1], rate), layout))
      seeds_used.append(seeds.next() if rate else None)
      args.append((_pad_rows(q, tp), _pad_keys(window, tp),
                   _pad_keys(extra, tp)))
      flags = functools.reduce(jnp.logical_or, [
          _any_key(s, n * m) for s in group])
      if layout == 'cols':
        flags = jnp.swapaxes(flags.reshape(-1, m, n), 1, 2).reshape(-1, n * m)
      seen.append(flags)
  static = _JointStatic(tuple(statics), n, m)

  def local(first_row, args, seen, seeds):
    args = tuple((_seed_operand(seed, first_row), *a)
                 for seed, a in zip(seeds, args))
    return _joint_core(static, args, seen)
  # Once per batch shard inside a mesh (`mesh.batch_parallel`).
  out = mesh_lib.batch_parallel(local, (tuple(args), tuple(seen)),
                                (tuple(seeds_used),))
  value_width = next(s.v.shape[3] for sets in keys.values() for s in sets)
  return out[..., :value_width]


# -- layouts -----------------------------------------------------------------


def _heads_major(x: Array) -> Array:
  """`[B, N, H, d]` -> `[B, H, N, d]`."""
  return jnp.swapaxes(x, 1, 2)


def _grid_heads(x: Array) -> Array:
  """Grid `[B, n, m, H, d]` -> `[B, H, n, m, d]`."""
  return jnp.transpose(x, (0, 3, 1, 2, 4))


def _rows(x: Array) -> Array:
  """`[B, H, n, m, d]` -> row-major `[B, H, n*m, d]`."""
  b, h, n, m = x.shape[:4]
  return x.reshape(b, h, n * m, *x.shape[4:])


def _cols(x: Array) -> Array:
  """`[B, H, n, m, d]` -> column-major `[B, H, m*n, d]`."""
  b, h, n, m = x.shape[:4]
  return jnp.swapaxes(x, 2, 3).reshape(b, h, m * n, *x.shape[4:])


def _flag_rows(x: Array) -> Array:
  """bool `[B, n, m]` -> `[B, n*m]`."""
  return x.reshape(x.shape[0], -1)


def _flag_cols(x: Array) -> Array:
  """bool `[B, n, m]` -> `[B, m*n]`."""
  return jnp.swapaxes(x, 1, 2).reshape(x.shape[0], -1)


def _stack_rows(parts: list[Array]) -> Array:
  """Per-position arrays `[B, H, n, m, d]` -> `[B, H, n*K*m, d]`, the K
  kinds side by side in each row (`GroupRule(m, K)`)."""
  x = jnp.stack(parts, axis=3)
  b, h, n, k, m = x.shape[:5]
  return x.reshape(b, h, n * k * m, *x.shape[5:])


def _stack_cols(parts: list[Array]) -> Array:
  """Per-position arrays `[B, H, n, m, d]` -> `[B, H, m*K*n, d]`, the K
  kinds side by side in each column (`GroupRule(n, K)`)."""
  return _stack_rows([jnp.swapaxes(p, 2, 3) for p in parts])


def tile(length: int, widths: tuple[int, ...], dtype,
         block: Optional[int] = None) -> int:
  """The kernels' tile for `length` positions of heads `widths` wide
  (queries and keys, values) in `dtype` (`flash.tile_size`, within
  `flash.max_block`)."""
  width = max(_width(w) for w in widths)
  return flash.tile_size(length, flash.max_block(width, dtype, block or BLOCK))


# -- Combiner-Fixed ----------------------------------------------------------


def _drop(w: Array, rate: float, seed: Optional[Array], *index: Array
          ) -> Array:
  """Attention dropout on XLA-computed weights `w` `[B, H, a, b]`, with
  flash's keep mask over (batch, head, `index` = (query, key))."""
  if not rate:
    return w
  batch, heads = w.shape[:2]
  keep = flash.keep_mask(seed, jnp.arange(batch)[:, None, None, None],
                         jnp.arange(heads)[None, :, None, None], *index,
                         flash.WINDOW_PART, heads, rate)
  return jnp.where(keep, w / (1.0 - rate), 0.0)


def _fixed_rules(block_size: int, causal: bool
                 ) -> tuple[flash.Window, flash.Extra]:
  """Combiner-Fixed's rules: its own block directly, the other (LM:
  earlier) blocks through their summaries."""
  return (flash.Window('segment', size=block_size, causal=causal),
          flash.Extra('earlier_group' if causal else 'other_group',
                      key_group=1, query_group=block_size))


def fixed_length(length: int, *, block_size: int, causal: bool, rows: int,
                 head_dim: int, dtype, block: Optional[int] = None) -> int:
  """The length a layer pads its input to, once, so that `fixed` pads
  nothing without dropout: a multiple of the block size s and of the
  call's tile (`flash.aligned_length`); `rows` = batch x heads, `head_dim`
  the queries' and values' width, `dtype` the queries'. (With dropout the
  direct and summary keys take `_joint`'s heads-major passes, which pad
  to their own tiles.)"""
  rules = _fixed_rules(block_size, causal)

  def tiles(n: int) -> list[int]:
    return [flash.call_tile(
        n, n, n // block_size, rules=rules, rows=rows, width=head_dim,
        dtype=dtype, block=tile(n, (head_dim,), dtype, block))]
  return flash.aligned_length(length, block_size, tiles)


def fixed(q: Array, k: Array, v: Array, pq: Array, pk: Array, real: Array, *,
          block_size: int, causal: bool, pool: str,
          dropout_rate: float = 0.0, dropout_seed: Optional[Array] = None,
          block: Optional[int] = None) -> Array:
  """Combiner-Fixed (docs/mechanisms/combiner.md §2.2).

  Args:
    q: scaled queries `[batch, length, heads, d]`.
    k, v: keys and values `[batch, length, heads, d]`.
    pq, pk: the pooled forms of queries and keys (q and k, or DeepSets).
    real: bool `[batch, length]`, True = real token.
    block_size: s.
    causal: LM form.
    pool: 'max' or 'mean'.
    dropout_rate: attention dropout (0: none).
    dropout_seed: uint32 or int32 scalar, with dropout.
    block: the kernels' tile (at most); None: `BLOCK`.

  Returns:
    `[batch, length, heads, dv]`; padded queries are not zeroed.
  """
  batch, length = real.shape
  blocks = -(-length // block_size)
  seeds = Seeds(dropout_seed if dropout_rate else None)

  # The model's layout throughout: [B, N, H, d] (flash reads it as it is).
  def split(x):  # [B, N, H, d] -> [B, blocks, s, H, d]
    x = flash._pad(x, 1, block_size)
    return x.reshape(x.shape[0], blocks, block_size, *x.shape[2:])

  member = flash._pad(real, 1, block_size).reshape(batch, blocks,
                                                   block_size, 1)
  q_span, _ = combiner_spans.masked_pool(split(pq), member[..., None],
                                         axis=2, kind=pool)
  k_span, has = combiner_spans.masked_pool(split(pk), member[..., None],
                                           axis=2, kind=pool)
  # Each block's local expectation with its pooled query: one query per
  # block, so a multiply-reduce (O(N d)), not a batch of 1-row matmuls.
  kb, vb = split(k), split(v)
  logits = jnp.sum(q_span[:, :, None].astype(jnp.float32)
                   * kb.astype(jnp.float32), axis=-1)  # [B, blocks, s, H]
  w = safe_softmax.safe_softmax(logits, member, axis=2)
  if dropout_rate:  # flash's keep mask over [B, H, blocks, s].
    w = jnp.moveaxis(_drop(jnp.moveaxis(w, 3, 1), dropout_rate, seeds.next(),
                           jnp.arange(blocks)[:, None],
                           jnp.arange(block_size)[None, :]), 1, 3)
  span_values = jnp.sum(w[..., None] * vb.astype(jnp.float32),
                        axis=2).astype(v.dtype)  # [B, blocks, H, d]
  window, rule = _fixed_rules(block_size, causal)
  has = has[:, :, 0, 0]
  t = tile(length, (q.shape[3], v.shape[3]), q.dtype, block)
  if not dropout_rate:
    return flash.flash_attention(
        q, k, v, real, window=window, extra=(k_span, span_values, has),
        extra_rule=rule, block=t, layout='bnhd')
  # Direct keys drop after the joint softmax, summaries do not: two calls
  # under one softmax (`_joint`, heads-major).
  hm = _heads_major
  direct = Keys(hm(k), hm(v), real, GroupRule(block_size, 1,
                                              'le' if causal else 'all'))
  spans = Keys(hm(k_span), hm(span_values), has, rule, direct=False)
  return hm(_joint({'rows': hm(q)}, {'rows': [direct, spans]}, 1, length, t,
                   dropout_rate, seeds))


# -- Combiner-Axial ----------------------------------------------------------


class _Grid(NamedTuple):
  """Heads-major grid arrays `[B, H, n, m, d]` and `real` `[B, n, m]`."""
  q: Array
  k: Array
  v: Array
  pq: Array
  pk: Array
  real: Array


def _spans(g: _Grid, axis: int, reverse: bool, pool: str, t: int,
           dropout_rate: float, seeds: Seeds) -> tuple[Array, Array, Array]:
  """Prefix (suffix) spans along the grid's `axis` (2: up a column, 3: left
  in a row), excluding the position itself.

  Returns:
    (abstraction keys `[B, H, n, m, d]`, local expectations `[B, H, n, m,
    dv]`, has a member `[B, n, m]`).
  """
  member = g.real[:, None, :, :, None]
  q_span, _ = combiner_spans.prefix_pool(g.pq, member, axis=axis,
                                         kind=pool, reverse=reverse)
  k_span, has = combiner_spans.prefix_pool(g.pk, member, axis=axis,
                                           kind=pool, reverse=reverse)
  n, m = g.real.shape[1:]
  rule = 'gt' if reverse else 'lt'
  seed = seeds.next() if dropout_rate else None
  if axis == 2:  # Along a column: column-major.
    keys = Keys(_cols(g.k), _cols(g.v), _flag_cols(g.real),
                GroupRule(n, 1, rule))
    out = _flash_attend(_cols(q_span), keys, t, dropout_rate, seed)
    b, h = out.shape[:2]
    out = jnp.swapaxes(out.reshape(b, h, m, n, -1), 2, 3)
  else:
    keys = Keys(_rows(g.k), _rows(g.v), _flag_rows(g.real),
                GroupRule(m, 1, rule))
    out = _flash_attend(_rows(q_span), keys, t, dropout_rate, seed)
    out = out.reshape(*out.shape[:2], n, m, -1)
  return k_span, out, has[:, 0, :, :, 0]


def _vertical_summaries(spans: Callable[..., Any], m: int, causal: bool
                        ) -> Keys:
  """Query (r, c) reaches column c' != c above (below) its row through the
  summary stored at (r, c'): the kinds side by side in each row."""
  parts = [spans(axis=2, reverse=False)]
  if not causal:
    parts.append(spans(axis=2, reverse=True))
  return Keys(_stack_rows([p[0] for p in parts]),
              _stack_rows([p[1] for p in parts]),
              _flag_rows(jnp.stack([p[2] for p in parts], 2)),
              GroupRule(m, len(parts), 'ne'), direct=False)


def _horizontal_summaries(spans: Callable[..., Any], n: int, causal: bool
                          ) -> Keys:
  """Query (r, c) reaches row r' != r (LM: r' < r) left (right) of its
  column through the summary stored at (r', c)."""
  parts = [spans(axis=3, reverse=False), spans(axis=3, reverse=True)]
  return Keys(_stack_cols([p[0] for p in parts]),
              _stack_cols([p[1] for p in parts]),
              _flag_rows(jnp.stack([jnp.swapaxes(p[2], 1, 2)
                                    for p in parts], 2)),
              GroupRule(n, 2, 'lt' if causal else 'ne'), direct=False)


def _rowmajor_summaries(g: _Grid, row_queries: Array, row_keys: Keys,
                        summary_key: Callable[[Array], Array], causal: bool,
                        t: int, dropout_rate: float, seeds: Seeds) -> Keys:
  """Rowmajor's summaries: full attention inside each row (its local
  expectation for every column), keyed by the learned abstraction keys
  (Flax, in the mechanism)."""
  n, m = g.real.shape[1:]
  full_rows = row_keys._replace(rule=GroupRule(m, 1, 'all'))
  row_out = _flash_attend(row_queries, full_rows, t, dropout_rate,
                          seeds.next() if dropout_rate else None)
  row_out = row_out.reshape(*g.q.shape[:4], -1)
  key = _grid_heads(summary_key(jnp.transpose(row_out, (0, 2, 3, 1, 4))))
  has = jnp.broadcast_to(jnp.any(g.real, axis=2)[:, :, None], g.real.shape)
  return Keys(_cols(key), _cols(row_out), _flag_cols(has),
              GroupRule(n, 1, 'lt' if causal else 'ne'), direct=False)


def axial(q: Array, k: Array, v: Array, pq: Array, pk: Array, real: Array, *,
          plan: str, row_length: int, offset: int, causal: bool, pool: str,
          summary_key: Optional[Callable[[Array], Array]] = None,
          mixture_mode: Optional[str] = None, dropout_rate: float = 0.0,
          dropout_seed: Optional[Array] = None,
          block: Optional[int] = None) -> Array:
  """Combiner-Axial and -Mixture (docs/mechanisms/combiner.md §2.2).

  Args:
    q: scaled queries `[batch, length, heads, d]`.
    k, v: keys and values `[batch, length, heads, d]`.
    pq, pk: the pooled forms of queries and keys (q and k, or DeepSets).
    real: bool `[batch, length]`, True = real token.
    plan: 'vertical', 'horizontal', 'rowmajor' or 'mixture' (of the
      vertical and horizontal plans).
    row_length: m.
    offset: leading grid cells before the sequence (prefix tokens).
    causal: LM form.
    pool: 'max' or 'mean' (not used by rowmajor).
    summary_key: rowmajor only: row outputs on the grid `[B, n, m, H, dv]`
      -> their learned abstraction keys `[B, n, m, H, d]`.
    mixture_mode: mixture only: 'average' or 'joint_softmax'.
    dropout_rate: attention dropout (0: none).
    dropout_seed: uint32 or int32 scalar, with dropout.
    block: the kernels' tile (at most); None: `BLOCK`.

  Returns:
    `[batch, length, heads, dv]`; padded queries are not zeroed.
  """
  grid = lambda a: combiner_spans.to_grid(a, offset, row_length)
  g = _Grid(_grid_heads(grid(q)), _grid_heads(grid(k)), _grid_heads(grid(v)),
            None, None, grid(real))
  g = g._replace(pq=g.q if pq is q else _grid_heads(grid(pq)),
                 pk=g.k if pk is k else _grid_heads(grid(pk)))
  n, m = g.real.shape[1:]
  t = tile(n * m, (g.q.shape[4], g.v.shape[4]), g.q.dtype, block)
  seeds = Seeds(dropout_seed if dropout_rate else None)
  spans = functools.partial(_spans, g, pool=pool, t=t,
                            dropout_rate=dropout_rate, seeds=seeds)
  row_keys = Keys(_rows(g.k), _rows(g.v), _flag_rows(g.real),
                  GroupRule(m, 1, 'le' if causal else 'all'))
  col_keys = Keys(_cols(g.k), _cols(g.v), _flag_cols(g.real),
                  GroupRule(n, 1, 'lt' if causal else 'ne'))
  queries = {'rows': _rows(g.q), 'cols': _cols(g.q)}

  joint = lambda keys: _joint({layout: queries[layout] for layout in keys},
                              keys, n, m, t, dropout_rate, seeds)

  vertical = lambda: _vertical_summaries(spans, m, causal)
  horizontal = lambda: _horizontal_summaries(spans, n, causal)
  if plan == 'vertical':
    out = joint({'rows': [row_keys, vertical()], 'cols': [col_keys]})
  elif plan == 'horizontal':
    out = joint({'rows': [row_keys], 'cols': [col_keys, horizontal()]})
  elif plan == 'rowmajor':
    summaries = _rowmajor_summaries(g, queries['rows'], row_keys, summary_key,
                                    causal, t, dropout_rate, seeds)
    out = joint({'rows': [row_keys], 'cols': [summaries]})
  elif plan == 'mixture':
    v_spans, h_spans = vertical(), horizontal()
    if mixture_mode == 'joint_softmax':
      out = joint({'rows': [row_keys, v_spans], 'cols': [col_keys, h_spans]})
    else:  # 'average': each plan normalised on its own.
      out = 0.5 * (joint({'rows': [row_keys, v_spans], 'cols': [col_keys]})
                   + joint({'rows': [row_keys], 'cols': [col_keys, h_spans]}))
  else:
    raise ValueError(f'Unknown axial plan {plan!r}.')
  out = jnp.transpose(out.reshape(*g.q.shape[:4], -1), (0, 2, 3, 1, 4))
  return combiner_spans.from_grid(out, offset, real.shape[1])
