"""Long-Short attention (Transformer-LS), bidirectional and autoregressive.

Paper: C. Zhu et al., "Long-Short Transformer: Efficient Transformers for
Language and Vision", NeurIPS 2021, arXiv:2107.02192. Official PyTorch code:
NVIDIA/transformer-ls (`lra/attention_transformer_ls.py`, class
`AttentionLS`; `autoregressive/model_lib/layer.py`, class
`ChunkedLSAttention`). docs/mechanisms/long_short.md §2, §3, §4, §5, §6
and §8 give, in that order, the equations, the choices where the paper is
silent, where we follow the code over the paper and where we depart from
both, padding and lengths, the causal form and the invariants the tests
check; equation numbers below are the paper's.

Every query attends, under one softmax, to the keys of a local window and to
r = `num_landmarks` dynamic projections per head, K̄ = Pᵀ K and V̄ = Pᵀ V with
P = softmax(X W^P) normalised over the sequence (Eqs. 3, 4, 6). DualLN
(Eq. 7) normalises the window keys and values with LN_L and the projected
ones with LN_G, each over all heads jointly (`_DualLayerNorm`).

* Bidirectional (`causal=False`), as the official LRA code: segments of
  w = `window_size` queries see the keys [g w - e, (g + 1) w + e),
  e = max(w // 2, 1); P is a softmax over the whole sequence; an optional
  zero-initialised depthwise convolution of the values
  (`conv_kernel_size`).
* Causal (`causal=True`), as the autoregressive code: query t sees the keys
  [t - w + 1, t] and the compressed vectors of the chunks of l =
  `chunk_size` tokens before its own chunk; each chunk has its own P. There
  is no cache, and every chunk is compressed in the paper's order
  (docs/mechanisms/long_short.md §4.3).

`window_size=0` is pure dynamic projection, `num_landmarks=0` pure window
attention. `normalize_before_compress` chooses whether P mixes LN_L's
outputs or the raw projections. Lengths are padded internally to a multiple
of w (causal: of lcm(l, w)) and cropped; padded positions output zero
(`base.Attention`).

Cost: bidirectional O(N (r + w + 2e) d) time and O(N (r + w + 2e)) score
memory per head; causal, the compressed logits are `[B, H, N, (N / l) r]`,
quadratic in N with the constant r / l, as in the official code. The memory
layout (not the function) is explained next to the code: the window tiles
and the joint softmax in `_attend`, its recomputation in the backward pass
in `_attend_recomputed`, DualLN's backward pass in `_layer_norm` and
`_layer_norm_bwd`. `implementation='pallas'` runs the attention core
(`_attend`) as one fused Pallas flash attention, forward and backward
(`lra_msmra.kernels.long_short`; it sows no `probs`, and its dropout mask is
the kernel's).

Intermediates (`mutable=['intermediates']`): `projection` (P; bidirectional
`[B, N, H, r]`, causal `[B, chunks, l, H, r]`), `compressed_keys` (LN_G(K̄);
`[B, r or chunks * r, H, d]`) and `probs` (the joint weights after zeroing
padded queries, before dropout, `[B, H, N, slots]`: projected slots first,
then window slots in key order), at the internally padded length. During
training the metric `long_range_mass` is the mean weight on projected keys
over real queries, when both parts are present.

On TPU and GPU the same program runs: both custom backward passes recompute
as on CPU and XLA keeps their optimization barriers, so the extra dependency
on the cotangent is one small fused add per DualLN, local to each device's
batch rows. The tiling was chosen by CPU timings; `tests/test_export.py`
checks that every config lowers for both platforms (memory there has not
been measured).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base
from lra_msmra.kernels import flash
from lra_msmra.kernels import long_short as fused
from lra_msmra.kernels import sequence_sums

Array = jax.Array

# Chunk length of the official autoregressive launch scripts (`csize`).
DEFAULT_CHUNK_SIZE = 16
# PyTorch's LayerNorm epsilon, used by the official DualLN layers.
DUAL_LN_EPS = 1e-5


def window_extension(window_size: int) -> int:
  """Keys added on each side of a bidirectional segment: max(w // 2, 1)."""
  return max(window_size // 2, 1)


@jax.custom_vjp
def _layer_norm(x: Array, scale: Array, bias: Array) -> Array:
  """LayerNorm over the last two axes, as `nn.LayerNorm` computes it.

  Same forward ops as flax (float32 statistics, fast variance clipped at 0,
  epsilon `DUAL_LN_EPS`); returns float32. The backward pass is the
  analytic LayerNorm gradient; it keeps only `x` and the per-row mean and
  1 / std and recomputes x_hat, instead of the several full-size arrays
  (centred input, broadcast multipliers) that autodiff of the flax code
  keeps. The function is unchanged; only what is stored between the passes
  differs (`_layer_norm_bwd` says how XLA is kept from undoing this).
  """
  return _layer_norm_fwd(x, scale, bias)[0]


def _layer_norm_fwd(x, scale, bias):
  x32 = x.astype(jnp.float32)
  mean = x32.mean((-2, -1), keepdims=True)
  mean2 = jnp.square(x32).mean((-2, -1), keepdims=True)
  var = jnp.maximum(0.0, mean2 - jnp.square(mean))
  inv_std = jax.lax.rsqrt(var + DUAL_LN_EPS)
  y = (x - mean) * (inv_std * scale) + bias
  return y, (x, scale, mean, inv_std)


def _layer_norm_bwd(residuals, d_y):
  # Keep XLA from merging the recomputation of x_hat with the forward
  # pass's: merged, the centred input and a full-size broadcast of inv_std
  # would stay live from the forward pass to the backward one.
  (x, scale, mean, inv_std), d_y = jax.lax.optimization_barrier(
      (residuals, d_y))
  rows = tuple(range(x.ndim - 2))
  x_hat = (x.astype(jnp.float32) - mean) * inv_std
  d_y = d_y.astype(jnp.float32)
  d_hat = d_y * scale
  d_x = inv_std * (d_hat - d_hat.mean((-2, -1), keepdims=True)
                   - x_hat * (d_hat * x_hat).mean((-2, -1), keepdims=True))
  return (d_x.astype(x.dtype), jnp.sum(d_y * x_hat, rows),
          jnp.sum(d_y, rows))


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class _DualLayerNorm(nn.Module):
  """`nn.LayerNorm` over (heads, head_dim) jointly, with `_layer_norm`.

  Same parameters (`scale` of ones, `bias` of zeros, `[heads, head_dim]`,
  float32) and outputs as `nn.LayerNorm(epsilon=DUAL_LN_EPS,
  reduction_axes=(-2, -1), feature_axes=(-2, -1))`.
  """
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    shape = x.shape[-2:]
    scale = self.param('scale', nn.initializers.ones, shape, jnp.float32)
    bias = self.param('bias', nn.initializers.zeros, shape, jnp.float32)
    return _layer_norm(x, scale, bias).astype(self.dtype)


def _neighbours(blocks: Array, left: int, right: int, fill, axis: int
                ) -> tuple[Optional[Array], Optional[Array]]:
  """The edges of the neighbouring blocks that a block's window reaches.

  Args:
    blocks: blocks along `axis`, each of `size` positions along `axis + 1`.
    left: positions taken from the end of block g - 1 (<= size).
    right: positions taken from the start of block g + 1 (<= size).
    fill: value of the positions before the first / after the last block.
    axis: the block axis.

  Returns:
    The `left` last positions of block g - 1 and the `right` first ones of
    block g + 1, for every block g (None when the width is 0). With the block
    itself they cover positions [g * size - left, (g + 1) * size + right)
    (`_tiles` joins the three).
  """
  size = blocks.shape[axis + 1]
  take = lambda a, start, stop, lo, hi: jax.lax.slice_in_dim(
      jax.lax.slice_in_dim(a, lo, hi, axis=axis), start, stop, axis=axis + 1)
  groups = blocks.shape[axis]

  def pad(a, before):
    widths = [(0, 0)] * a.ndim
    widths[axis] = (1, 0) if before else (0, 1)
    return jnp.pad(a, widths, constant_values=fill)
  before = after = None
  if left:
    before = pad(take(blocks, size - left, size, 0, groups - 1), True)
  if right:
    after = pad(take(blocks, 0, right, 1, groups), False)
  return before, after


def _tiles(before: Optional[Array], blocks: Array, after: Optional[Array],
           axis: int) -> Array:
  """`[before | blocks | after]` along the position axis of the blocks."""
  return jnp.concatenate(
      [t for t in (before, blocks, after) if t is not None], axis=axis)


def _attend(q: Array, projected, window, query_mask: Array,
            dropout_mask: Optional[Array], *, window_size: int, left: int,
            right: int, causal: bool, keep_prob: float
            ) -> tuple[Array, list[Array]]:
  """The joint softmax attention over projected and window keys.

  A pure function of arrays, so that the backward pass can recompute it
  (`_attend_recomputed`). It is heads-major, so that each of its products is
  one batched matmul. The memory layout differs from the plain formula, not
  the function: the window's keys and values are gathered per block into
  one tile each (below), and the joint softmax is taken over the parts
  without concatenating them (`base.safe_softmax_parts`: one shared row
  maximum and total), so no second copy of the logits or of their masks is
  built.

  Args:
    q: `[batch, length, heads, head_dim]` scaled queries.
    projected: None, or (K̄, V̄ `[batch, m, heads, head_dim]`, bool validity
      broadcastable to `[batch, 1, length, m]`).
    window: None, or (keys, values `[batch, length, heads, head_dim]`, bool
      key mask `[batch, length]`). Query block g of `window_size` positions
      sees keys [g w - left, (g + 1) w + right); `causal` keeps keys
      [t - w + 1, t] of query t (then left = w, right = 0).
    query_mask: bool `[batch, length]`; False rows get zero weights.
    dropout_mask: None, or bool `[batch, heads, length, slots]`, True = keep.
    window_size: w.
    left: window keys taken from the previous block.
    right: window keys taken from the next block.
    causal: apply the causal band inside the window.
    keep_prob: 1 - dropout rate (used with `dropout_mask`).

  Returns:
    The combined values `[batch, length, heads, head_dim]` and the weights
    per part (`[batch, heads, length, m]`, `[batch, heads, length, slots]`),
    after zeroing padded queries and before dropout.
  """
  dtype = q.dtype
  # Heads-major [batch, heads, length, head_dim]: every product below is then
  # a batched matmul over (batch, heads[, block]) without further copies.
  q = _heads_major(q)
  logits, valid = [], []
  if projected is not None:
    k_bar, v_bar, bar_valid = projected
    logits.append(jnp.einsum('bhnd,bhmd->bhnm', q, _heads_major(k_bar),
                             preferred_element_type=jnp.float32))
    valid.append(bar_valid)
  if window is not None:
    scores, masks = _window_scores(q, window[0], window[2], window_size,
                                   left, right, causal)
    logits.append(scores)
    valid.append(masks)

  probs = base.safe_softmax_parts(logits, valid)
  probs = [p * query_mask[:, None, :, None] for p in probs]
  weights = probs
  if dropout_mask is not None:
    start, weights = 0, []
    for p in probs:
      keep = dropout_mask[..., start:start + p.shape[-1]]
      weights.append(jnp.where(keep, p / keep_prob, 0.0).astype(p.dtype))
      start += p.shape[-1]
  weights = [p.astype(dtype) for p in weights]

  out = 0.0
  if projected is not None:
    out = out + jnp.einsum('bhnm,bhmd->bhnd', weights[0],
                           _heads_major(projected[1]))
  if window is not None:
    out = out + _window_values(weights[-1], window[1], window_size, left,
                               right)
  return _heads_major(out), probs


def _heads_major(a: Array) -> Array:
  """`[batch, length, heads, d]` <-> `[batch, heads, length, d]`."""
  return a.transpose(0, 2, 1, 3)


def _window_scores(q: Array, k: Array, key_mask: Array, w: int, left: int,
                   right: int, causal: bool) -> tuple[Array, Array]:
  """Scores of heads-major queries `[batch, heads, length, d]` against
  their window keys (`k`: `[batch, length, heads, d]`), float32
  `[batch, heads, length, left + w + right]`, and their validity
  `[batch, 1, length, slots]`."""
  batch, heads, length, head_dim = q.shape
  groups, slots = length // w, left + w + right
  q_blocks = q.reshape(batch, heads, groups, w, head_dim)
  k_blocks = _heads_major(k).reshape(batch, heads, groups, w, head_dim)
  k_left, k_right = _neighbours(k_blocks, left, right, 0, axis=2)
  # Keys of block g in key order: [end of g - 1 | block g | start of g + 1]
  # (`_neighbours`: exactly the keys [g w - left, (g + 1) w + right)), one
  # tile per block, so that scores and values take one batched product
  # each (three products of a few keys each ran slower on CPU than the
  # official code's single strided product). The tiles live only inside
  # `_attend`, which the backward pass recomputes, so they are never
  # stored between the passes.
  k_tiles = _tiles(k_left, k_blocks, k_right, axis=3)
  win = jnp.einsum('bhgqd,bhgkd->bhgqk', q_blocks, k_tiles,
                   preferred_element_type=jnp.float32)
  m_blocks = key_mask.reshape(batch, groups, w)
  m_left, m_right = _neighbours(m_blocks, left, right, False, axis=1)
  m_tiles = _tiles(m_left, m_blocks, m_right, axis=2)[:, None, :, None, :]
  if causal:
    offset = jnp.arange(slots)[None, :] - jnp.arange(w)[:, None]
    m_tiles = m_tiles & ((offset >= 1) & (offset <= w))
  m_tiles = jnp.broadcast_to(m_tiles, (batch, 1, groups, w, slots))
  return (win.reshape(batch, heads, length, slots),
          m_tiles.reshape(batch, 1, length, slots))


def _window_values(weights: Array, v: Array, w: int, left: int, right: int
                   ) -> Array:
  """The window part of the output, `[batch, heads, length, d]`, from its
  weights `[batch, heads, length, slots]` and the values `[batch, length,
  heads, d]`."""
  batch, length, heads, head_dim = v.shape
  groups, slots = length // w, left + w + right
  a = weights.reshape(batch, heads, groups, w, slots)
  v_blocks = _heads_major(v).reshape(batch, heads, groups, w, head_dim)
  v_left, v_right = _neighbours(v_blocks, left, right, 0, axis=2)
  combined = jnp.einsum('bhgqk,bhgkd->bhgqd', a,
                        _tiles(v_left, v_blocks, v_right, axis=3))
  return combined.reshape(batch, heads, length, head_dim)


class _AttendConfig(NamedTuple):
  """The static arguments of `_attend`."""
  window_size: int
  left: int
  right: int
  causal: bool
  keep_prob: float


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend_recomputed(config: _AttendConfig, q, projected, window,
                       query_mask, dropout_mask):
  """`_attend`, keeping only its inputs and output for the backward pass.

  The backward pass recomputes `_attend` and differentiates it with
  `jax.vjp`, so the gradients are those of `_attend` itself: no logits,
  weights or window tiles are stored between the passes, for the cost of one
  more forward pass of the core, which is cheap next to the projections.
  Unlike `jax.checkpoint`, the recomputation waits
  (`lax.optimization_barrier`) for the output and its cotangent, so XLA
  cannot hoist it into the forward pass, where its intermediates would be
  live at the same time as the forward ones.
  """
  return _attend(q, projected, window, query_mask, dropout_mask,
                 **config._asdict())


def _attend_fwd(config, q, projected, window, query_mask, dropout_mask):
  out, probs = _attend(q, projected, window, query_mask, dropout_mask,
                       **config._asdict())
  return (out, probs), (q, projected, window, query_mask, dropout_mask, out)


def _attend_bwd(config, residuals, cotangents):
  residuals, cotangents = jax.lax.optimization_barrier(
      (residuals, cotangents))
  q, projected, window, query_mask, dropout_mask, _ = residuals
  bar_valid = projected[2] if projected is not None else None
  key_mask = window[2] if window is not None else None

  def attend(q, projected, window):
    if projected is not None:
      projected = projected + (bar_valid,)
    if window is not None:
      window = window + (key_mask,)
    return _attend(q, projected, window, query_mask, dropout_mask,
                   **config._asdict())
  _, pullback = jax.vjp(attend, q,
                        None if projected is None else projected[:2],
                        None if window is None else window[:2])
  d_q, d_projected, d_window = pullback(cotangents)
  if projected is not None:
    d_projected = d_projected + (None,)
  if window is not None:
    d_window = d_window + (None,)
  return d_q, d_projected, d_window, None, None


_attend_recomputed.defvjp(_attend_fwd, _attend_bwd)


class LongShortAttention(base.Attention):
  """Transformer-LS attention (see the module docstring).

  Attributes:
    window_size: w. Bidirectional: segment length, each segment attends to
      w + 2 max(w // 2, 1) keys. Causal: each query attends to its last w
      positions, itself included. 0 disables the window.
    num_landmarks: r, dynamic-projection vectors per head (per chunk and head
      when causal; the official autoregressive scripts use 1). 0 disables the
      long-range part.
    chunk_size: l, the causal chunk length (None = 16, the official
      autoregressive scripts' value). Only for `causal=True` with
      `num_landmarks > 0`.
    conv_kernel_size: k > 0 adds a zero-initialised depthwise convolution of
      odd width k over the values (bidirectional only); 0 = off (LRA scripts).
    normalize_before_compress: compress LN_L(W_k X), LN_L(W_v X) (True) or the
      raw W_k X, W_v X (False) before LN_G. None follows the official code of
      each form: True bidirectional, False causal. Only with
      `num_landmarks > 0`.
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('default', {}),
      ('w3_r2', {'window_size': 3, 'num_landmarks': 2}),
      ('conv', {'conv_kernel_size': 3}),
  )

  window_size: int = 8
  num_landmarks: int = 32
  chunk_size: Optional[int] = None
  conv_kernel_size: int = 0
  normalize_before_compress: Optional[bool] = None

  def check_knobs(self) -> None:
    w, r = self.window_size, self.num_landmarks
    if w < 0 or r < 0:
      raise ValueError(f'window_size={w} and num_landmarks={r} must be >= 0.')
    if w == 0 and r == 0:
      raise ValueError('window_size=0 and num_landmarks=0 leave nothing to '
                       'attend to; set at least one of them > 0.')
    if self.conv_kernel_size < 0 or (
        self.conv_kernel_size and self.conv_kernel_size % 2 == 0):
      raise ValueError(f'conv_kernel_size={self.conv_kernel_size} must be 0 '
                       '(off) or odd, so that the output keeps the length.')
    if r == 0 and self.normalize_before_compress is not None:
      raise ValueError('normalize_before_compress only affects the dynamic '
                       'projection, which num_landmarks=0 turns off; leave '
                       'it None.')
    if self.causal:
      if self.chunk_size is not None and self.chunk_size < 1:
        raise ValueError(f'chunk_size={self.chunk_size} must be >= 1.')
      if self.chunk_size is not None and r == 0:
        raise ValueError('chunk_size only affects the dynamic projection, '
                         'which num_landmarks=0 turns off; leave it None.')
      if self.conv_kernel_size:
        raise NotImplementedError(
            'conv_kernel_size > 0 has no causal form (the official code only '
            'has it in the bidirectional model); set conv_kernel_size=0.')
    elif self.chunk_size is not None:
      raise ValueError(
          f'chunk_size={self.chunk_size} only applies to causal=True; the '
          'bidirectional form projects the whole sequence. Leave it None.')

  def _dual_ln(self, name: str) -> nn.Module:
    # Over all heads jointly, as the official LayerNorm(heads * head_dim).
    return _DualLayerNorm(dtype=self.dtype, name=name)

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies the attention; see `base.Attention.attend`."""
    out_features = self.head_dims(x).out_features
    w, r = self.window_size, self.num_landmarks
    chunk = self.chunk_size or DEFAULT_CHUNK_SIZE
    # Whole segments (bidirectional) or chunks and window blocks (causal,
    # like the official autoregressive evaluation, which pads to lcm(l, w)).
    multiple = math.lcm(max(w, 1), chunk if self.causal and r else 1)
    length = x.shape[1]
    # Padded once for the whole layer (the kernel: to its tile too).
    x, padding_mask = base.pad_to_length(
        x, padding_mask, self.kernel('length')(x, multiple, chunk))
    x = x.astype(self.dtype)
    q, k, v = self.project_qkv(x, scale_query=True)
    ln_local = self._dual_ln('ln_local')
    k_local, v_local = ln_local(k), ln_local(v)

    normalize = self.normalize_before_compress
    if normalize is None:
      normalize = not self.causal
    k_src, v_src = (k_local, v_local) if normalize else (k, v)
    scores = None
    if r:
      # W^P without bias: a bias is constant along the normalised axis.
      scores = nn.DenseGeneral(
          features=(self.num_heads, r), axis=-1, use_bias=False,
          kernel_init=self.kernel_init, dtype=self.dtype,
          param_dtype=jnp.float32, name='landmark_scores')(x)
    ln_global = self._dual_ln('ln_global') if r else None

    if self.causal:
      projected = self._causal_projected(k_src, v_src, scores, ln_global,
                                         padding_mask, chunk) if r else None
      left, right = w, 0
    else:
      projected = self._bidirectional_projected(
          k_src, v_src, scores, ln_global, padding_mask) if r else None
      left = right = window_extension(w)
    window = (k_local, v_local, padding_mask) if w else None

    out, mass = self.kernel('core')(q, projected, window, padding_mask,
                                    chunk, (left, right), deterministic)
    if mass is not None:
      real = padding_mask[:, None, :].astype(jnp.float32)
      self.sow('metrics', 'long_range_mass',
               jnp.sum(mass * real) / jnp.maximum(
                   jnp.sum(real) * self.num_heads, 1.0))

    if self.conv_kernel_size:
      out = out + self._value_conv(v_local, padding_mask)
    y = self.output_projection(out_features)(out.astype(self.dtype))
    return y[:, :length]

  def _core_xla(self, q, projected, window, padding_mask, chunk, extension,
                deterministic):
    """The attention core: each query's window keys and landmarks under
    one softmax (`_attend_recomputed`), its weights sown as `probs`.

    Returns the output and the landmark weight per query (None unless both
    parts are present).
    """
    del chunk  # The landmarks' validity already holds it.
    w, r = self.window_size, self.num_landmarks
    left, right = extension
    slots = ((projected[0].shape[1] if r else 0)
             + (left + w + right if w else 0))
    dropout_mask = None
    if not deterministic and self.dropout_rate > 0.0:
      # The same draw as `base.attention_dropout` on the joint weights.
      dropout_mask = jax.random.bernoulli(
          self.make_rng('dropout'), 1.0 - self.dropout_rate,
          (q.shape[0], self.num_heads, q.shape[1], slots))
    config = _AttendConfig(window_size=w, left=left, right=right,
                           causal=self.causal,
                           keep_prob=1.0 - self.dropout_rate)
    out, probs = _attend_recomputed(config, q, projected, window,
                                    padding_mask, dropout_mask)
    mass = None
    if not self.is_initializing():
      self.sow('intermediates', 'probs', jnp.concatenate(probs, -1))
      if r and w:
        mass = jnp.sum(probs[0], -1)
    return out, mass

  def _core_pallas(self, q, projected, window, padding_mask, chunk,
                   extension, deterministic):
    """The attention core as one fused kernel (`lra_msmra.kernels.
    long_short`).

    Same function as `_core_xla` (whose `probs` it cannot sow); returns the
    output and, when the `metrics` collection is collected and both parts
    are present, the landmark weight per query.
    """
    del extension  # The kernel's geometry holds it.
    r = self.num_landmarks
    geometry = fused.Geometry(self.window_size, r, self.causal, chunk)
    landmarks = None
    if r:
      landmarks = (projected[0], projected[1],
                   fused.landmark_flags(padding_mask, geometry))
    with_mass = bool(r and self.window_size and not self.is_initializing()
                     and self.is_mutable_collection('metrics'))
    return fused.attend(q, landmarks, window, padding_mask, geometry,
                        long_range_mass=with_mass,
                        **flash.layer_dropout(self, deterministic))

  def _length_xla(self, x: Array, multiple: int, chunk: int) -> int:
    """The padded length: whole segments (causal: and chunks)."""
    del chunk
    return -(-x.shape[1] // multiple) * multiple

  def _length_pallas(self, x: Array, multiple: int, chunk: int) -> int:
    """The padded length: whole segments and chunks, and whole tiles of
    the kernel call (`lra_msmra.kernels.long_short.padded_length`)."""
    return fused.padded_length(
        x.shape[1], multiple,
        fused.Geometry(self.window_size, self.num_landmarks, self.causal,
                       chunk),
        rows=x.shape[0] * self.num_heads, head_dim=self.head_dims(x)[1],
        dtype=self.dtype)

  def _weighted_sums_xla(self, w: Array, x: Array) -> Array:
    """`[b, n, h, r]` weights of `[b, n, h, d]` -> `[b, h, r, d]`."""
    return jnp.einsum('bnhr,bnhd->bhrd', w, x)

  def _weighted_sums_pallas(self, w: Array, x: Array) -> Array:
    """The same sums in the GPU's form: a fused multiply-reduce, without
    the transposed copies a matrix product makes in the model's layout
    (`lra_msmra.kernels.sequence_sums`)."""
    return sequence_sums.weighted_sums(w, x)

  # The kernel switch (`base.Attention.KERNELS`).
  KERNELS = {'xla': {'core': _core_xla, 'length': _length_xla,
                     'weighted_sums': _weighted_sums_xla},
             fused.IMPLEMENTATION: {'core': _core_pallas,
                                    'length': _length_pallas,
                                    'weighted_sums': _weighted_sums_pallas}}

  # -- bidirectional --------------------------------------------------------

  def _project(self, src: Array, weights: Array, ln_global: nn.Module
               ) -> Array:
    """LN_G of the weighted sums of `src` `[b, n, h, d]` in float32, with
    `weights` `[b, n, h, r]`: `[b, r, h, d]` (the kernel switch's
    `weighted_sums`)."""
    compressed = self.kernel('weighted_sums')(weights,
                                              src.astype(jnp.float32))
    return ln_global(jnp.swapaxes(compressed, 1, 2)).astype(self.dtype)

  def _bidirectional_projected(self, k_src, v_src, scores, ln_global,
                               padding_mask):
    """(K̄, V̄, validity) of the dynamic projection over the sequence."""
    batch, length = k_src.shape[:2]
    r = self.num_landmarks
    # P: softmax over the sequence axis, padded positions excluded.
    p = base.safe_softmax(scores, padding_mask[:, :, None, None], axis=1)
    k_bar = self._project(k_src, p, ln_global)
    v_bar = self._project(v_src, p, ln_global)
    if not self.is_initializing():
      self.sow('intermediates', 'projection', p)
      self.sow('intermediates', 'compressed_keys', k_bar)
    return k_bar, v_bar, jnp.ones((batch, 1, length, r), bool)

  def _value_conv(self, v_local: Array, padding_mask: Array) -> Array:
    """Depthwise convolution over the sequence of the masked values."""
    batch, length, heads, head_dim = v_local.shape
    size = self.conv_kernel_size
    kernel = self.param('value_conv', nn.initializers.zeros, (size, heads),
                        jnp.float32)
    # One tap per head shared by its head_dim channels (channel h*d + i).
    kernel = jnp.repeat(kernel, head_dim, axis=1)[:, None, :]
    v = v_local * padding_mask[..., None, None].astype(v_local.dtype)
    v = v.reshape(batch, length, heads * head_dim)
    out = jax.lax.conv_general_dilated(
        v, kernel.astype(self.dtype), window_strides=(1,),
        padding=[(size // 2, size // 2)],
        dimension_numbers=('NWC', 'WIO', 'NWC'),
        feature_group_count=heads * head_dim)
    return out.reshape(batch, length, heads, head_dim)

  # -- causal ---------------------------------------------------------------

  def _causal_projected(self, k_src, v_src, scores, ln_global, padding_mask,
                        chunk):
    """(K̄, V̄, validity) of the per-chunk projections (causal form)."""
    batch, length, heads, head_dim = k_src.shape
    r = self.num_landmarks
    n_chunks = length // chunk
    chunk_mask = padding_mask.reshape(batch, n_chunks, chunk)
    # P: softmax over the positions of each chunk, padded ones excluded.
    p = base.safe_softmax(
        scores.reshape(batch, n_chunks, chunk, heads, r),
        chunk_mask[..., None, None], axis=2)

    def compress(src):  # Each chunk's sums: chunks as batch rows.
      src = src.reshape(batch * n_chunks, chunk, heads, head_dim)
      out = self._project(src, p.reshape(batch * n_chunks, chunk, heads, r),
                          ln_global)
      return out.reshape(batch, n_chunks * r, heads, head_dim)
    k_bar, v_bar = compress(k_src), compress(v_src)
    if not self.is_initializing():
      self.sow('intermediates', 'projection', p)
      self.sow('intermediates', 'compressed_keys', k_bar)
    # Query chunk c sees the vectors of chunks < c that hold a real token.
    key_chunk = jnp.arange(n_chunks * r) // r
    query_chunk = jnp.arange(length) // chunk
    earlier = key_chunk[None, :] < query_chunk[:, None]
    chunk_real = jnp.repeat(jnp.any(chunk_mask, -1), r, axis=1)
    return k_bar, v_bar, earlier[None, None] & chunk_real[:, None, None, :]
