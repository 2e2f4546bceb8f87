"""Composite Slice Attention (CSA), the attention of the CST (`cst`).

Paper: M. Lee, S. Pitre, T. Jiang, P.-D. Letourneau, M. J. Morse, K. Jang,
J. Soriaga, P. Noorzad, H.-P. Cheng, C. Lott, "Composite Slice Transformer: An
Efficient Transformer with Composition of Multi-Scale Multi-Range Attentions",
ICLR 2023 (OpenReview id nWTzIsgrYNN; we know of no arXiv version).
Official code: none is public, so this module is a reference implementation
written from the paper alone. Equation numbers below are the paper's.

What one layer computes (B batch, N length, L slice length, n = N / L
slices, D model width, e = (alpha - 1) L / 2 extension width):

1. Slice: `[B, N, D] -> [B, n, L, D]`, a reshape (Section 4.1).
2. Local attention inside every slice (Eq. 8, 14). Keys and values of slice s
   are extended by e tokens into each neighbour (Eq. 11): positions
   `[sL - e, (s + 1)L + e)`, alpha * L keys, zeros beyond the sequence ends.
3. Slice embeddings: the masked mean of each slice's local output over its
   real tokens (Section 4.1, footnote 1), `[B, n, D]`.
4. Global attention among the n slice embeddings (Eq. 9, 15). Without
   attention dropout it runs a block of slices at a time
   (`base.blocked_attention`): the same function, but the n x n weights,
   the one part of CSA quadratic in N, are never all in memory.
5. Broadcast-add: token i of slice s gets `Y_l[i] + Y_g[s]` (Eq. 10).

Positions (MS-VIPE, Section 4.2): two learned tables, a slice-local one with
alpha * L rows ((alpha + 1) L / 2 when causal) and a slice-level one with
ceil(max_len / L) rows, created once per model (`MultiScalePositions`,
through `shared_module`) and shared by all layers. They are added to the
inputs of the query and key projections of the local (Eq. 14) and global
(Eq. 15) attentions, never to the values. A model using them has no input
position embedding (`config.model.pos_emb = 'none'`).
The paper's "Conventional" ablation is `position_embedding='none'` here plus
`config.model.pos_emb = 'learned'` (a learned absolute table at the input).

Causal mode (Section 4.1, last paragraph): keys and values are extended to
the left only (Eq. 12), the local mask is causal with the diagonal, and the
global attention uses a strictly causal mask with the shifted query of slice
t - 1. We compute it as inclusive-causal attention over slice embeddings
shifted right by one slice (the two are equal); slice 0 has no visible slice
and gets a global output of exactly zero. Output i then depends on inputs
j <= i only, for any number of layers.

Ablations of Tables 7 and 8 (knobs below): `composition` 'parallel' (global
attention over mean-pooled *input* slices, added to the local output, as in
H-Transformer-1D) and 'global_first'; `aggregation` 'max' and 'linear';
`share_local_global=False` for separate global projections. 'local_only'
(no global branch: block-local attention with extension) is a diagnostic.

Choices we made where the paper is silent (docs/mechanisms/cst.md §3 numbers
these):

* W_o and weight sharing (A.3 shares W_q, W_k, W_v between the local and
  global attentions and never mentions W_o): one multi-head attention,
  W_o included, is applied twice, on slices and on slice embeddings. The
  layer therefore has exactly the parameters of standard attention.
  `share_local_global=False` gives the global attention its own four
  projections (`global_query`, `global_key`, `global_value`, `global_out`).
* What is pooled: the local output after W_o, so both branches live in R^D.
* Scaling: logits are divided by sqrt(head_dim) in both attentions (the
  paper drops the factor only "for simplicity" of notation).
* Query rows of the local table when extended: the table's row r belongs to
  relative offset r - e from the slice start, so queries use rows
  e..e+L-1 and key c of the extended window uses row c. In causal mode the
  window is the first e + L = (alpha + 1) L / 2 of those offsets, and the
  table has exactly those rows (the encoder tells `shared_module` whether the
  model is causal).
* Zero fillers at the sequence ends (Eq. 11) are masked as keys: otherwise
  the position table would make them non-zero keys that take softmax mass.
* Padding: padded keys are masked in the local attention, the mean divides by
  the number of real tokens, a slice without real tokens gets a zero
  embedding and is masked as a global key, and padded query outputs are
  zeroed. Rows without any visible key get zero attention weights
  (`base.safe_softmax`), so nothing is NaN in outputs or gradients.
* N not divisible by L: padded internally to the next multiple of L (as
  padding) and cropped back. The slice-level table needs
  ceil(max_len / L) rows, which the encoder's `max_len` provides.
* Causal global output of slice 0: zero (no visible slice, no bias).
* Table initialisation: N(0, 0.02) (`position_init_std`), as learned
  position tables of the PyTorch LRA ports.
* Attention dropout (not specified): the layer's `dropout_rate` is applied to
  the probabilities of both attentions, as in the softmax baseline.
* 'global_first' (not specified beyond "global, then local"): the global
  attention runs on the masked mean of the *input* slices; its broadcast
  output is added to the tokens before the local attention and to the local
  output after it: `Y = local(S + G) + G`. Without the first addition the
  local attention would not see the global result; without the second the
  order would not mirror Eq. 10.
* 'linear' aggregation: a learned linear map of the L masked tokens of a
  slice to D (a convolution with kernel = stride = L over the zeroed padded
  tokens, as the paper describes), Xavier-initialised; 'max' takes the
  maximum over real tokens (zero for an empty slice).
* A CLS token (the LRA-protocol configs pool on it) is simply position 0 of
  slice 0. The paper (A.8) finds CLS awkward for CST and pools by the mean,
  which the `:cst` protocol option does.
* Numerics: with dtype=bfloat16 the projections run in bf16, while logits,
  softmax and the slice means accumulate in float32; the tables are float32
  parameters cast to the activation dtype when added.
* `out_features` other than the input width: the layer computes CSA at the
  input width (the local output must fit the shared Q/K/V projections of the
  global attention) and maps the result with one extra linear layer
  (`resize`). The encoder never asks for this.

Cost per layer and head: local logits `[n, L, alpha L]` (N alpha L entries),
global logits `[n, n]` ((N / L)^2 entries); no array has two axes of size N.

Diagnostics: the layer sows `slice_embedding` and `global_output` (`[B, n, D]`)
into the `intermediates` collection and the ratio of the root-mean-square
global to local output over real tokens into `metrics`
(`global_to_local_rms`), which the trainer logs.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base

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
  """Composite Slice Attention; see the module docstring for every choice.

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
  slice_length: int = 8
  alpha: int = 1
  composition: str = 'local_first'
  aggregation: str = 'mean'
  share_local_global: bool = True
  position_embedding: str = 'ms_vipe'
  position_init_std: float = 0.02

  def __post_init__(self):
    check_slicing(self.slice_length, self.alpha)
    for knob, value, valid in (
        ('composition', self.composition, COMPOSITIONS),
        ('aggregation', self.aggregation, AGGREGATIONS),
        ('position_embedding', self.position_embedding, POSITION_EMBEDDINGS)):
      if value not in valid:
        raise ValueError(f'{knob}={value!r}; valid: {valid}.')
    super().__post_init__()

  @classmethod
  def shared_module(cls, attention_kw: Mapping[str, Any], *, features: int,
                    max_len: int, name: str,
                    causal: bool = False) -> Optional[nn.Module]:
    """The MS-VIPE tables for a model of width `features`, or None.

    Args:
      attention_kw: the layers' knobs (defaults of this class fill the rest).
      features: model width.
      max_len: longest sequence the model sees (CLS included).
      name: parameter scope of the tables.
      causal: whether the layers are causal (the local table then covers the
        left-extended window only, (alpha + 1) L / 2 rows).
    """
    def knob(key):
      return attention_kw.get(key, getattr(cls, key))
    if knob('position_embedding') != 'ms_vipe':
      return None
    slice_length, alpha = knob('slice_length'), knob('alpha')
    check_slicing(slice_length, alpha)
    return MultiScalePositions(
        local_len=local_table_rows(slice_length, alpha, causal),
        global_len=-(-max_len // slice_length), features=features,
        init_std=knob('position_init_std'), name=name)

  @nn.compact
  def __call__(self, x: Array, *, padding_mask: Optional[Array] = None,
               deterministic: bool = True,
               shared: Optional[Mapping[str, Array]] = None) -> Array:
    """Applies CSA.

    Args:
      x: `[batch, length, features]`.
      padding_mask: bool `[batch, length]`, True = real token.
      deterministic: disables attention dropout.
      shared: the output of `shared_module(...)()`, i.e. the MS-VIPE tables
        {'local': `[alpha L (causal: e + L), features]`, 'global':
        `[rows, features]`}; the
        encoder passes it. Required iff position_embedding='ms_vipe'.

    Returns:
      `[batch, length, out_features]`, zero at padded positions.
    """
    padding_mask = base.default_padding_mask(x, padding_mask)
    _, head_dim, out_features = self.head_dims(x)
    batch, length, features = x.shape
    size = self.slice_length
    x, mask, _ = base.pad_to_multiple(x, padding_mask, size)
    slices = x.shape[1] // size
    pos_local, pos_global = self._positions(shared, features, slices)

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
    # Padded queries are inert (docs/mechanisms/softmax.md §3).
    y = jnp.where(mask[..., None], y, jnp.zeros((), y.dtype))
    return y[:, :length]

  # -- pieces -----------------------------------------------------------------

  def _positions(self, shared: Optional[Mapping[str, Array]], features: int,
                 slices: int) -> tuple[Optional[Array], Optional[Array]]:
    """Checks the MS-VIPE tables; returns (local, global[:slices]) or Nones."""
    if self.position_embedding == 'none':
      if shared is not None:
        raise ValueError(
            "position_embedding='none' but the layer got MS-VIPE tables as "
            "`shared`; set position_embedding='ms_vipe' to use them.")
      return None, None
    if shared is None:
      raise ValueError(
          "position_embedding='ms_vipe' needs the model-level MS-VIPE tables "
          'as `shared=`: build them with CompositeSliceAttention.'
          'shared_module(...) and call it, as lra_msmra.models.Encoder does. '
          "For the conventional ablation set attention_kw.position_embedding="
          "'none' and model.pos_emb='learned'.")
    local, global_ = shared['local'], shared['global']
    rows = local_table_rows(self.slice_length, self.alpha, self.causal)
    if local.shape != (rows, features):
      raise ValueError(
          f'MS-VIPE local table has shape {local.shape}, expected '
          f'{(rows, features)} for slice_length={self.slice_length}, alpha='
          f'{self.alpha}, causal={self.causal}, width {features}; build the '
          'tables from the same attention_kw and causal flag as the layers.')
    if global_.shape[0] < slices or global_.shape[1] != features:
      raise ValueError(
          f'The input needs {slices} slice positions of width {features} but '
          f'the MS-VIPE slice-level table has shape {global_.shape}; build it '
          'with max_len >= the (padded) input length.')
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
    y = jnp.einsum('bshqk,bskhd->bsqhd', probs, v)
    return proj['out'](y)

  def _aggregate(self, ys: Array, ms: Array, features: int) -> Array:
    """Slice embeddings `[batch, slices, D]` from `[batch, slices, L, D]`."""
    if self.aggregation == 'mean':
      return masked_slice_mean(ys, ms)
    if self.aggregation == 'max':
      return masked_slice_max(ys, ms)
    zeroed = jnp.where(ms[..., None], ys, jnp.zeros((), ys.dtype))
    return nn.DenseGeneral(
        features, axis=(-2, -1), use_bias=self.use_bias,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        dtype=self.dtype, param_dtype=jnp.float32,
        name='slice_projection')(zeroed)

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
      < t only and row 0 is zero.
    """
    head_dim = proj['query'].features[-1]
    qk_inputs = s if pos is None else s + pos[None]
    q = proj['query'](qk_inputs) / jnp.sqrt(head_dim).astype(self.dtype)
    k = proj['key'](qk_inputs)
    v = proj['value'](s)
    if deterministic or self.dropout_rate == 0.0:
      # The same function without the [slices, slices] weights in memory:
      # what makes the quadratic part affordable at long lengths.
      y = base.blocked_attention(q, k, v, slice_valid, causal=self.causal)
    else:
      logits = jnp.einsum('bqhd,bkhd->bhqk', q, k,
                          preferred_element_type=jnp.float32)
      valid = slice_valid[:, None, None, :]
      if self.causal:
        valid = valid & base.causal_mask(s.shape[1])[None, None]
      probs = base.safe_softmax(logits, valid)
      probs = self.attention_dropout(probs, deterministic).astype(self.dtype)
      y = jnp.einsum('bhqk,bkhd->bqhd', probs, v)
    y = proj['out'](y)
    if self.causal:
      # Inclusive-causal output of slice t - 1 = the shifted query of slice t
      # over keys < t with a strictly causal mask.
      y = jnp.concatenate([jnp.zeros_like(y[:, :1]), y[:, :-1]], axis=1)
    return y

  def _sow_diagnostics(self, y_local: Array, y_global: Array, ms: Array
                       ) -> None:
    self.sow('intermediates', 'global_output', y_global)
    m = ms[..., None].astype(jnp.float32)
    local_sq = jnp.sum(jnp.square(y_local.astype(jnp.float32)) * m)
    global_sq = jnp.sum(
        jnp.square(y_global.astype(jnp.float32))[:, :, None] * m)
    ratio = jnp.sqrt(global_sq / jnp.maximum(local_sq, 1e-30))
    self.sow('metrics', 'global_to_local_rms', jax.lax.stop_gradient(ratio))
