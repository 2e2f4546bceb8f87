"""Long-Short attention (Transformer-LS), bidirectional and autoregressive.

Paper: Zhu et al., "Long-Short Transformer: Efficient Transformers for
Language and Vision", NeurIPS 2021, arXiv:2107.02192. Official PyTorch code:
github.com/NVIDIA/transformer-ls (`lra/attention_transformer_ls.py`, class
`AttentionLS`, for the bidirectional model; `autoregressive/model_lib/
layer.py`, class `ChunkedLSAttention`, for the autoregressive one).

Every query attends, under one softmax, to the union of

* **short-term** keys/values in a local window, and
* **long-range** keys/values: r "dynamic projections" per head,
  K̄ = Pᵀ LN_L(K), V̄ = Pᵀ LN_L(V), where P = softmax(X W^P) is normalised over
  the sequence (paper Eq. 3, 4).

DualLN (paper Eq. 7) normalises the window keys/values with LN_L and the
projected ones with LN_G, so that both have the same scale at initialisation.

Bidirectional form (`causal=False`), as the official LRA code computes it
-------------------------------------------------------------------------
With head width d, queries Q = W_q X / sqrt(d), keys K = LN_L(W_k X) and
values V = LN_L(W_v X):

1. P = softmax over the sequence of W^P X, per head and landmark, padded
   positions excluded (they get exactly zero weight).
2. K̄ = LN_G(Pᵀ K), V̄ = LN_G(Pᵀ V): r vectors per head.
3. The sequence is cut into segments of w tokens. A query of segment g sees
   the keys at positions [g w - e, (g + 1) w + e) with e = max(w // 2, 1);
   positions outside [0, N) and padded positions are masked.
4. One softmax over [r projected | w + 2e window] logits per query; padded
   query rows are zeroed.
5. Optionally a depthwise convolution over the sequence of V (padded
   positions zeroed) is added to the head outputs (`conv_kernel_size`).

`window_size=0` gives pure dynamic-projection attention, `num_landmarks=0`
pure segment-wise window attention.

Autoregressive form (`causal=True`, paper §3.3 Eq. 5)
-----------------------------------------------------
* The sequence is cut into chunks of l = `chunk_size` tokens. Each chunk is
  compressed on its own: P is a softmax over the l positions of the chunk,
  giving r vectors per chunk and head (the code's `chunk_rank`). A query in
  chunk c sees the compressed vectors of chunks 0 .. c-1 only.
* The window is per token, as in the autoregressive code: query t sees keys
  [t - w + 1, t], itself included.
* As in the autoregressive code, chunks compress the raw W_k X and W_v X, and
  LN_G is applied afterwards (`normalize_before_compress=None`).

Where the paper and the official code differ, we follow the code:

* Window width: w + 2 max(w // 2, 1) keys (the paper says 2w; they differ for
  odd w, and w = 1, the best Text/Retrieval setting, gives 3 keys).
* Out-of-range keys are masked, not just zero-padded.
* DualLN normalises over all heads jointly (LayerNorm over heads x head_dim,
  parameters of shape [heads, head_dim]), with PyTorch's epsilon 1e-5, one
  LN_L shared by keys and values and one LN_G shared by K̄ and V̄.
* W^P is fed the attention input X (already layer-normalised by the block),
  not the projected keys.
* The optional convolution is zero-initialised, one k-tap kernel per head
  shared by the head's channels, no bias, cross-correlation with k // 2 zeros
  on each side, as `AttentionLS.conv`.

Where we depart from both, or where they are silent:

* W^P has no bias. The official `dconv_fc` has one, but P is normalised over
  the sequence (or chunk) axis, along which the bias is constant, so it
  cancels and never receives a gradient.
* Padded query positions output exactly zero (project convention). The
  official code zeroes their attention weights, so it returns W_o's bias
  there, plus the convolution term.
* A sequence with no real token gives zero outputs instead of NaN: every
  softmax here is a safe softmax (rows without a valid entry get zero weight).
* Lengths not divisible by w (bidirectional) or by lcm(l, w) (causal) are
  right-padded internally with masked positions, then cropped. The official
  LRA code requires N % w == 0 and its data scripts pad with masked zeros;
  the official autoregressive evaluation pads to a multiple of lcm(l, w):
  both are the same function.
* The LRA harness's CLS token that joins only the last layer's attention
  (`--cls_last_layer`) is not part of this module; pooling is the encoder's.
* Causal form, cache-free: positions before 0 are masked. The official
  autoregressive model attends to an all-zero Transformer-XL cache on its
  first block instead, so its first-block numerics differ. The causal form
  has no relative position terms (the code's `r_net`, `r_net_chunk`, u, v):
  positions come from the encoder. Padded positions are masked in the window
  and in each chunk's P; a chunk with no real token is not attended.
* `normalize_before_compress` exposes the one pre-/post-LN difference
  between the two official codes as a flag (ATTENTIONS §2.8 item 3).
* The convolution has no causal form in the official code; with
  `causal=True` it raises `NotImplementedError`.

Cost. Bidirectional: O(N (r + w + 2e) d) time and O(N (r + w + 2e)) score
memory per head: linear in N. Causal: the window part is O(N w d), but a query
attends to up to (N / l) r compressed vectors, so the compressed logits are
`[batch, heads, N, (N / l) r]`: quadratic in N with the small constant r / l,
exactly as in the official autoregressive code and paper Eq. 5.

Intermediates. With `mutable=['intermediates']` the module sows
`projection` (P; bidirectional `[batch, length, heads, r]`, causal
`[batch, chunks, l, heads, r]`), `compressed_keys` (LN_G(K̄);
`[batch, r or chunks * r, heads, head_dim]`) and `probs` (the joint weights
after zeroing padded queries, before dropout; `[batch, heads, length,
slots]`, projected slots first, then window slots in key order). Lengths are
the internally padded ones. During training it sows the metric
`long_range_mass`: the mean attention mass on projected keys over real
queries, when both parts are present.
"""

