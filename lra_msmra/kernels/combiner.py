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
  joint softmax is split in two passes: one along the rows (each row a
  line of the call: own row, and summaries stored in the row) and one
  along the columns (own column, and summaries stored in the column),
  each a flash kernel with a `GroupRule` mask within the line. Their
  outputs and log-sum-exps are merged per query (`_joint`), and the
  backward pass runs each pass's flash backward kernels with the merged
  output and log-sum-exp, which is the gradient of the one joint softmax.
  The local expectations of the vertical (column above / below) and
  horizontal (row left / right) spans are themselves attentions with
  strict prefix or suffix masks, both directions of a line in one flash
  call (`Sides`), their pooled queries and keys one kernel on GPUs
  (`span_pools`); rowmajor's row summaries are a flash call over full
  rows, its learned summary key stays in the mechanism (Flax). Mixture's
  'joint_softmax' is one joint softmax over both plans' summaries (the
  vertical ones stored in rows, the horizontal ones in columns); 'average'
  is the mean of two.

Everything else (projections, DeepSets maps, the grid and its padding,
Fixed's pooling, the span pools on TPUs) is the mechanism's own code, so
variables and the function are those of `'xla'`. The layer sows nothing in
either implementation.

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

Layout: every call reads the model's layout `[B, N, H, d]` as it lies
(flash's `layout='bnhd'`), with no transposed copy. Fixed is one call over
the sequence (with dropout, two calls over a grid of one row). Axial and
Mixture reshape the sequence into the grid `[B, n, m, H, d]`, whose sides
are whole tiles (`grid_shape`; the layer pads its input to it once,
`axial_length`): a pass along the rows is a call over B * n lines of m,
one along the columns a call over B * m lines of n that reads the grid
with `fold=m` (`flash._Static`). Only per-query statistics (log-sum-exps,
validity flags) change order between the two.

Until `flash` exposes a joint softmax over several calls (its log-sum-exp as
a differentiable output) and mask rules beyond its `Window` / `Extra`, this
module drives flash's kernels directly (`_joint_fwd`, `_joint_bwd` and
`_attend`).
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
from lra_msmra.kernels import span_pools

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
    # The first and last members with a valid key (reductions, no scan).
    member = lax.broadcasted_iota(jnp.int32, per_member.shape, 2)
    first = jnp.min(jnp.where(per_member > 0, member, self.queries), -1,
                    keepdims=True)
    last = jnp.max(jnp.where(per_member > 0, member, -1), -1, keepdims=True)
    seen = {'all': total + 0 * per_member > 0,
            'ne': total - per_member > 0,
            'le': first <= member,
            'lt': first < member,
            'gt': last > member}[self.relation]
    seen = seen.reshape(batch, groups * self.queries)
    return jnp.pad(seen, [(0, 0), (0, max(queries - seen.shape[1], 0))]
                   )[:, :queries]


class Sides(NamedTuple):
  """A line's prefix and suffix spans in one call: queries 0..q-1 see the
  keys strictly before their own position ('lt'), queries q..2q-1 (the
  same positions again) the keys strictly after it ('gt').

  A flash mask rule (`GroupRule`'s protocol). Each query's keys, and each
  key's queries, are one interval whose ends never decrease
  (`intervals`): a key j is seen by queries j+1 .. q+j-1.
  """
  queries: int

  def intervals(self) -> bool:
    return True

  def _own(self, i: Array) -> tuple[Array, Array]:
    upper = i >= self.queries
    return upper, jnp.where(upper, i - self.queries, i)

  def visible_counts(self, i: Array, n: int) -> Array:
    upper, c = self._own(i)
    return jnp.where(upper, jnp.clip(n - c - 1, 0, n), jnp.minimum(c, n))

  def mask(self, i: Array, j: Array) -> Array:
    # Logical operations only: Mosaic does not select between boolean
    # vectors.
    upper, c = self._own(i)
    return (upper & (j > c)) | (~upper & (j < c))

  def key_range(self, i0: Array, i1: Array, n: int) -> tuple[Array, Array]:
    q = self.queries
    lo = jnp.where(i0 < q, 0, i0 - q + 1)
    hi = jnp.where(i1 >= q, n, i1)
    return jnp.clip(lo, 0, n), jnp.clip(hi, 0, n)

  def query_range(self, j0: Array, j1: Array, n: int) -> tuple[Array, Array]:
    q = self.queries
    return (jnp.clip(jnp.minimum(j0 + 1, q), 0, n),
            jnp.clip(q + jnp.minimum(j1, q), 0, n))


# -- flash's kernels over the lines of a grid --------------------------------
#
# The axial variants work on the grid `[B, n, m, H, d]`: the sequence in
# rows of m (the model's layout, reshaped). A pass attends along rows or
# along columns. flash reads either as it lies ('bnhd'): a row pass is a
# call over B * n rows of m positions (`[B * n, m, H, d]`), a column pass a
# call over B * m columns of n positions (`[B, n, m * H, d]` with
# `fold=m`, `flash._Static`), so no pass needs a transposed copy.

LAYOUTS = ('rows', 'cols')


class Keys(NamedTuple):
  """One set of keys of a pass along rows or columns of a grid.

  Attributes:
    k: keys, stored along the pass's lines: a row pass's `[B, n, L, H,
      d]` (L keys in each row), a column pass's `[B, L, m, H, d]` (L keys
      in each column).
    v: values, the same with their own width.
    valid: bool `[B, n, L]` (rows) or `[B, L, m]` (columns).
    rule: which of its line's keys a query sees, the query and key indices
      counted along the line (`GroupRule` over one group, or `flash.Extra`
      with `key_group=1`).
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


def _width(d: int) -> int:
  """A head dimension zero-padded to a power of two of at least 16, as
  Triton's matrix products need (flash's public function does the same)."""
  return flash.tile_size(d, 2**30)


def _view(x: Array, layout: str) -> Array:
  """A grid operand as the pass's flash operand ('bnhd'): `[B, n, L, H,
  w]` -> `[B * n, L, H, w]` (rows), `[B, L, m, H, w]` -> `[B, L, m * H,
  w]` (columns). Reshapes only."""
  if layout == 'rows':
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
  return x.reshape(*x.shape[:2], x.shape[2] * x.shape[3], x.shape[4])


def _unview(x: Array, layout: str, n: int, m: int) -> Array:
  """`_view`'s inverse, for `[.., L, .., w]` operands of the pass."""
  if layout == 'rows':
    return x.reshape(x.shape[0] // n, n, *x.shape[1:])
  return x.reshape(x.shape[0], x.shape[1], m, x.shape[2] // m, x.shape[3])


def _flag_view(valid: Array, layout: str) -> Array:
  """bool `[B, n, L]` -> `[B * n, L]` (rows); `[B, L, m]` -> `[B * m, L]`
  (columns: a small transpose of flags, not of activations)."""
  if layout == 'rows':
    return valid.reshape(-1, valid.shape[2])
  return jnp.swapaxes(valid, 1, 2).reshape(-1, valid.shape[1])


def _line(layout: str, n: int, m: int) -> int:
  """Positions per line of the pass: m along rows, n along columns."""
  return m if layout == 'rows' else n


def _fold(layout: str, m: int) -> int:
  return 1 if layout == 'rows' else m


def _stat_of_pass(x: Array, layout: str, n: int, m: int) -> Array:
  """A pass's per-query statistic `[B', H, line]` -> `[B, n, m, H]`."""
  heads = x.shape[1]
  if layout == 'rows':
    return jnp.swapaxes(x.reshape(-1, n, heads, m), 2, 3)
  return jnp.transpose(x.reshape(-1, m, heads, n), (0, 3, 1, 2))


def _stat_to_pass(x: Array, layout: str) -> Array:
  """`[B, n, m, H]` -> the pass's `[B', H, line]`."""
  b, n, m, heads = x.shape
  if layout == 'rows':
    return jnp.swapaxes(x, 2, 3).reshape(b * n, heads, m)
  return jnp.transpose(x, (0, 2, 3, 1)).reshape(b * m, heads, n)


def _any_key(keys: Keys, layout: str, n: int, m: int) -> Array:
  """bool `[B, n, m]`: whether each query sees a valid key of `keys`."""
  valid, line = _flag_view(keys.valid, layout), _line(layout, n, m)
  rule = keys.rule
  if isinstance(rule, GroupRule):
    seen = rule.any_key(valid, line)
  else:  # flash.Extra with one key per group of `query_group` queries.
    valid = valid.astype(jnp.int32)
    total = valid.sum(-1, keepdims=True)
    count = (total - valid if rule.kind == 'other_group'
             else jnp.cumsum(valid, -1) - valid)
    seen = jnp.repeat(count > 0, rule.query_group, axis=1)[:, :line]
  if layout == 'rows':
    return seen.reshape(-1, n, m)
  return jnp.swapaxes(seen.reshape(-1, m, n), 1, 2)


def _operand(x: Array, layout: str, t: int) -> Array:
  """The pass's flash operand of grid operand `x`: its lines padded to a
  multiple of the tile `t` (nothing to pad in an aligned grid), its heads
  to `_width`."""
  return flash._pad(flash._pad(_view(x, layout), 1, t), 3,
                    _width(x.shape[-1]))


def _key_operands(keys: Optional[Keys], layout: str, t: int):
  if keys is None:
    return None
  return (_operand(keys.k, layout, t), _operand(keys.v, layout, t),
          flash._flags(_flag_view(keys.valid, layout), t))


def _seed_operand(seed: Optional[Array], first_row: Array
                  ) -> Optional[Array]:
  """flash's `[1, 2]` dropout operand: the seed and the global index of the
  first batch row of this call (`mesh.batch_parallel`)."""
  if seed is None:
    return None
  return jnp.stack([seed, first_row]).reshape(1, 2)


class _Pass(NamedTuple):
  """One flash call of a grid: its `flash._Static` and its layout."""
  static: Any
  layout: str


def _pass(layout: str, window: Keys, extra: Optional[Keys], q: Array,
          largest: int, dropout_rate: float) -> _Pass:
  """The pass of queries `q` (grid `[B, n, m, H, d]`) over `window` (and
  `extra`) keys along `layout`'s lines, with the tile fitted to its rules
  (`flash.fitted_block`, at most `largest`)."""
  b, n, m, heads = q.shape[:4]
  axis = 2 if layout == 'rows' else 1
  line = _line(layout, n, m)
  # No tile beyond the line or its keys.
  largest = flash.tile_size(min(line, window.k.shape[axis]), largest)
  t = flash.fitted_block(
      window.rule, extra.rule if extra is not None else None, largest, line,
      window.k.shape[axis], extra.k.shape[axis] if extra is not None else 0,
      rows=b * (n if layout == 'rows' else m) * heads)
  return _Pass(flash._Static(
      window.rule, extra.rule if extra is not None else None, t,
      heads=heads, dropout_rate=float(dropout_rate), layout='bnhd',
      fold=_fold(layout, m)), layout)


def _arrays(keys: Optional[Keys]):
  """The arrays of `keys` (what a mesh splits by batch rows)."""
  return None if keys is None else (keys.k, keys.v, keys.valid)


def _with_arrays(keys: Optional[Keys], arrays) -> Optional[Keys]:
  return None if keys is None else keys._replace(
      k=arrays[0], v=arrays[1], valid=arrays[2])


def _pass_args(p: _Pass, first_row: Array, seed: Optional[Array], q: Array,
               window: Keys, extra: Optional[Keys]):
  """A pass's flash operands from its local (batch shard's) grid arrays:
  (seed operand, queries, window keys, extra keys). The dropout masks'
  batch row is the line's: example b's rows (columns) are b * n + r
  (b * m + c)."""
  n, m = q.shape[1:3]
  t = p.static.block
  lines = n if p.layout == 'rows' else m
  return (_seed_operand(seed, first_row * lines), _operand(q, p.layout, t),
          _key_operands(window, p.layout, t),
          _key_operands(extra, p.layout, t))


def _attend(q: Array, keys: Keys, layout: str, largest: int,
            dropout_rate: float = 0.0, seed: Optional[Array] = None
            ) -> Array:
  """Softmax attention of grid queries `q` `[B, n, m, H, d]` over `keys`
  along `layout`'s lines, differentiable: `[B, n, m, H, dv]`; once per
  batch shard inside a mesh (`mesh.batch_parallel`)."""
  p = _pass(layout, keys, None, q, largest, dropout_rate)
  n, m = q.shape[1:3]
  line, dv = _line(layout, n, m), keys.v.shape[-1]

  def local(first_row, q, arrays, seed):
    seed_arg, q_arg, window, _ = _pass_args(
        p, first_row, seed, q, _with_arrays(keys, arrays), None)
    out = flash._flash(p.static, seed_arg, q_arg, window, None)
    return _unview(out[:, :line], layout, n, m)
  out = mesh_lib.batch_parallel(local, (q, _arrays(keys)), (seed,))
  return out[..., :dv]


# -- one softmax over several passes -----------------------------------------


class _JointStatic(NamedTuple):
  """The passes (`_Pass`) and the grid n x m."""
  passes: tuple
  n: int
  m: int


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _joint_core(static: _JointStatic, args, seen):
  """The merged output `[B, n, m, H, dv]` (dv padded as the values are) of
  the passes' flash operands `args` (`_pass_args`); `seen`: per pass,
  bool `[B, n, m]`, whether a query sees a valid key in it."""
  return _joint_fwd(static, args, seen)[0]


def _joint_fwd(static, args, seen):
  n, m = static.n, static.m
  parts = []
  for p, (seed, q, window, extra), part_seen in zip(static.passes, args,
                                                     seen):
    out, lse = flash._forward(p.static, seed, q, window, extra)
    line = _line(p.layout, n, m)
    out = _unview(out[:, :line], p.layout, n, m).astype(jnp.float32)
    lse = _stat_of_pass(lse[:, :, :line, 0], p.layout, n, m)
    parts.append((out, lse, part_seen[..., None]))
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
  d_out = d_out.astype(out.dtype)
  with_flags = lambda g: None if g is None else (*g, None)
  cotangents = []
  for p, (seed, q, window, extra) in zip(static.passes, args):
    lines = lambda x, q=q: flash._pad(x, 1, q.shape[1])
    o, d = lines(_view(out, p.layout)), lines(_view(d_out, p.layout))
    stat = flash._pad(_stat_to_pass(lse, p.layout), 2, q.shape[1])
    d_q, d_window, d_extra = flash._backward(p.static, seed, q, window,
                                             extra, o, stat[..., None], d)
    cotangents.append((None, d_q, with_flags(d_window), with_flags(d_extra)))
  return tuple(cotangents), None


_joint_core.defvjp(_joint_fwd, _joint_bwd)


def _joint(queries: dict[str, Array], keys: dict[str, list[Keys]],
           largest: int, dropout_rate: float = 0.0,
           seeds: Optional[Seeds] = None) -> Array:
  """One softmax per query over keys seen along rows and along columns.

  Args:
    queries: per layout used in `keys`, the grid's queries `[B, n, m, H,
      d]` (the same array, or different ones).
    keys: per layout, at most two `Keys` sets along its lines.
    largest: the tile, at most (each pass fits its own).
    dropout_rate: attention dropout on the direct keys' weights.
    seeds: the dropout seeds (with `dropout_rate`).

  Returns:
    `[B, n, m, H, dv]`, in the queries' dtype; zero for a query without a
    valid key.
  """
  passes, operands, seen, seeds_used, sets_used = [], [], [], [], []
  for layout in LAYOUTS:
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
      n, m = q.shape[1:3]
      passes.append(_pass(layout, window, extra, q, largest, rate))
      seeds_used.append(seeds.next() if rate else None)
      operands.append((q, _arrays(window), _arrays(extra)))
      sets_used.append((window, extra))
      seen.append(functools.reduce(jnp.logical_or, [
          _any_key(s, layout, n, m) for s in group]))
  static = _JointStatic(tuple(passes), n, m)

  def local(first_row, operands, seen, seeds):
    args = tuple(
        _pass_args(p, first_row, seed, q, _with_arrays(w, w_arrays),
                   _with_arrays(x, x_arrays))
        for p, (q, w_arrays, x_arrays), (w, x), seed
        in zip(passes, operands, sets_used, seeds))
    return _joint_core(static, args, seen)
  # Once per batch shard inside a mesh (`mesh.batch_parallel`).
  out = mesh_lib.batch_parallel(local, (tuple(operands), tuple(seen)),
                                (tuple(seeds_used),))
  value_width = next(s.v.shape[-1] for sets in keys.values() for s in sets)
  return out[..., :value_width]


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
  direct and summary keys take `_joint`'s passes, which pad to their own
  tiles where they need to.)"""
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
  # under one softmax (`_joint`), over a grid of one row.
  row = lambda x: x[:, None]
  direct = Keys(row(k), row(v), row(real),
                GroupRule(block_size, 1, 'le' if causal else 'all'))
  spans = Keys(row(k_span), row(span_values), row(has), rule, direct=False)
  return _joint({'rows': row(q)}, {'rows': [direct, spans]}, t,
                dropout_rate, seeds)[:, 0]


# -- Combiner-Axial ----------------------------------------------------------


class _Grid(NamedTuple):
  """Grid arrays `[B, n, m, H, d]` (the model's layout in rows of m) and
  `real` `[B, n, m]`."""
  q: Array
  k: Array
  v: Array
  pq: Array
  pk: Array
  real: Array


def grid_shape(length: int, *, row_length: int, offset: int,
               widths: tuple[int, ...], dtype,
               block: Optional[int] = None) -> tuple[int, int]:
  """The grid (rows, columns) the kernels run `length` positions on, after
  `offset` leading cells, in rows of `row_length`: each axis a multiple of
  the largest tile its passes may take (`tile`), so that no pass pads its
  lines. The columns beyond `row_length` (a row shorter than a tile) and
  the rows beyond the sequence hold no real token."""
  def whole(size: int) -> int:  # Whole tiles.
    t = tile(size, widths, dtype, block)
    return -(-size // t) * t
  return whole(-(-(offset + length) // row_length)), whole(row_length)


def axial_length(length: int, *, row_length: int, offset: int,
                 head_dim: int, dtype, block: Optional[int] = None) -> int:
  """The length a layer pads its input to, once, so that `axial`'s grid
  only reshapes it (and puts the `offset` leading cells before it): whole
  rows of `grid_shape`; `head_dim` the queries' and values' width, `dtype`
  the queries'."""
  rows, _ = grid_shape(length, row_length=row_length, offset=offset,
                       widths=(head_dim,), dtype=dtype, block=block)
  return rows * row_length - offset


def _spans(g: _Grid, axis: int, both: bool, pool: str, largest: int,
           dropout_rate: float, seeds: Seeds
           ) -> list[tuple[Array, Array, Array]]:
  """The prefix spans along the grid's `axis` (1: up a column, 2: left in
  a row), excluding the position itself, and with `both` the suffix spans
  too: their local expectations in one flash call (`Sides`).

  Returns:
    per kind (prefix, then suffix): (abstraction keys `[B, n, m, H, d]`,
    local expectations `[B, n, m, H, dv]`, has a member `[B, n, m]`).
  """
  n, m = g.real.shape[1:]
  layout = 'cols' if axis == 1 else 'rows'
  line = _line(layout, n, m)
  directions = span_pools.DIRECTIONS if both else span_pools.DIRECTIONS[:1]
  # Every pool of the pooled queries and keys in one kernel
  # (`span_pools`), on the pass's lines as they lie.
  width = g.pq.shape[-1]
  pooled = span_pools.pools(
      tuple(flash._pad(_view(x, layout), 3, _width(width))
            for x in (g.pq, g.pk)),
      _flag_view(g.real, layout), kind=pool, directions=directions,
      heads=g.pq.shape[3], fold=_fold(layout, m))
  pooled = [_unview(x, layout, n, m)[..., :width] for x in pooled]
  pools = [(pooled[k], pooled[len(directions) + k],
            _has_member(g.real, axis, direction))
           for k, direction in enumerate(directions)]
  rule = Sides(line) if both else GroupRule(line, 1, 'lt')
  queries = jnp.concatenate([p[0] for p in pools], axis=axis)
  seed = seeds.next() if dropout_rate else None
  out = _attend(queries, Keys(g.k, g.v, g.real, rule), layout, largest,
                dropout_rate, seed)
  outs = jnp.split(out, len(pools), axis=axis)
  return [(k_span, o, has) for (_, k_span, has), o in zip(pools, outs)]


def _has_member(real: Array, axis: int, direction: str) -> Array:
  """bool `[B, n, m]`: whether a position's prefix (suffix) span along
  `axis` holds a real member: it lies after the first (before the last)
  real one."""
  index = lax.broadcasted_iota(jnp.int32, real.shape, axis)
  size = real.shape[axis]
  if direction == 'prefix':
    first = jnp.min(jnp.where(real, index, size), axis=axis, keepdims=True)
    return index > first
  last = jnp.max(jnp.where(real, index, -1), axis=axis, keepdims=True)
  return index < last


def _vertical_summaries(spans: Callable[..., Any], causal: bool) -> Keys:
  """Query (r, c) reaches column c' != c above (below) its row through the
  summary stored at (r, c'): the kinds side by side in each row."""
  parts = spans(axis=1, both=not causal)
  row = lambda i: jnp.concatenate([p[i] for p in parts], axis=2)
  return Keys(row(0), row(1), row(2),
              GroupRule(parts[0][2].shape[2], len(parts), 'ne'),
              direct=False)


def _horizontal_summaries(spans: Callable[..., Any], causal: bool) -> Keys:
  """Query (r, c) reaches row r' != r (LM: r' < r) left (right) of its
  column through the summary stored at (r', c): the kinds one after the
  other in each column."""
  parts = spans(axis=2, both=True)
  column = lambda i: jnp.concatenate([p[i] for p in parts], axis=1)
  return Keys(column(0), column(1), column(2),
              GroupRule(parts[0][2].shape[1], 2, 'lt' if causal else 'ne'),
              direct=False)


def _rowmajor_summaries(g: _Grid, summary_key: Callable[[Array], Array],
                        causal: bool, largest: int, dropout_rate: float,
                        seeds: Seeds) -> Keys:
  """Rowmajor's summaries: full attention inside each row (its local
  expectation for every column), keyed by the learned abstraction keys
  (Flax, in the mechanism); row r's is stored in every column at row r."""
  n, m = g.real.shape[1:]
  row_out = _attend(g.q, Keys(g.k, g.v, g.real, GroupRule(m, 1, 'all')),
                    'rows', largest, dropout_rate,
                    seeds.next() if dropout_rate else None)
  has = jnp.broadcast_to(jnp.any(g.real, axis=2)[:, :, None], g.real.shape)
  return Keys(summary_key(row_out), row_out, has,
              GroupRule(n, 1, 'lt' if causal else 'ne'), direct=False)


def axial(q: Array, k: Array, v: Array, pq: Array, pk: Array, real: Array, *,
          plan: str, row_length: int, offset: int, causal: bool, pool: str,
          summary_key: Optional[Callable[..., Array]] = None,
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
    summary_key: rowmajor only: `summary_key(row_out, grid)`: the row
      outputs on the grid `[B, n, m, H, dv]` -> their learned abstraction
      keys `[B, n, m, H, d]`, where `grid` puts a `[B, length, ...]` array
      on the same grid.
    mixture_mode: mixture only: 'average' or 'joint_softmax'.
    dropout_rate: attention dropout (0: none).
    dropout_seed: uint32 or int32 scalar, with dropout.
    block: the kernels' tile (at most); None: `BLOCK`.

  Returns:
    `[batch, length, heads, dv]`; padded queries are not zeroed.
  """
  widths = (q.shape[3], v.shape[3])
  rows, columns = grid_shape(real.shape[1], row_length=row_length,
                             offset=offset, widths=widths, dtype=q.dtype,
                             block=block)
  grid = lambda a: combiner_spans.to_grid(a, offset, row_length, rows,
                                          columns)
  g = _Grid(grid(q), grid(k), grid(v), None, None, grid(real))
  g = g._replace(pq=g.q if pq is q else grid(pq),
                 pk=g.k if pk is k else grid(pk))
  largest = tile(max(rows, columns), widths, q.dtype, block)
  seeds = Seeds(dropout_seed if dropout_rate else None)
  spans = functools.partial(_spans, g, pool=pool, largest=largest,
                            dropout_rate=dropout_rate, seeds=seeds)
  row_keys = Keys(g.k, g.v, g.real,
                  GroupRule(columns, 1, 'le' if causal else 'all'))
  col_keys = Keys(g.k, g.v, g.real,
                  GroupRule(rows, 1, 'lt' if causal else 'ne'))

  joint = lambda keys: _joint({layout: g.q for layout in keys}, keys,
                              largest, dropout_rate, seeds)

  vertical = lambda: _vertical_summaries(spans, causal)
  horizontal = lambda: _horizontal_summaries(spans, causal)
  if plan == 'vertical':
    out = joint({'rows': [row_keys, vertical()], 'cols': [col_keys]})
  elif plan == 'horizontal':
    out = joint({'rows': [row_keys], 'cols': [col_keys, horizontal()]})
  elif plan == 'rowmajor':
    summaries = _rowmajor_summaries(
        g, lambda row_out: summary_key(row_out, grid), causal, largest,
        dropout_rate, seeds)
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
  return combiner_spans.from_grid(out, offset, real.shape[1], row_length)
