"""Composite Slice Attention (CSA), the attention of the CST (`cst`).

Paper: M. Lee et al., "Composite Slice Transformer: An Efficient Transformer
with Composition of Multi-Scale Multi-Range Attentions", ICLR 2023. No
official code is public; this module is written from the paper alone.
docs/mechanisms/cst.md §2, §3, §5, §6 and §8 give, in that order, the
equations, every choice made where the paper is silent, padding and
lengths, the causal form and the invariants the tests check; equation
numbers below are the paper's.

One layer (B batch, N length, D width, L = `slice_length`, n = N / L
slices, e = (alpha - 1) L / 2 tokens borrowed from each neighbour):

1. Slice: `[B, N, D] -> [B, n, L, D]`, N padded internally to a multiple
   of L and cropped back.
2. Local attention inside each slice (Eqs. 8, 14); keys and values extended
   into both neighbours (Eq. 11; left only when causal, Eq. 12), the fillers
   beyond the sequence ends masked (`extend_slices`).
3. Slice embeddings `[B, n, D]`: the mean of each slice's local output over
   its real tokens (`masked_slice_mean`; `aggregation` 'max' or 'linear'
   instead). An empty slice's embedding is zero under every aggregation,
   and the slice is masked as a global key.
4. Global attention among the slice embeddings (Eqs. 9, 15). Without
   attention dropout it runs a block of slices at a time
   (`base.blocked_attention`). Causal: inclusive-causal attention shifted by
   one slice. A query that sees no real slice (causal: slice 0, or a slice
   after nothing but padding) outputs zero, W_o's bias included.
5. Broadcast-add (Eq. 10); `base.Attention` zeroes padded positions.

One set of Q/K/V/O projections serves both attentions
(`share_local_global`). The MS-VIPE tables (`MultiScalePositions`, built
once per model through `shared_module` and passed to every layer as
`shared`) are added to the query and key inputs, never to the values; the
projected table rows are added after slicing, so the extended keys cost no
extra projection (`_project_table`). `composition`, `aggregation`, `alpha`
and `position_embedding` select the paper's ablations
(docs/mechanisms/cst.md §2.3).

Cost per layer and head: local logits `[n, L, alpha L]`, global logits
`[n, n]`; no array has two axes of size N.

Diagnostics: `slice_embedding` and `global_output` (`[B, n, D]`) are sown
into `intermediates`, the root-mean-square ratio of the global to the local
output over real tokens into `metrics` (`global_to_local_rms`).

`implementation='pallas'` runs the local and the global attention as fused
Pallas kernels (`lra_msmra.kernels.cst`), with the same parameters and
everything else shared; alpha = 1 only.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base
from lra_msmra.kernels import cst as cst_kernels
from lra_msmra.kernels import flash

Array = jax.Array

COMPOSITIONS = ('local_first', 'parallel', 'global_first', 'local_only')
AGGREGATIONS = ('mean', 'max', 'linear')
POSITION_EMBEDDINGS = ('ms_vipe', 'none')
ALPHAS = (1, 2, 3)


def check_slicing(slice_length: Any, alpha: Any) -> None:
  """Raises ValueError unless (slice_length, alpha) define a valid slicing."""
  if (not isinstance(slice_length, int) or isinstance(slice_length, bool)
      or slice_length < 1):
    raise ValueError(f'slice_length={slice_length!r} must be a positive '
                     'integer.')
  if (not isinstance(alpha, int) or isinstance(alpha, bool)
      or alpha not in ALPHAS):
    raise ValueError(f'alpha={alpha!r} must be one of {ALPHAS} (a slice '
                     'borrows at most one whole neighbour on each side).')
  if (alpha - 1) * slice_length % 2:
    raise ValueError(f'alpha={alpha} needs an even slice_length (got '
                     f'{slice_length}): the extension (alpha - 1) * L / 2 '
                     'must be a whole number of tokens.')


def extension_width(slice_length: int, alpha: int) -> int:
  """Tokens borrowed from each neighbouring slice, e = (alpha - 1) L / 2."""
  return (alpha - 1) * slice_length // 2


def local_table_rows(slice_length: int, alpha: int, causal: bool) -> int:
  """Rows of the MS-VIPE slice-local table: alpha L, or (alpha + 1) L / 2.

  In causal mode the extended window has only its left part, e + L offsets.
  """
  if causal:
    return extension_width(slice_length, alpha) + slice_length
  return alpha * slice_length


def extend_slices(t: Array, width: int, right: bool) -> Array:
  """Appends neighbouring tokens to every slice (Eq. 11; Eq. 12 if not right).

  Args:
    t: `[batch, slices, slice_length, ...]`, any dtype (bool for masks).
    width: e, tokens taken from each neighbour.
    right: also append the first e tokens of the next slice.

  Returns:
    `[batch, slices, e + slice_length (+ e), ...]`: the last e tokens of slice
    s - 1, slice s, then (if `right`) the first e tokens of slice s + 1, with
    zeros (False) beyond the sequence ends.
  """
  if width == 0:
    return t
  zeros = jnp.zeros_like(t[:, :1, :width])
  parts = [jnp.concatenate([zeros, t[:, :-1, t.shape[2] - width:]], axis=1),
           t]
  if right:
    parts.append(jnp.concatenate([t[:, 1:, :width], zeros], axis=1))
  return jnp.concatenate(parts, axis=2)


def masked_slice_mean(y: Array, mask: Array) -> Array:
  """Mean over the real tokens of each slice (footnote 1).

  Args:
    y: `[batch, slices, slice_length, features]`.
    mask: bool `[batch, slices, slice_length]`, True = real token.

  Returns:
    `[batch, slices, features]` in `y.dtype`, accumulated in float32; zero for
    a slice without real tokens.
  """
  m = mask[..., None].astype(jnp.float32)
  total = jnp.sum(y.astype(jnp.float32) * m, axis=2)
  count = jnp.sum(m, axis=2)
  return (total / jnp.maximum(count, 1.0)).astype(y.dtype)


def masked_slice_max(y: Array, mask: Array) -> Array:
  """Maximum over the real tokens of each slice; zero for an empty slice.

  Shapes as `masked_slice_mean`.
  """
  # A finite fill keeps max and its gradient free of inf - inf.
  low = jnp.finfo(y.dtype).min
  best = jnp.max(jnp.where(mask[..., None], y, low), axis=2)
  return jnp.where(jnp.any(mask, axis=2)[..., None], best, 0).astype(y.dtype)


class MultiScalePositions(nn.Module):
  """The MS-VIPE tables (Section 4.2), one set per model, shared by layers.

  Attributes:
    local_len: rows of the slice-local table, alpha * slice_length
      ((alpha + 1) * slice_length / 2 in causal mode); row r belongs to offset
      r - e from the start of a slice.
    global_len: rows of the slice-level table, ceil(max_len / slice_length).
    features: model width D.
    init_std: standard deviation of the normal initialiser.
  """
  local_len: int
  global_len: int
  features: int
  init_std: float = 0.02

  @nn.compact
  def __call__(self) -> dict[str, Array]:
    """Returns {'local': `[local_len, D]`, 'global': `[global_len, D]`}."""
    init = nn.initializers.normal(self.init_std)
    return {
        'local': self.param('local', init, (self.local_len, self.features),
                            jnp.float32),
        'global': self.param('global', init, (self.global_len, self.features),
                             jnp.float32),
    }


class CompositeSliceAttention(base.Attention):
  """Composite Slice Attention (docs/mechanisms/cst.md §3: every choice).

  Attributes:
    slice_length: L, tokens per slice.
    alpha: extension ratio in {1, 2, 3}; local keys span alpha * L tokens
      ((alpha + 1) L / 2 in causal mode).
    composition: 'local_first' (the paper's CSA), 'parallel', 'global_first'
      (Table 7 ablations) or 'local_only' (no global branch).
    aggregation: slice embedding by 'mean' (the paper's), 'max' or 'linear'
      (Table 8 ablations).
    share_local_global: one set of Q/K/V/O projections for both attentions
      (A.3); False gives the global attention its own.
    position_embedding: 'ms_vipe' (model-level tables passed as `shared`) or
      'none' (for the input-embedding ablation, `model.pos_emb='learned'`).
    position_init_std: initialiser scale of the MS-VIPE tables.
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('l4', {'slice_length': 4}),
      ('l4_alpha2_max_untied_global_first', {
          'slice_length': 4, 'alpha': 2, 'aggregation': 'max',
          'share_local_global': False, 'composition': 'global_first'}),
  )

  slice_length: int = 8
  alpha: int = 1
  composition: str = 'local_first'
  aggregation: str = 'mean'
  share_local_global: bool = True
  position_embedding: str = 'ms_vipe'
  position_init_std: float = 0.02

  def check_knobs(self) -> None:
    check_slicing(self.slice_length, self.alpha)
    if self.implementation == 'pallas' and self.alpha != 1:
      raise ValueError(
          f"implementation='pallas' covers alpha=1 only, got alpha="
          f"{self.alpha} (an extended key has one MS-VIPE row per slice that "
          "sees it); use implementation='xla'.")
    for knob, value, valid in (
        ('composition', self.composition, COMPOSITIONS),
        ('aggregation', self.aggregation, AGGREGATIONS),
        ('position_embedding', self.position_embedding, POSITION_EMBEDDINGS)):
      if value not in valid:
        raise ValueError(f'{knob}={value!r}; valid: {valid}.')

  @nn.nowrap
  def shared_module(self, *, features: int, max_len: int,
                    name: str) -> Optional[MultiScalePositions]:
    """The MS-VIPE tables for a model of width `features`, or None.

    Sized by this layer's slicing (in causal mode the local table covers
    the left-extended window only, (alpha + 1) L / 2 rows) and `max_len`,
    the longest sequence the model sees (CLS included).
    """
    if self.position_embedding != 'ms_vipe':
      return None
    return MultiScalePositions(
        local_len=local_table_rows(self.slice_length, self.alpha, self.causal),
        global_len=-(-max_len // self.slice_length), features=features,
        init_std=self.position_init_std, name=name)

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array, deterministic: bool,
             shared: Optional[Mapping[str, Array]] = None) -> Array:
    """Applies CSA (called by `base.Attention.__call__`).

    Args:
      x: `[batch, length, features]`.
      padding_mask: bool `[batch, length]`, True = real token.
      deterministic: disables attention dropout.
      shared: the output of `shared_module(...)()`, i.e. the MS-VIPE tables
        {'local': `[alpha L (causal: e + L), features]`, 'global':
        `[rows, features]`}; the
        encoder passes it. Required iff position_embedding='ms_vipe'.

    Returns:
      `[batch, length, out_features]` (zeroed at padded positions by the
      caller).
    """
    _, head_dim, out_features = self.head_dims(x)
    batch, length, features = x.shape
    size = self.slice_length
    # Padded once for the whole layer: to whole slices, and for the
    # kernels to their tiles too, so that no call pads again.
    x, mask = base.pad_to_length(x, padding_mask,
                                 self.kernel('length')(x))
    slices = x.shape[1] // size
    pos_local, pos_global = self._positions(shared, slices,
                                            -(-length // size))

    xs = x.astype(self.dtype).reshape(batch, slices, size, features)
    ms = mask.reshape(batch, slices, size)
    local_proj = self._projections(head_dim, features, prefix='')
    global_proj = (local_proj if self.share_local_global
                   else self._projections(head_dim, features, prefix='global_'))

    def local(inputs):
      return self._local_attention(local_proj, inputs, ms, pos_local,
                                   deterministic)

    def embed(inputs):
      embeddings = self._aggregate(inputs, ms, features)
      self.sow('intermediates', 'slice_embedding', embeddings)
      return embeddings

    def global_(embeddings):
      return self._global_attention(global_proj, embeddings,
                                    jnp.any(ms, axis=-1), pos_global,
                                    deterministic)

    y_global = None
    if self.composition == 'local_only':
      y_local = local(xs)
      y = y_local
    elif self.composition == 'local_first':
      y_local = local(xs)
      y_global = global_(embed(y_local))
      y = y_local + y_global[:, :, None]
    elif self.composition == 'parallel':
      y_local = local(xs)
      y_global = global_(embed(xs))
      y = y_local + y_global[:, :, None]
    else:  # 'global_first'
      y_global = global_(embed(xs))
      y_local = local(xs + y_global[:, :, None])
      y = y_local + y_global[:, :, None]
    if y_global is not None:
      self._sow_diagnostics(y_local, y_global, ms)

    y = y.reshape(batch, slices * size, features)
    if out_features != features:
      y = nn.DenseGeneral(
          out_features, use_bias=self.use_bias, kernel_init=self.kernel_init,
          bias_init=self.bias_init, dtype=self.dtype,
          param_dtype=jnp.float32, name='resize')(y)
    return y[:, :length]

  # -- pieces -----------------------------------------------------------------

  def _positions(self, shared: Optional[Mapping[str, Array]], slices: int,
                 real_slices: int
                 ) -> tuple[Optional[Array], Optional[Array]]:
    """Returns the MS-VIPE tables (local, global[:slices]), or Nones.

    The tables come from `shared_module` of the same settings
    (`lra_msmra.attention.Mechanism`), so their shapes fit the layer; only
    the input can be too long for the slice-level table. Of the `slices`,
    those from `real_slices` on hold padding only (the kernels' tiles):
    beyond the table they take zero rows, which no output depends on.
    """
    if self.position_embedding == 'none':
      if shared is not None:
        raise ValueError(
            "position_embedding='none' but the layer got MS-VIPE tables as "
            "`shared`; set position_embedding='ms_vipe' to use them.")
      return None, None
    if shared is None:
      raise ValueError(
          "position_embedding='ms_vipe' needs the model-level MS-VIPE tables "
          'as `shared=`: build the layer through lra_msmra.attention.'
          'Mechanism, whose shared_inputs(...) creates them, as '
          'lra_msmra.models.Encoder does. For the conventional ablation set '
          "attention_kw.position_embedding='none' and model.pos_emb="
          "'learned'.")
    local, global_ = shared['local'], shared['global']
    if global_.shape[0] < real_slices:
      raise ValueError(
          f'The input needs {real_slices} slice positions but the MS-VIPE '
          f'slice-level table has {global_.shape[0]} rows; build it with '
          'max_len >= the input length.')
    if global_.shape[0] < slices:
      global_ = jnp.pad(global_, [(0, slices - global_.shape[0]), (0, 0)])
    return local.astype(self.dtype), global_[:slices].astype(self.dtype)

  def _projections(self, head_dim: int, features: int, prefix: str
                   ) -> dict[str, nn.Module]:
    return {
        'query': self.projection(head_dim, prefix + 'query'),
        'key': self.projection(head_dim, prefix + 'key'),
        'value': self.projection(head_dim, prefix + 'value'),
        'out': self.output_projection(features, prefix + 'out'),
    }

  def _project_table(self, dense: nn.Module, table: Array) -> Array:
    """`table @ W` without the bias, `[rows, D] -> [rows, heads, head_dim]`.

    The tables are added to the projection's input, (x + p) W + b =
    (x W + b) + p W; the tokens are projected once and p W is added after the
    slicing, so the extended keys cost no extra projection.
    """
    projected = dense(table)
    if self.use_bias:
      projected = projected - dense(jnp.zeros_like(table[:1]))
    return projected

  def _local_attention(self, proj: Mapping[str, nn.Module], xs: Array,
                       ms: Array, pos: Optional[Array], deterministic: bool
                       ) -> Array:
    """Attention inside extended slices (Eqs. 8, 11, 12, 14).

    Args:
      proj: query/key/value/out projections.
      xs: `[batch, slices, L, features]`.
      ms: bool `[batch, slices, L]`, True = real token.
      pos: local table `[alpha L, features]` (causal: `[e + L, features]`)
        or None.
      deterministic: disables dropout.

    Returns:
      `[batch, slices, L, features]`.
    """
    size = self.slice_length
    width = extension_width(size, self.alpha)
    right = not self.causal
    head_dim = proj['query'].features[-1]
    q = proj['query'](xs)  # [batch, slices, L, heads, head_dim]
    k = extend_slices(proj['key'](xs), width, right)
    v = extend_slices(proj['value'](xs), width, right)
    key_mask = extend_slices(ms, width, right)  # fillers are False.
    if pos is not None:
      q = q + self._project_table(proj['query'], pos[width:width + size])
      k = k + self._project_table(proj['key'], pos[:k.shape[2]])
    q = q / jnp.sqrt(head_dim).astype(self.dtype)
    y = self.kernel('local')(q, k, v, ms, key_mask, deterministic)
    return proj['out'](y)

  def _local_xla(self, q: Array, k: Array, v: Array, ms: Array,
                 key_mask: Array, deterministic: bool) -> Array:
    """Softmax of each slice's queries `[batch, slices, L, heads, d]`
    over its extended keys `[batch, slices, width + L (+ width), heads,
    d]` (`key_mask` marks the real ones; `ms` the real queries)."""
    del ms
    size = self.slice_length
    width = extension_width(size, self.alpha)
    # [batch, slices, heads, L, keys], accumulated in float32.
    logits = jnp.einsum('bsqhd,bskhd->bshqk', q, k,
                        preferred_element_type=jnp.float32)
    valid = key_mask[:, :, None, None, :]
    if self.causal:
      # Key c of the left-extended window is offset c - e from the slice
      # start; query l sees it iff c - e <= l.
      keys = jnp.arange(width + size)
      valid = valid & (keys[None, :] <= jnp.arange(size)[:, None] + width)
    probs = base.safe_softmax(logits, valid)
    probs = self.attention_dropout(probs, deterministic).astype(self.dtype)
    return jnp.einsum('bshqk,bskhd->bsqhd', probs, v)

  def _local_pallas(self, q: Array, k: Array, v: Array, ms: Array,
                    key_mask: Array, deterministic: bool) -> Array:
    """`_local_xla` as Pallas kernels (`lra_msmra.kernels.cst`)."""
    del key_mask  # The kernel derives the extended keys' flags from ms.
    return cst_kernels.local_attention(
        q, k, v, ms, causal=self.causal,
        **flash.layer_dropout(self, deterministic))

  def _aggregate(self, ys: Array, ms: Array, features: int) -> Array:
    """Slice embeddings `[batch, slices, D]` from `[batch, slices, L, D]`."""
    if self.aggregation == 'mean':
      return masked_slice_mean(ys, ms)
    if self.aggregation == 'max':
      return masked_slice_max(ys, ms)
    zeroed = jnp.where(ms[..., None], ys, jnp.zeros((), ys.dtype))
    embeddings = nn.DenseGeneral(
        features, axis=(-2, -1), use_bias=self.use_bias,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        dtype=self.dtype, param_dtype=jnp.float32,
        name='slice_projection')(zeroed)
    # An empty slice's embedding is zero, as under 'mean' and 'max' (not the
    # bias): in causal mode it is the query of the next slice.
    return jnp.where(jnp.any(ms, axis=-1)[..., None], embeddings,
                     jnp.zeros((), embeddings.dtype))

  def _global_attention(self, proj: Mapping[str, nn.Module], s: Array,
                        slice_valid: Array, pos: Optional[Array],
                        deterministic: bool) -> Array:
    """Attention among slice embeddings (Eqs. 9, 15; causal: shifted query).

    Args:
      proj: query/key/value/out projections.
      s: slice embeddings `[batch, slices, features]`.
      slice_valid: bool `[batch, slices]`, False for slices without real
        tokens (masked as keys).
      pos: slice-level table `[slices, features]` or None.
      deterministic: disables dropout.

    Returns:
      `[batch, slices, features]`; in causal mode row t depends on slices
      < t only. A row that sees no valid slice (causal: row 0, and row t
      when slices < t are all invalid) is zero.
    """
    head_dim = proj['query'].features[-1]
    qk_inputs = s if pos is None else s + pos[None]
    q = proj['query'](qk_inputs) / jnp.sqrt(head_dim).astype(self.dtype)
    k = proj['key'](qk_inputs)
    v = proj['value'](s)
    y = proj['out'](self.kernel('global')(q, k, v, slice_valid,
                                          deterministic))
    # A query that sees no real slice outputs zero, W_o's bias included:
    # in causal mode any slice whose earlier slices are all padding, like
    # slice 0 (inclusive row t sees a real slice iff one of 0..t is real).
    if self.causal:
      sees = jnp.cumsum(slice_valid.astype(jnp.int32), axis=1) > 0
    else:
      sees = jnp.any(slice_valid, axis=1, keepdims=True)
    y = jnp.where(sees[..., None], y, jnp.zeros((), y.dtype))
    if self.causal:
      # Inclusive-causal output of slice t - 1 = the shifted query of slice t
      # over keys < t with a strictly causal mask.
      y = jnp.concatenate([jnp.zeros_like(y[:, :1]), y[:, :-1]], axis=1)
    return y

  def _global_xla(self, q: Array, k: Array, v: Array, slice_valid: Array,
                  deterministic: bool) -> Array:
    """Softmax attention among slices `[batch, slices, heads, d]`, keys
    masked by `slice_valid` (causal: inclusive)."""
    if deterministic or self.dropout_rate == 0.0:
      # The same function without the [slices, slices] weights in memory:
      # what makes the quadratic part affordable at long lengths.
      return base.blocked_attention(q, k, v, slice_valid, causal=self.causal)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k,
                        preferred_element_type=jnp.float32)
    valid = slice_valid[:, None, None, :]
    if self.causal:
      valid = valid & base.causal_mask(q.shape[1])[None, None]
    probs = base.safe_softmax(logits, valid)
    probs = self.attention_dropout(probs, deterministic).astype(self.dtype)
    return jnp.einsum('bhqk,bkhd->bqhd', probs, v)

  def _global_pallas(self, q: Array, k: Array, v: Array, slice_valid: Array,
                     deterministic: bool) -> Array:
    """`_global_xla` as a Pallas kernel (`lra_msmra.kernels.cst`)."""
    return cst_kernels.global_attention(
        q, k, v, slice_valid, causal=self.causal,
        **flash.layer_dropout(self, deterministic))

  def _length_xla(self, x: Array) -> int:
    """The padded length: whole slices."""
    return -(-x.shape[1] // self.slice_length) * self.slice_length

  def _length_pallas(self, x: Array) -> int:
    """The padded length: whole slices and whole tiles of both kernel
    calls (`lra_msmra.kernels.cst.padded_length`)."""
    return cst_kernels.padded_length(
        x.shape[1], slice_length=self.slice_length,
        rows=x.shape[0] * self.num_heads, head_dim=self.head_dims(x)[1],
        dtype=self.dtype, causal=self.causal,
        with_global=self.composition != 'local_only')

  # The kernel switch (`base.Attention.KERNELS`).
  KERNELS = {'xla': {'local': _local_xla, 'global': _global_xla,
                     'length': _length_xla},
             'pallas': {'local': _local_pallas, 'global': _global_pallas,
                        'length': _length_pallas}}

  def _sow_diagnostics(self, y_local: Array, y_global: Array, ms: Array
                       ) -> None:
    self.sow('intermediates', 'global_output', y_global)
    m = ms[..., None].astype(jnp.float32)
    local_sq = jnp.sum(jnp.square(y_local.astype(jnp.float32)) * m)
    global_sq = jnp.sum(
        jnp.square(y_global.astype(jnp.float32))[:, :, None] * m)
    ratio = jnp.sqrt(global_sq / jnp.maximum(local_sq, 1e-30))
    self.sow('metrics', 'global_to_local_rms', jax.lax.stop_gradient(ratio))