from __future__ import annotations

import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base

Array = jax.Array

# Chunk length of the official autoregressive launch scripts (`csize`).
DEFAULT_CHUNK_SIZE = 16
# PyTorch's LayerNorm epsilon, used by the official DualLN layers.
DUAL_LN_EPS = 1e-5


def window_extension(window_size: int) -> int:
  """Keys added on each side of a bidirectional segment: max(w // 2, 1)."""
  return max(window_size // 2, 1)


def _tiles(a: Array, size: int, left: int, right: int, fill) -> Array:
  """Cuts `[batch, G * size, ...]` into overlapping tiles.

  Tile g holds positions [g * size - left, (g + 1) * size + right); positions
  outside the sequence are `fill`. Needs left, right <= size.

  Returns:
    `[batch, G, left + size + right, ...]`.
  """
  batch, length = a.shape[:2]
  blocks = a.reshape((batch, length // size, size) + a.shape[2:])
  parts = []
  if left:
    edge = jnp.full((batch, 1, left) + a.shape[2:], fill, a.dtype)
    parts.append(jnp.concatenate([edge, blocks[:, :-1, size - left:]], 1))
  parts.append(blocks)
  if right:
    edge = jnp.full((batch, 1, right) + a.shape[2:], fill, a.dtype)
    parts.append(jnp.concatenate([blocks[:, 1:, :right], edge], 1))
  return jnp.concatenate(parts, axis=2)


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
  window_size: int = 8
  num_landmarks: int = 32
  chunk_size: Optional[int] = None
  conv_kernel_size: int = 0
  normalize_before_compress: Optional[bool] = None

  def _check_knobs(self) -> None:
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
    return nn.LayerNorm(epsilon=DUAL_LN_EPS, reduction_axes=(-2, -1),
                        feature_axes=(-2, -1), dtype=self.dtype,
                        param_dtype=jnp.float32, name=name)

  @nn.compact
  def __call__(self, x: Array, *, padding_mask: Optional[Array] = None,
               deterministic: bool = True) -> Array:
    """Applies the attention.

    Args:
      x: `[batch, length, features]`.
      padding_mask: `[batch, length]` bool, True = real token; None = all
        real.
      deterministic: disables attention dropout.

    Returns:
      `[batch, length, out_features]`, zero at padded positions.
    """
    self._check_knobs()
    padding_mask = base.default_padding_mask(x, padding_mask)
    _, head_dim, out_features = self.head_dims(x)
    w, r = self.window_size, self.num_landmarks
    chunk = self.chunk_size or DEFAULT_CHUNK_SIZE
    # Whole segments (bidirectional) or chunks and window blocks (causal,
    # like the official autoregressive evaluation, which pads to lcm(l, w)).
    multiple = math.lcm(max(w, 1), chunk if self.causal and r else 1)
    length = x.shape[1]
    x, padding_mask, _ = base.pad_to_multiple(x, padding_mask, multiple)
    x = x.astype(self.dtype)

    q = self.projection(head_dim, 'query')(x)
    q = q / jnp.sqrt(head_dim).astype(self.dtype)
    k = self.projection(head_dim, 'key')(x)
    v = self.projection(head_dim, 'value')(x)
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
      parts = self._causal_parts(q, k_local, v_local, k_src, v_src, scores,
                                 ln_global, padding_mask, chunk)
    else:
      parts = self._bidirectional_parts(q, k_local, v_local, k_src, v_src,
                                        scores, ln_global, padding_mask)
    logits, valid, values = parts

    probs = base.safe_softmax(jnp.concatenate(logits, -1),
                              jnp.concatenate(valid, -1))
    probs = probs * padding_mask[:, None, :, None]
    if not self.is_initializing():
      self.sow('intermediates', 'probs', probs)
      if r and w:
        real = padding_mask[:, None, :].astype(jnp.float32)
        mass = jnp.sum(probs[..., :logits[0].shape[-1]], -1)
        self.sow('metrics', 'long_range_mass',
                 jnp.sum(mass * real) / jnp.maximum(
                     jnp.sum(real) * self.num_heads, 1.0))
    probs = self.attention_dropout(probs, deterministic).astype(self.dtype)

    out = 0.0
    start = 0
    for logit, combine in zip(logits, values):
      width = logit.shape[-1]
      out = out + combine(probs[..., start:start + width])
      start += width

    if self.conv_kernel_size:
      out = out + self._value_conv(v_local, padding_mask)
    y = self.output_projection(out_features)(out.astype(self.dtype))
    y = y * padding_mask[..., None].astype(y.dtype)
    return y[:, :length]

  # -- bidirectional --------------------------------------------------------

  def _project(self, src: Array, weights: Array, ln_global: nn.Module,
               pattern: str) -> Array:
    """Weighted sums of `src` in float32, then LN_G."""
    compressed = jnp.einsum(pattern, weights, src.astype(jnp.float32))
    return ln_global(compressed).astype(self.dtype)

  def _bidirectional_parts(self, q, k_local, v_local, k_src, v_src, scores,
                           ln_global, padding_mask):
    """Logits, validity masks and value combiners of the two key sets.

    Each combiner maps its slice of the probabilities
    `[batch, heads, length, slots]` to `[batch, length, heads, head_dim]`.
    """
    batch, length, heads, head_dim = q.shape
    w, r = self.window_size, self.num_landmarks
    logits, valid, values = [], [], []
    if r:
      # P: softmax over the sequence axis, padded positions excluded.
      p = base.safe_softmax(scores, padding_mask[:, :, None, None], axis=1)
      k_bar = self._project(k_src, p, ln_global, 'bnhr,bnhd->brhd')
      v_bar = self._project(v_src, p, ln_global, 'bnhr,bnhd->brhd')
      if not self.is_initializing():
        self.sow('intermediates', 'projection', p)
        self.sow('intermediates', 'compressed_keys', k_bar)
      logits.append(jnp.einsum('bnhd,brhd->bhnr', q, k_bar,
                               preferred_element_type=jnp.float32))
      valid.append(jnp.ones((batch, 1, length, r), bool))
      values.append(lambda a: jnp.einsum('bhnr,brhd->bnhd', a, v_bar))
    if w:
      e = window_extension(w)
      groups, slots = length // w, w + 2 * e
      q_tiles = q.reshape(batch, groups, w, heads, head_dim)
      k_tiles = _tiles(k_local, w, e, e, 0)
      v_tiles = _tiles(v_local, w, e, e, 0)
      mask_tiles = _tiles(padding_mask, w, e, e, False)
      win = jnp.einsum('bgqhd,bgkhd->bhgqk', q_tiles, k_tiles,
                       preferred_element_type=jnp.float32)
      logits.append(win.reshape(batch, heads, length, slots))
      mask_tiles = jnp.broadcast_to(mask_tiles[:, None, :, None, :],
                                    (batch, 1, groups, w, slots))
      valid.append(mask_tiles.reshape(batch, 1, length, slots))

      def combine_window(a):
        a = a.reshape(batch, heads, groups, w, slots)
        out = jnp.einsum('bhgqk,bgkhd->bgqhd', a, v_tiles)
        return out.reshape(batch, length, heads, head_dim)
      values.append(combine_window)
    return logits, valid, values

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

  def _causal_parts(self, q, k_local, v_local, k_src, v_src, scores,
                    ln_global, padding_mask, chunk):
    """As `_bidirectional_parts`, for the autoregressive form."""
    batch, length, heads, head_dim = q.shape
    w, r = self.window_size, self.num_landmarks
    logits, valid, values = [], [], []
    if r:
      n_chunks = length // chunk
      chunk_mask = padding_mask.reshape(batch, n_chunks, chunk)
      # P: softmax over the positions of each chunk, padded ones excluded.
      p = base.safe_softmax(
          scores.reshape(batch, n_chunks, chunk, heads, r),
          chunk_mask[..., None, None], axis=2)

      def compress(src):
        src = src.reshape(batch, n_chunks, chunk, heads, head_dim)
        out = self._project(src, p, ln_global, 'bclhr,bclhd->bcrhd')
        return out.reshape(batch, n_chunks * r, heads, head_dim)
      k_bar, v_bar = compress(k_src), compress(v_src)
      if not self.is_initializing():
        self.sow('intermediates', 'projection', p)
        self.sow('intermediates', 'compressed_keys', k_bar)
      logits.append(jnp.einsum('bnhd,bmhd->bhnm', q, k_bar,
                               preferred_element_type=jnp.float32))
      # Query chunk c sees the vectors of chunks < c that hold a real token.
      key_chunk = jnp.arange(n_chunks * r) // r
      query_chunk = jnp.arange(length) // chunk
      earlier = key_chunk[None, :] < query_chunk[:, None]
      chunk_real = jnp.repeat(jnp.any(chunk_mask, -1), r, axis=1)
      valid.append(earlier[None, None] & chunk_real[:, None, None, :])
      values.append(lambda a: jnp.einsum('bhnm,bmhd->bnhd', a, v_bar))
    if w:
      # Block g of w queries with keys [g w - w, g w + w): the previous block
      # and its own; a band keeps keys [t - w + 1, t] of query t.
      groups = length // w
      q_tiles = q.reshape(batch, groups, w, heads, head_dim)
      k_tiles = _tiles(k_local, w, w, 0, 0)
      v_tiles = _tiles(v_local, w, w, 0, 0)
      mask_tiles = _tiles(padding_mask, w, w, 0, False)
      win = jnp.einsum('bgqhd,bgkhd->bhgqk', q_tiles, k_tiles,
                       preferred_element_type=jnp.float32)
      logits.append(win.reshape(batch, heads, length, 2 * w))
      offset = jnp.arange(2 * w)[None, :] - jnp.arange(w)[:, None]
      band = (offset >= 1) & (offset <= w)
      mask_tiles = mask_tiles[:, None, :, None, :] & band[None, None, None]
      valid.append(mask_tiles.reshape(batch, 1, length, 2 * w))

      def combine_window(a):
        a = a.reshape(batch, heads, groups, w, 2 * w)
        out = jnp.einsum('bhgqk,bgkhd->bgqhd', a, v_tiles)
        return out.reshape(batch, length, heads, head_dim)
      values.append(combine_window)
    return logits, valid, values
