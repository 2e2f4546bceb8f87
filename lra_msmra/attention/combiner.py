r"""Combiner: full attention at sparse cost (registry entry `combiner`).

Paper: H. Ren et al., "Combiner: Full Attention Transformer with Sparse
Computation Cost", NeurIPS 2021, arXiv:2107.05768. Official code:
google-research/google-research `combiner/` (Flax and TF1, causal only, no
padding). docs/mechanisms/combiner.md §2, §3, §4, §5, §6, §7 and §8
give, in that order, the framework and the exact supports of every variant,
the choices made where paper and code are silent, the departures from the
code, padding and lengths, the causal form, the memory layout and the
invariants the tests check.

Every query's support is split into a direct part, attended token by token,
and disjoint spans, each attended through one summary (paper Eq. 7): one
softmax per query over its direct logits and its span logits (Eq. 9), and
per span a local expectation normalised inside the span with a pooled query
(`abstraction`: max, mean or DeepSets). A span's local expectation does not
depend on the query, so it is computed once per span.

`variant`: `'fixed'` (blocks of `block_size`), `'logsparse'` (dyadic
blocks), `'axial'` (an n x m grid of rows of `row_length`; `axial_plan`
`'vertical'`, `'horizontal'` or `'rowmajor'`) or `'mixture'` (of the
vertical and horizontal plans; `mixture_mode`), each in causal (LM) and
bidirectional (MLM) form. `'learnable'` raises NotImplementedError. Sizes
default to the power of two nearest to sqrt(N) (`default_block_size`); N is
padded internally to the blocks or the grid and cropped back.
`num_prefix_tokens` puts a leading CLS token at the end of an extra first
grid row.

Padding: inputs at padded positions are zeroed before the projections,
padded keys are masked in every term and every pooling, padded queries are
left out of query pooling and their head outputs are zero; `base.Attention`
then zeroes the layer's output there, W_o's bias included.

Layout: fixed, axial and mixture work on the grid `[B, rows, cols, H, d]`
(`_to_grid`; fixed: rows are blocks), logsparse on the flat sequence. The
terms of one joint softmax stay separate arrays (`base.safe_softmax_parts`).
Without a dropout mask, fixed runs one head at a time under
`jax.checkpoint` (`_per_head`), so per-query logits exist for one head
only, forward and backward; with dropout all heads run at once, so the
masks are drawn as `base.attention_dropout` draws them.

`implementation='pallas'` computes the fixed, axial (every plan) and
mixture variants, LM and MLM, every abstraction, with fused Pallas flash
kernels (`lra_msmra.kernels.combiner`): the same parameters and function,
no per-query logits outside a kernel tile; its dropout masks are the
kernels' hash, not `jax.random` bits. Logsparse is refused at construction.
`effective_attention` always runs the code here.

`CombinerAttention.effective_attention` returns the dense effective
attention E (`[B, H, N, N]`, y_i = sum_j E(i, j) v_j before the output
projection) by running the same code path with one-hot values;
`probe='coverage'` counts the terms of query i that contain key j. Both are
O(N^2), for analysis and tests.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Optional

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from lra_msmra.attention import base
from lra_msmra.kernels import combiner as fused
from lra_msmra.kernels import combiner_spans as spans
from lra_msmra.kernels import flash

Array = jax.Array

VARIANTS = ('fixed', 'logsparse', 'axial', 'mixture')
AXIAL_PLANS = ('vertical', 'horizontal', 'rowmajor')
MIXTURE_MODES = ('average', 'joint_softmax')
ABSTRACTIONS = ('max', 'mean', 'deepset-max', 'deepset-mean')
PROBES = ('weights', 'coverage')

# einsum patterns on the grid layout [batch, rows, cols, heads, dim]: queries
# (r, c) against keys of their own row (r, c') or of their own column (r', c).
_ROW_LOGITS = 'brchd,brkhd->brchk'
_ROW_APPLY = 'brchk,brkhd->brchd'
_COL_LOGITS = 'brchd,bschd->brchs'
_COL_APPLY = 'brchs,bschd->brchd'



# Shared with the fused kernels (`combiner_spans`).
_masked_pool = spans.masked_pool
_prefix_pool = spans.prefix_pool
_to_grid = spans.to_grid
_from_grid = spans.from_grid

def default_block_size(length: int) -> int:
  """The power of two nearest to sqrt(length) on a log scale (at least 1)."""
  if length <= 1:
    return 1
  return 1 << int(math.floor(0.5 * math.log2(length) + 0.5))


# ----------------------------------------------------------------- helpers


class _Ctx(NamedTuple):
  """What the term builders need from the layer."""
  causal: bool
  pool: str  # 'max' or 'mean', applied after the optional DeepSets map.
  probe: Optional[str]
  dropout: Callable[[Array], Array]
  stochastic: bool  # True when `dropout` draws masks (a Flax call).

  def normalise(self, logits: Array, valid: Array) -> Array:
    """Softmax over valid entries (float32), or their indicator (coverage)."""
    if self.probe == 'coverage':
      return jnp.broadcast_to(valid, logits.shape).astype(jnp.float32)
    return base.safe_softmax(logits, valid)


class _Term(NamedTuple):
  """A group of logits that enters the joint softmax of every query.

  Attributes:
    logits: float32 `[..., heads, terms]`.
    valid: bool, broadcastable to `logits`.
    apply: maps the group's weights to `[..., heads, value_dim]`.
    direct: direct terms get attention dropout after the joint softmax (span
      terms got theirs inside the local expectation).
  """
  logits: Array
  valid: Array
  apply: Callable[[Array], Array]
  direct: bool


def _logits(pattern: str, a: Array, b: Array) -> Array:
  return jnp.einsum(pattern, a, b, preferred_element_type=jnp.float32)


def _weigh(pattern: str, weights: Array, values: Array) -> Array:
  return jnp.einsum(pattern, weights.astype(values.dtype), values)


def _joint(terms: list[_Term], ctx: _Ctx) -> Array:
  """One softmax over all terms of each query (paper Eq. 9), then the sum.

  The terms stay separate arrays (`base.safe_softmax_parts`): concatenating
  them would add a second copy of every query's logits and of its validity
  mask.
  """
  if ctx.probe == 'coverage':
    weights = [jnp.broadcast_to(t.valid, t.logits.shape).astype(jnp.float32)
               for t in terms]
  else:
    weights = base.safe_softmax_parts([t.logits for t in terms],
                                      [t.valid for t in terms])
  out = None
  for term, w in zip(terms, weights):
    if term.direct:
      w = ctx.dropout(w)
    part = term.apply(w)
    out = part if out is None else out + part
  return out


def _relation(size: int, relation: str) -> np.ndarray:
  """Static bool `[size, size]` mask of (query index, key index) pairs."""
  i = np.arange(size)[:, None]
  j = np.arange(size)[None, :]
  masks = {'all': np.ones((size, size), bool), 'le': j <= i, 'lt': j < i,
           'gt': j > i, 'ne': j != i}
  return masks[relation]


def _row_keys(valid: Array, relation: np.ndarray) -> Array:
  """Validity of keys (r, c') for queries (r, c): `[B, n, m, 1, m]`.

  Args:
    valid: bool `[B, n, m]`, per key position (r, c').
    relation: static `[m, m]` mask over (c, c').
  """
  return valid[:, :, None, None, :] & relation[None, None, :, None, :]


def _col_keys(valid: Array, relation: np.ndarray) -> Array:
  """Validity of keys (r', c) for queries (r, c): `[B, n, m, 1, n]`.

  Args:
    valid: bool `[B, n, m]`, per key position (r', c).
    relation: static `[n, n]` mask over (r, r').
  """
  return (jnp.swapaxes(valid, 1, 2)[:, None, :, None, :]
          & relation[None, :, None, None, :])


def _row_term(q: Array, keys: Array, values: Array, valid: Array,
              direct: bool) -> _Term:
  """Queries (r, c) against keys/values indexed (r, c')."""
  return _Term(_logits(_ROW_LOGITS, q, keys), valid,
               lambda w: _weigh(_ROW_APPLY, w, values), direct)


def _col_term(q: Array, keys: Array, values: Array, valid: Array,
              direct: bool) -> _Term:
  """Queries (r, c) against keys/values indexed (r', c)."""
  return _Term(_logits(_COL_LOGITS, q, keys), valid,
               lambda w: _weigh(_COL_APPLY, w, values), direct)


class _Grid(NamedTuple):
  """Per-head arrays on the grid `[batch, rows, cols, heads, dim]`.

  Attributes:
    q: queries, already divided by sqrt(head_dim).
    k: keys.
    v: values (what the rowmajor abstraction key is computed from).
    values: what the weights are applied to (`v`, or one-hot probes).
    pq: pooled form of queries (q, or DeepSets phi(q)).
    pk: pooled form of keys.
    real: bool `[batch, rows, cols]`, True = real token.
  """
  q: Array
  k: Array
  v: Array
  values: Array
  pq: Array
  pk: Array
  real: Array


def _per_head(attend: Callable[[_Grid], Array], g: _Grid) -> Array:
  """`attend(g)`, one head at a time and recomputed for the backward pass.

  Heads never interact, so `attend` (grid arrays `[batch, rows, cols, heads,
  ...]` -> `[batch, rows, cols, heads, value_dim]`, pure JAX: no Flax calls,
  hence no dropout) runs under `lax.map` on one head per step (a heads axis
  of size 1), inside `jax.checkpoint`: the backward pass keeps only the grid
  arrays and rebuilds one head's logits and weights at a time, so no
  `[..., heads, terms]` array of the whole layer is ever stored. `g.v` (only
  read by rowmajor) is not passed on.
  """
  def one_head(head):
    pick = lambda a: lax.dynamic_slice_in_dim(a, head, 1, axis=3)
    q, k = pick(g.q), pick(g.k)
    # Without DeepSets pq and pk are q and k: slice them once, so that the
    # backward pass accumulates one gradient per array.
    head_grid = g._replace(q=q, k=k, v=None, values=pick(g.values),
                           pq=q if g.pq is g.q else pick(g.pq),
                           pk=k if g.pk is g.k else pick(g.pk))
    return attend(head_grid)[:, :, :, 0]

  out = lax.map(jax.checkpoint(one_head), jnp.arange(g.q.shape[3]))
  return jnp.moveaxis(out, 0, 3)


# ------------------------------------------------------- partition builders


def _direct_terms(g: _Grid, ctx: _Ctx, column: bool) -> list[_Term]:
  """Own row (LM: up to the query) and optionally own column (no self)."""
  n, m = g.real.shape[1:]
  terms = [_row_term(g.q, g.k, g.values,
                     _row_keys(g.real, _relation(m, 'le' if ctx.causal
                                                 else 'all')), True)]
  if column:
    terms.append(_col_term(g.q, g.k, g.values,
                           _col_keys(g.real, _relation(n, 'lt' if ctx.causal
                                                       else 'ne')), True))
  return terms


def _fixed_terms(g: _Grid, ctx: _Ctx) -> list[_Term]:
  """Combiner-Fixed: rows of the grid are the blocks."""
  n = g.real.shape[1]
  member = g.real[..., None, None]
  q_span, _ = _masked_pool(g.pq, member, axis=2, kind=ctx.pool)
  k_span, has = _masked_pool(g.pk, member, axis=2, kind=ctx.pool)
  has = has[..., 0, 0]  # [B, n]
  # Local expectation of every block with its pooled query: [B, n, H, dv].
  w = ctx.normalise(_logits('brhd,brkhd->brhk', q_span, g.k),
                    g.real[:, :, None, :])
  span_values = _weigh('brhk,brkhd->brhd', ctx.dropout(w), g.values)
  valid = (has[:, None, None, None, :]
           & _relation(n, 'lt' if ctx.causal else 'ne')[None, :, None, None])
  span = _Term(_logits('brchd,bshd->brchs', g.q, k_span), valid,
               lambda w: _weigh('brchs,bshd->brchd', w, span_values), False)
  return _direct_terms(g, ctx, column=False) + [span]


def _column_spans(g: _Grid, ctx: _Ctx, below: bool) -> _Term:
  """Vertical plan: column c' above (below) the query's row, for c' != c."""
  n, m = g.real.shape[1:]
  member = g.real[..., None, None]
  q_span, _ = _prefix_pool(g.pq, member, axis=1, kind=ctx.pool, reverse=below)
  k_span, has = _prefix_pool(g.pk, member, axis=1, kind=ctx.pool,
                             reverse=below)
  # Local expectation at (r, c) of column c over rows above (below) r.
  w = ctx.normalise(_logits(_COL_LOGITS, q_span, g.k),
                    _col_keys(g.real, _relation(n, 'gt' if below else 'lt')))
  span_values = _weigh(_COL_APPLY, ctx.dropout(w), g.values)
  # Query (r, c) reaches column c' through the abstraction stored at (r, c').
  valid = _row_keys(has[..., 0, 0], _relation(m, 'ne'))
  return _row_term(g.q, k_span, span_values, valid, False)


def _row_half_spans(g: _Grid, ctx: _Ctx, right: bool) -> _Term:
  """Horizontal plan: row r' left (right) of the query's column, r' != r."""
  n, m = g.real.shape[1:]
  member = g.real[..., None, None]
  q_span, _ = _prefix_pool(g.pq, member, axis=2, kind=ctx.pool, reverse=right)
  k_span, has = _prefix_pool(g.pk, member, axis=2, kind=ctx.pool,
                             reverse=right)
  w = ctx.normalise(_logits(_ROW_LOGITS, q_span, g.k),
                    _row_keys(g.real, _relation(m, 'gt' if right else 'lt')))
  span_values = _weigh(_ROW_APPLY, ctx.dropout(w), g.values)
  # Query (r, c) reaches row r' through the abstraction stored at (r', c).
  valid = _col_keys(has[..., 0, 0], _relation(n, 'lt' if ctx.causal
                                              else 'ne'))
  return _col_term(g.q, k_span, span_values, valid, False)


def _vertical_terms(g: _Grid, ctx: _Ctx) -> list[_Term]:
  spans = [_column_spans(g, ctx, below=False)]
  if not ctx.causal:
    spans.append(_column_spans(g, ctx, below=True))
  return spans


def _horizontal_terms(g: _Grid, ctx: _Ctx) -> list[_Term]:
  return [_row_half_spans(g, ctx, right=False),
          _row_half_spans(g, ctx, right=True)]


def _rowmajor_terms(g: _Grid, ctx: _Ctx,
                    summary_key: Callable[[Array], Array]) -> list[_Term]:
  """Official rowmajor: per-column row summaries with a learned key."""
  n = g.real.shape[1]
  # Full (unmasked) attention inside each row with every query of the row.
  w = ctx.normalise(_logits(_ROW_LOGITS, g.q, g.k),
                    _row_keys(g.real, _relation(g.real.shape[2], 'all')))
  w = ctx.dropout(w)
  row_out = _weigh(_ROW_APPLY, w, g.v)
  span_values = row_out if ctx.probe is None else _weigh(_ROW_APPLY, w,
                                                         g.values)
  has = jnp.any(g.real, axis=2)  # [B, n]: the row has a real member.
  valid = (has[:, None, None, None, :]
           & _relation(n, 'lt' if ctx.causal else 'ne')[None, :, None, None])
  span = _col_term(g.q, summary_key(row_out), span_values, valid, False)
  return _direct_terms(g, ctx, column=False) + [span]


def _pair_swap(x: Array, block: int) -> Array:
  """Swaps adjacent `block`-sized blocks along axis 1 (block b <-> b XOR 1).

  `x.shape[1]` must be a multiple of 2 * block.
  """
  shape = x.shape
  x = x.reshape(shape[0], shape[1] // (2 * block), 2, block, *shape[2:])
  return jnp.flip(x, axis=2).reshape(shape)


def _pad_length(x: Array, length: int) -> Array:
  extra = length - x.shape[1]
  return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2))


class _SpanPools:
  """Masked pooling of queries and keys over dyadic blocks, level by level.

  Level l's block b holds positions [b 2^l, (b + 1) 2^l), and its pool is
  that of blocks 2b and 2b + 1 of level l - 1: the maximum of their maxima,
  or the sum of their sums over the sum of their counts, which equal the
  pools over the block's valid members (`_masked_pool`; the mean up to the
  order of float32 additions). `up` returns the next level.
  """

  def __init__(self, pq: Array, pk: Array, real: Array, kind: str):
    self.kind = kind
    valid = real[:, :, None, None]
    if kind == 'max':
      self.q = jnp.where(valid, pq, -jnp.inf)
      self.k = jnp.where(valid, pk, -jnp.inf)
    else:
      self.q = jnp.where(valid, pq.astype(jnp.float32), 0.0)
      self.k = jnp.where(valid, pk.astype(jnp.float32), 0.0)
    self.count = real.astype(jnp.float32)[:, :, None, None]
    self.dtype = pq.dtype

  def up(self, blocks: int) -> tuple[Array, Array, Array]:
    """The next level: pooled queries and keys `[B, blocks, H, d]` (0 for a
    block without a valid member) and `has` `[B, blocks, 1, 1]`, as
    `_masked_pool` gives them, with empty blocks appended up to `blocks`."""
    def halve(x, fill, reduce):
      x = jnp.pad(x, [(0, 0), (0, x.shape[1] % 2)] + [(0, 0)] * (x.ndim - 2),
                  constant_values=fill)
      pairs = x.reshape(x.shape[0], x.shape[1] // 2, 2, *x.shape[2:])
      pooled = reduce(pairs, axis=2)
      return jnp.pad(pooled, [(0, 0), (0, blocks - pooled.shape[1])]
                     + [(0, 0)] * (x.ndim - 2), constant_values=fill)

    if self.kind == 'max':
      self.q = halve(self.q, -jnp.inf, jnp.max)
      self.k = halve(self.k, -jnp.inf, jnp.max)
    else:
      self.q = halve(self.q, 0.0, jnp.sum)
      self.k = halve(self.k, 0.0, jnp.sum)
    self.count = halve(self.count, 0.0, jnp.sum)
    has = self.count > 0
    q, k = self.q, self.k
    if self.kind != 'max':
      q = q / jnp.maximum(self.count, 1.0)
      k = k / jnp.maximum(self.count, 1.0)
    return (jnp.where(has, q, 0).astype(self.dtype),
            jnp.where(has, k, 0).astype(self.dtype), has)


def _logsparse_terms(q: Array, k: Array, values: Array, pq: Array, pk: Array,
                     real: Array, ctx: _Ctx) -> list[_Term]:
  """Combiner-Logsparse on `[batch, length, heads, dim]` arrays."""
  batch, length = real.shape
  heads = q.shape[2]
  pos = np.arange(length)
  terms = [_Term(jnp.einsum('bnhd,bnhd->bnh', q, k,
                            preferred_element_type=jnp.float32)[..., None],
                 real[:, :, None, None],
                 lambda w: w.astype(values.dtype) * values, True)]
  if length > 1:
    # Level 0: the partner i XOR 1 is a direct term (LM: only i - 1).
    even = length + length % 2
    swap = lambda x: _pair_swap(_pad_length(x, even), 1)[:, :length]
    partner_ok = (pos ^ 1) < length
    if ctx.causal:
      partner_ok &= pos % 2 == 1
    partner_values = swap(values)
    terms.append(_Term(
        jnp.einsum('bnhd,bnhd->bnh', q, swap(k),
                   preferred_element_type=jnp.float32)[..., None],
        (swap(real) & partner_ok[None])[:, :, None, None],
        lambda w: w.astype(values.dtype) * partner_values, True))
  # Levels 1 .. ceil(log2 N) - 1: the sibling 2^l-block is one span. The
  # spans' abstractions are pooled level by level, each from the two halves
  # of the level below (`_SpanPools`): about two passes over the sequence in
  # all, not one per level.
  pools = _SpanPools(pq, pk, real, ctx.pool)
  for level in range(1, (length - 1).bit_length()):
    size = 1 << level
    padded = -(-length // (2 * size)) * (2 * size)
    blocks = padded // size

    def split(x, size=size, blocks=blocks, padded=padded):
      x = _pad_length(x, padded)
      return x.reshape(batch, blocks, size, *x.shape[2:])

    member = split(real)
    q_span, k_span, has = pools.up(blocks)
    w = ctx.normalise(_logits('bnhd,bnshd->bnhs', q_span, split(k)),
                      member[:, :, None, :])
    span_values = _weigh('bnhs,bnshd->bnhd', ctx.dropout(w), split(values))
    # The sibling of block b is block b XOR 1.
    k_sib = _pair_swap(k_span, 1)
    v_sib = jnp.repeat(_pair_swap(span_values, 1), size, axis=1)[:, :length]
    ok = _pair_swap(has[..., 0, 0], 1)
    if ctx.causal:  # Only odd blocks have their sibling on the left.
      ok &= (np.arange(blocks) % 2 == 1)[None]
    ok = jnp.repeat(ok, size, axis=1)[:, :length]
    logits = jnp.einsum('bnshd,bnhd->bnsh', split(q), k_sib,
                        preferred_element_type=jnp.float32)
    logits = logits.reshape(batch, padded, heads)[:, :length, :, None]
    terms.append(_Term(
        logits, ok[:, :, None, None],
        lambda w, v_sib=v_sib: w.astype(v_sib.dtype) * v_sib, False))
  return terms


# ------------------------------------------------------------------- module


class CombinerAttention(base.Attention):
  """Combiner attention (variants: docs/mechanisms/combiner.md §2).

  Attributes:
    variant: 'fixed', 'logsparse', 'axial' or 'mixture' ('learnable' raises
      NotImplementedError).
    block_size: fixed only: block size s; None = power of two nearest to
      sqrt(N).
    axial_plan: axial only: 'vertical', 'horizontal' or 'rowmajor' (None =
      'rowmajor', the paper's Figure 1(F) and the official code).
    row_length: axial and mixture: grid width m; None = power of two nearest
      to sqrt(N).
    num_prefix_tokens: axial and mixture: leading tokens (e.g. CLS) placed at
      the end of an extra first grid row, so the grid starts after them.
    mixture_mode: mixture only: 'average' (None, the paper) or
      'joint_softmax' (the official code).
    abstraction: 'max' (None, the paper), 'mean', 'deepset-max' or
      'deepset-mean'; not used by the rowmajor plan, whose abstraction is the
      code's learned projection.
    implementation: 'xla' (the code here) or 'pallas' (fixed, axial and
      mixture: `lra_msmra.kernels.combiner`).
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('fixed', {'variant': 'fixed'}),
      ('logsparse', {'variant': 'logsparse'}),
      ('axial-vertical', {'variant': 'axial', 'axial_plan': 'vertical'}),
      ('axial-horizontal', {'variant': 'axial', 'axial_plan': 'horizontal'}),
      ('axial-rowmajor', {'variant': 'axial', 'axial_plan': 'rowmajor'}),
      ('mixture-average', {'variant': 'mixture', 'mixture_mode': 'average'}),
      ('mixture-joint', {
          'variant': 'mixture', 'mixture_mode': 'joint_softmax'}),
  )

  variant: str = 'fixed'
  block_size: Optional[int] = None
  axial_plan: Optional[str] = None
  row_length: Optional[int] = None
  num_prefix_tokens: int = 0
  mixture_mode: Optional[str] = None
  abstraction: Optional[str] = None

  def check_knobs(self) -> None:
    """Raises on unknown values and on knobs the chosen variant ignores."""
    if self.variant == 'learnable':
      raise NotImplementedError(
          "Combiner variant 'learnable' (routing clusters, paper §4.4) is not "
          f'implemented; choose one of {VARIANTS}.')
    if self.variant not in VARIANTS:
      raise ValueError(f'Unknown Combiner variant {self.variant!r}; valid: '
                       f'{VARIANTS}.')

    def only_for(name, value, variants):
      if value is not None and self.variant not in variants:
        raise ValueError(
            f'Combiner knob {name}={value!r} is only used by variant(s) '
            f'{variants}, not {self.variant!r}; remove it.')

    only_for('block_size', self.block_size, ('fixed',))
    only_for('axial_plan', self.axial_plan, ('axial',))
    only_for('row_length', self.row_length, ('axial', 'mixture'))
    only_for('num_prefix_tokens', self.num_prefix_tokens or None,
             ('axial', 'mixture'))
    only_for('mixture_mode', self.mixture_mode, ('mixture',))
    for name in ('block_size', 'row_length'):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f'Combiner {name}={value!r} must be a positive int.')
    prefix = self.num_prefix_tokens
    if not isinstance(prefix, int) or prefix < 0:
      raise ValueError(f'Combiner num_prefix_tokens={prefix!r} must be a '
                       'non-negative int.')
    if self.axial_plan is not None and self.axial_plan not in AXIAL_PLANS:
      raise ValueError(f'Unknown axial_plan {self.axial_plan!r}; valid: '
                       f'{AXIAL_PLANS}.')
    if self.mixture_mode is not None and self.mixture_mode not in MIXTURE_MODES:
      raise ValueError(f'Unknown mixture_mode {self.mixture_mode!r}; valid: '
                       f'{MIXTURE_MODES}.')
    if self.abstraction is not None:
      if self.abstraction not in ABSTRACTIONS:
        raise ValueError(f'Unknown abstraction {self.abstraction!r}; valid: '
                         f'{ABSTRACTIONS}.')
      if self._plan() == 'rowmajor':
        raise ValueError(
            "axial_plan='rowmajor' abstracts rows with the official code's "
            f'learned projection; abstraction={self.abstraction!r} would be '
            "ignored. Remove it or use axial_plan='vertical'/'horizontal'.")
    if self.implementation == 'pallas':
      fused.check(variant=self.variant)

  def _plan(self) -> Optional[str]:
    if self.variant != 'axial':
      return None
    return self.axial_plan or 'rowmajor'

  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies Combiner attention; see `base.Attention.attend`.

    The head outputs of padded queries are zero, so W_o's bias alone would
    remain there, and the caller zeroes those rows (the padded-row rule of
    `base.Attention`).
    """
    return self._forward(x, padding_mask, deterministic, None)

  def effective_attention(self, x: Array, *,
                          padding_mask: Optional[Array] = None,
                          probe: str = 'weights') -> Array:
    """The dense effective attention matrix of the layer (O(N^2) memory).

    Args:
      x: `[batch, length, features]`.
      padding_mask: bool `[batch, length]`, True = real token.
      probe: 'weights': E(i, j), the weight of value j in output i (before the
        output projection), deterministic. 'coverage': every softmax replaced
        by the indicator of its valid entries, so E(i, j) is the number of
        terms of query i whose support contains key j.

    Returns:
      float32 `[batch, heads, length, length]`.
    """
    if probe not in PROBES:
      raise ValueError(f'Unknown probe {probe!r}; valid: {PROBES}.')
    return self._forward(x, padding_mask, True, probe)

  @nn.compact
  def _forward(self, x: Array, padding_mask: Optional[Array],
               deterministic: bool, probe: Optional[str]) -> Array:
    real = base.default_padding_mask(x, padding_mask)
    _, head_dim, out_features = self.head_dims(x)
    length = real.shape[1]
    width = self._width(length)
    if probe is None:  # Padded once for the whole layer (kernel tiles).
      x, real = base.pad_to_length(x, real,
                                   self.kernel('length')(x, width))
    batch = real.shape[0]
    # Zero padded inputs: then no term can read a padded token's content.
    x = jnp.where(real[..., None], x, 0).astype(self.dtype)
    q, k, v = self.project_qkv(x, scale_query=True)
    if probe is None:
      values = v
    else:
      values = jnp.broadcast_to(
          jnp.eye(length, dtype=jnp.float32)[None, :, None, :],
          (batch, length, self.num_heads, length))

    abstraction = self.abstraction or 'max'
    pq, pk = q, k
    if abstraction.startswith('deepset'):
      # phi(x) = ReLU(x W), one W per role, shared by the heads.
      deepset = lambda name: nn.DenseGeneral(
          head_dim, axis=-1, use_bias=False, kernel_init=self.kernel_init,
          dtype=self.dtype, param_dtype=jnp.float32, name=name)
      pq = nn.relu(deepset('deepset_query')(q))
      pk = nn.relu(deepset('deepset_key')(k))
    # The probes read the weights, which only the 'xla' code forms.
    combine = (self.kernel('combine') if probe is None else
               functools.partial(self.KERNELS['xla']['combine'], self))
    out = combine(x, q, k, v, values, pq, pk, real, deterministic,
                  abstraction.split('-')[-1], probe, width)
    out = out * real[:, :, None, None].astype(out.dtype)
    if probe is not None:
      return jnp.transpose(out, (0, 2, 1, 3)).astype(jnp.float32)
    return self.output_projection(out_features)(out)[:, :length]

  def _width(self, length: int) -> int:
    """Fixed's block size s, or axial's and mixture's row length m, for
    an input of `length` (before any padding)."""
    if self.variant == 'fixed':
      return self.block_size or default_block_size(length)
    return self.row_length or default_block_size(length)

  def _length_xla(self, x: Array, width: int) -> int:
    """The padded length: the input's (the grid pads what it needs)."""
    del width
    return x.shape[1]

  def _length_pallas(self, x: Array, width: int) -> int:
    """The padded length: Combiner-Fixed's, whole blocks and whole tiles
    of its kernel call (`lra_msmra.kernels.combiner.fixed_length`); the
    axial variants', whole rows of the kernels' grid
    (`lra_msmra.kernels.combiner.axial_length`)."""
    if self.variant != 'fixed':
      return fused.axial_length(
          x.shape[1], row_length=width,
          offset=(-self.num_prefix_tokens) % width,
          head_dim=self.head_dims(x)[1], dtype=self.dtype)
    return fused.fixed_length(
        x.shape[1], block_size=width, causal=self.causal,
        rows=x.shape[0] * self.num_heads, head_dim=self.head_dims(x)[1],
        dtype=self.dtype)

  def _combine_xla(self, x: Array, q: Array, k: Array, v: Array,
                   values: Array, pq: Array, pk: Array, real: Array,
                   deterministic: bool, pool: str, probe: Optional[str],
                   width: int) -> Array:
    """Every variant's terms under their softmaxes, in jax.numpy.

    Args:
      x: the zeroed inputs `[batch, length, features]` (rowmajor's keys).
      q, k, v, pq, pk: `[batch, length, heads, head_dim]`, q scaled; pq
        and pk are what the spans pool (the deepset maps' outputs, or q, k).
      values: v, or the identity under a probe (`effective_attention`).
      real: bool `[batch, length]`.
      deterministic: disables attention dropout.
      pool: 'max' or 'mean'.
      probe: None, or `effective_attention`'s probe.
      width: fixed's block size, axial's and mixture's row length
        (`_width`).

    Returns:
      `[batch, length, heads, dv]`, not zeroed at padded queries.
    """
    length = real.shape[1]
    ctx = _Ctx(causal=self.causal, pool=pool, probe=probe,
               dropout=lambda w: self.attention_dropout(w, deterministic),
               stochastic=not deterministic and self.dropout_rate > 0.0)

    if self.variant == 'logsparse':
      out = _joint(_logsparse_terms(q, k, values, pq, pk, real, ctx), ctx)
    else:
      offset = 0
      if self.variant != 'fixed':
        offset = (-self.num_prefix_tokens) % width
      grid = lambda a: _to_grid(a, offset, width)
      # One grid copy per distinct array: pq, pk and values are often q, k
      # and v themselves.
      gq, gk, gv = grid(q), grid(k), grid(v)
      g = _Grid(q=gq, k=gk, v=gv, values=gv if values is v else grid(values),
                pq=gq if pq is q else grid(pq), pk=gk if pk is k else grid(pk),
                real=grid(real))
      out = _from_grid(self._grid_attention(g, ctx, grid(x)), offset, length)
    return out

  def _grid_attention(self, g: _Grid, ctx: _Ctx, x_grid: Array) -> Array:
    """The fixed, axial and mixture variants on the grid layout."""
    if self.variant == 'fixed':
      attend = lambda g: _joint(_fixed_terms(g, ctx), ctx)
      return attend(g) if ctx.stochastic else _per_head(attend, g)
    if self.variant == 'mixture':
      direct = _direct_terms(g, ctx, column=True)
      vertical = _vertical_terms(g, ctx)
      horizontal = _horizontal_terms(g, ctx)
      if (self.mixture_mode or 'average') == 'joint_softmax':
        return _joint(direct + vertical + horizontal, ctx)
      return 0.5 * (_joint(direct + vertical, ctx)
                    + _joint(direct + horizontal, ctx))
    plan = self._plan()
    if plan == 'rowmajor':
      summary_key = self._row_summary_key(x_grid, g.q.shape[-1])
      return _joint(_rowmajor_terms(g, ctx, summary_key), ctx)
    spans = (_vertical_terms(g, ctx) if plan == 'vertical'
             else _horizontal_terms(g, ctx))
    return _joint(_direct_terms(g, ctx, column=True) + spans, ctx)

  def _row_summary_key(self, x_grid: Array, head_dim: int
                       ) -> Callable[[Array], Array]:
    """Rowmajor's learned abstraction key of row outputs on the grid
    `[B, n, m, H, dv]` (Dense(LN(x + Dense(row output)))), `x_grid` being
    the zeroed inputs on the grid `[B, n, m, features]`."""
    to_model = nn.DenseGeneral(
        x_grid.shape[-1], axis=(-2, -1), use_bias=self.use_bias,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        dtype=self.dtype, param_dtype=jnp.float32, name='row_summary_out')
    norm = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype,
                        param_dtype=jnp.float32, name='row_summary_norm')
    to_key = self.projection(head_dim, 'row_summary_key')
    return lambda row_out: to_key(norm(x_grid + to_model(row_out)))

  def _combine_pallas(self, x: Array, q: Array, k: Array, v: Array,
                      values: Array, pq: Array, pk: Array, real: Array,
                      deterministic: bool, pool: str, probe: Optional[str],
                      width: int) -> Array:
    """`_combine_xla` of fixed, axial and mixture as Pallas kernels
    (`lra_msmra.kernels.combiner`); `values` is v and `probe` None."""
    del values, probe
    drop = flash.layer_dropout(self, deterministic)
    if self.variant == 'fixed':
      return fused.fixed(q, k, v, pq, pk, real, block_size=width,
                         causal=self.causal, pool=pool, **drop)
    offset = (-self.num_prefix_tokens) % width
    summary_key = None
    if self._plan() == 'rowmajor':  # The kernels' grid of x.
      summary_key = lambda row_out, grid: self._row_summary_key(
          grid(x), q.shape[-1])(row_out)
    return fused.axial(q, k, v, pq, pk, real,
                       plan=self._plan() or self.variant, row_length=width,
                       offset=offset, causal=self.causal, pool=pool,
                       summary_key=summary_key,
                       mixture_mode=self.mixture_mode or 'average', **drop)

  # The kernel switch (`base.Attention.KERNELS`).
  KERNELS = {'xla': {'combine': _combine_xla, 'length': _length_xla},
             'pallas': {'combine': _combine_pallas,
                        'length': _length_pallas}}
