"""Transformer-LS's attention core as one fused Pallas flash attention.

The `long_short` mechanism (`lra_msmra.attention.long_short`) attends, under
one softmax, to the keys of a local window and to the r dynamic-projection
landmarks K̄, V̄. Its `'xla'` implementation builds the window tiles and the
`[batch, heads, length, slots]` weights (`long_short._attend`) and recomputes
them in the backward pass. Its `'pallas'` implementation, here, runs that
core as one call of the flash kernel family (`lra_msmra.kernels.flash`),
forward and backward, so the weights only exist one tile at a time:

* the window is the flash `Window`: bidirectional, segments of w queries
  see the keys [g w - e, (g + 1) w + e), e = max(w // 2, 1) ('segment',
  left = right = e); causal, query t sees the keys [t - w + 1, t]
  ('sliding', left = w - 1, causal);
* the landmarks are the flash extra keys: bidirectional, every query sees
  all r ('all'); causal, query chunk c sees the r landmarks of each earlier
  chunk that holds a real token ('earlier_group', groups of r landmarks and
  of l = `chunk_size` queries, flags from `landmark_flags`);
* window keys are flagged by the padding mask, and the output of a padded
  query is zeroed, as the 'xla' core zeroes its weights.

`window_size=0` (landmarks only) and `num_landmarks=0` (window only) drop
one of the two key sets. Everything around the core (projections, DualLN,
the landmark projection P and its softmax over the sequence, the optional
convolution) is the mechanism's shared code, so both implementations have
the same variables.

What the fused kernel does not give: the joint weights (`probs`), which the
'xla' core sows into `intermediates`; apply the same variables with
`implementation='xla'` to inspect them. The metric `long_range_mass` (mean
weight on the landmarks) comes from the same kernel call: the flash
kernel's running sums give each query's weight on its extra keys
(`return_extra_mass`), at no extra pass.

Attention dropout is the flash kernel's: a keep mask hashed from a seed of
the layer's dropout RNG (`flash.keep_mask`, window keys counted by sequence
position, landmarks by index), redrawn in the backward pass; the same rate
as the 'xla' core's `jax.random` mask, other bits.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from lra_msmra.kernels import flash

Array = jax.Array

IMPLEMENTATION = 'pallas'
# Queries and keys per kernel tile (read at each call: tests lower it to
# get several tiles from short sequences).
BLOCK = flash.DEFAULT_BLOCK


class Geometry(NamedTuple):
  """Which keys a query sees (static).

  Attributes:
    window_size: w; 0 = no window keys.
    num_landmarks: r (per chunk when causal); 0 = no landmarks.
    causal: the causal form (sliding window, per-chunk landmarks).
    chunk_size: l, queries per landmark chunk (causal only).
  """
  window_size: int
  num_landmarks: int
  causal: bool = False
  chunk_size: int = 1

  def window(self) -> Optional[flash.Window]:
    w = self.window_size
    if not w:
      return None
    if self.causal:
      return flash.Window('sliding', left=w - 1, right=0, causal=True)
    e = max(w // 2, 1)
    return flash.Window('segment', size=w, left=e, right=e)

  def extra_rule(self) -> Optional[flash.Extra]:
    if not self.num_landmarks:
      return None
    if self.causal:
      return flash.Extra('earlier_group', key_group=self.num_landmarks,
                         query_group=self.chunk_size)
    return flash.Extra('all')


def landmark_flags(padding_mask: Array, geometry: Geometry) -> Array:
  """Which landmarks may be attended: bool `[batch, landmarks]`.

  Bidirectional: all r. Causal: the r landmarks of each chunk of
  `chunk_size` positions that holds a real token (a chunk without one has
  no projection); which chunks a query sees is the kernel's rule.
  """
  batch, length = padding_mask.shape
  r = geometry.num_landmarks
  if not geometry.causal:
    return jnp.ones((batch, r), bool)
  chunks = padding_mask.reshape(batch, length // geometry.chunk_size, -1)
  return jnp.repeat(jnp.any(chunks, -1), r, axis=1)


def padded_length(length: int, multiple: int, geometry: Geometry, *,
                  rows: int, head_dim: int, dtype,
                  block: Optional[int] = None) -> int:
  """The length a layer pads its input to, once, so that `attend` pads
  nothing: a multiple of `multiple` (the layer's segments and chunks) and
  of the call's tile (`flash.aligned_length`); `rows` = batch x heads,
  `head_dim` the queries' and values' width, `dtype` the queries'."""
  rule = geometry.extra_rule()

  def tiles(n: int) -> list[int]:
    landmarks = 0
    if rule is not None:
      landmarks = geometry.num_landmarks * (
          n // geometry.chunk_size if geometry.causal else 1)
    return [flash.call_tile(
        n, n if geometry.window_size else 0, landmarks,
        rules=(geometry.window(), rule), rows=rows, width=head_dim,
        dtype=dtype, block=block or BLOCK)]
  return flash.aligned_length(length, multiple, tiles)


# -- the attention core ------------------------------------------------------


def attend(q: Array, landmarks: Optional[tuple[Array, Array, Array]],
           window: Optional[tuple[Array, Array, Array]], query_mask: Array,
           geometry: Geometry, *, dropout_rate: float = 0.0,
           dropout_seed: Optional[Array] = None,
           block: Optional[int] = None, long_range_mass: bool = False
           ) -> tuple[Array, Optional[Array]]:
  """One joint softmax over the window keys and the landmarks, fused.

  The function of `lra_msmra.attention.long_short._attend`: the same output,
  and gradients for q, the window keys and values and the landmarks. With
  dropout, the keep mask is the flash kernel's (`flash.keep_mask`; window
  keys counted by sequence position, landmarks by index), not `jax.random`'s.

  Args:
    q: scaled queries `[batch, length, heads, head_dim]`.
    landmarks: None, or (K̄, V̄ `[batch, m, heads, head_dim]`, bool flags
      `[batch, m]` from `landmark_flags`); m = r, causal (length / l) r.
    window: None, or (keys, values `[batch, length, heads, head_dim]`, bool
      key mask `[batch, length]`, True = real token).
    query_mask: bool `[batch, length]`; False rows output zero.
    geometry: the window and landmark rules.
    dropout_rate: attention dropout on the joint weights (0: none).
    dropout_seed: int32 or uint32 scalar drawn from the dropout RNG;
      required with dropout.
    block: queries and keys per kernel tile (`flash.tile_size`); None:
      `BLOCK`.
    long_range_mass: also return each query's total weight on the landmarks
      (before dropout).

  Returns:
    The combined values `[batch, length, heads, head_dim]` in q's dtype, and
    None or the landmark weight per query, float32 `[batch, heads, length]`
    (0 at padded queries; no gradient).
  """
  rule, win = geometry.extra_rule(), geometry.window()
  if (rule is None) != (landmarks is None) or (win is None) != (
      window is None):
    raise ValueError(f'{geometry} does not match the key sets given '
                     f'(landmarks: {landmarks is not None}, window: '
                     f'{window is not None}).')
  length = q.shape[1]
  if geometry.causal and rule is not None and length % geometry.chunk_size:
    raise ValueError(f'length {length} is not a multiple of chunk_size='
                     f'{geometry.chunk_size}.')
  # The kernels read the model's layout as it is ('bnhd').
  k = v = key_mask = extra = None
  if window is not None:
    k, v, key_mask = window
  if landmarks is not None:
    extra = landmarks
  call = functools.partial(flash.flash_attention, window=win,
                           extra_rule=rule or flash.Extra(),
                           block=block or BLOCK, layout='bnhd')
  with_mass = long_range_mass and landmarks is not None
  out = call(q, k, v, key_mask, extra=extra, dropout_rate=dropout_rate,
             dropout_seed=dropout_seed, return_extra_mass=with_mass)
  mass = None
  if with_mass:
    out, weight = out
  out = jnp.where(query_mask[:, :, None, None], out, jnp.zeros((), out.dtype))
  if with_mass:
    mass = jnp.where(query_mask[:, None, :], weight, 0.0)
  return out, mass
