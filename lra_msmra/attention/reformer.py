r"""Reformer: LSH attention with shared query-key (registry `reformer`).

Paper: Kitaev et al., ICLR 2020, arXiv:2001.04451. Official LRA code: google-
research/long-range-arena, `lra_benchmarks/models/reformer/`.

Shared query-key vectors are hashed by angular LSH (fixed rotations from
`hash_seed`), sorted by bucket and cut into chunks; each chunk attends to
itself and the previous chunk, and hash rounds are combined by their log-sum-
exps.

docs/mechanisms/reformer.md: the computation, every departure from the official
code and why, padding, the causal form (refused: `causal=True` raises), the
tested invariants and the LRA settings.
"""

from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base

Array = jax.Array

# Logit of a query's own position with mask_self (trax / paper).
SELF_LOGIT = -1e5


@functools.lru_cache(maxsize=32)
def lsh_rotations(seed: int, head_dim: int, num_hashes: int,
                  num_buckets: int) -> Optional[Array]:
  """Random rotations `[head_dim, num_hashes, num_buckets // 2]` (float32).

  None for one bucket (no hashing). Computed eagerly, also under `jit`.
  """
  if num_buckets == 1:
    return None
  with jax.ensure_compile_time_eval():
    return jax.random.normal(jax.random.PRNGKey(seed),
                             (head_dim, num_hashes, num_buckets // 2),
                             jnp.float32)


def hash_buckets(x: Array, rotations: Optional[Array], num_hashes: int
                 ) -> Array:
  """Angular LSH buckets `[batch, heads, num_hashes, length]` of x `[b,n,h,d]`.
  """
  if rotations is None:
    return jnp.zeros((x.shape[0], x.shape[2], num_hashes, x.shape[1]),
                     jnp.int32)
  rotated = jnp.einsum('bnhd,dri->bhrni', x.astype(jnp.float32), rotations)
  rotated = jnp.concatenate([rotated, -rotated], axis=-1)
  return jnp.argmax(rotated, axis=-1).astype(jnp.int32)


def length_normalized(x: Array, epsilon: float = 1e-6) -> Array:
  """x / RMS(x) over the last axis (the official `length_normalized`)."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True)
                           + epsilon)


def _softmax_and_lse(logits: Array, valid: Array) -> tuple[Array, Array]:
  """Softmax over valid entries of the last axis and its log-sum-exp.

  float32; rows without a valid entry get zero weights and lse = -inf, with
  finite gradients (as `base.safe_softmax`).
  """
  valid = jnp.broadcast_to(valid, logits.shape)
  masked = jnp.where(valid, logits, -jnp.inf)
  top = jnp.max(masked, axis=-1, keepdims=True)
  top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
  unnorm = jnp.exp(masked - top)
  total = unnorm.sum(-1, keepdims=True)
  has = total > 0
  total = jnp.where(has, total, 1.0)
  lse = jnp.where(has, top + jnp.log(total), -jnp.inf)[..., 0]
  return unnorm / total, lse


def _look_one_back(x: Array) -> Array:
  """`[..., chunks, c, ...]` -> each chunk followed by the chunk before it.

  The chunk axis is 2 (after batch and heads); chunk 0's "before" is the
  last chunk, as in the official code.
  """
  return jnp.concatenate([x, jnp.roll(x, 1, axis=2)], axis=3)


class ReformerAttention(base.Attention):
  """Reformer LSH attention (see the module docstring).

  Attributes:
    num_hashes: hash rounds (official LRA: 1).
    num_buckets: buckets per round, 1 or even (official LRA: 10).
    chunk_length: chunk length of the sorted sequence; None = the padded
      length / num_buckets (official LRA).
    normalize_keys: keys are the RMS-normalised queries (paper, trax).
    mask_self: a query's own position gets logit -1e5 (paper, trax).
    hash_seed: seed of the random rotations.
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('b4', {'num_buckets': 4}),
      ('b2_h2_chunk3_norm_self', {
          'num_buckets': 2, 'num_hashes': 2, 'chunk_length': 3,
          'normalize_keys': True, 'mask_self': True}),
  )

  num_hashes: int = 1
  num_buckets: int = 10
  chunk_length: Optional[int] = None
  normalize_keys: bool = False
  mask_self: bool = False
  hash_seed: int = 0

  def check_knobs(self) -> None:
    if self.causal:
      raise NotImplementedError(
          'Reformer has no exact causal form: LSH sorting makes the keys '
          "sharing a query's chunk depend on later tokens' hashes, and the "
          'official LRA code has none. Use causal=False.')
    for name in ('num_hashes', 'num_buckets'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'Reformer {name}={value!r} must be a positive int.')
    if self.num_buckets > 1 and self.num_buckets % 2:
      raise ValueError(f'Reformer num_buckets={self.num_buckets} must be 1 '
                       'or even (angular LSH hashes to [xR; -xR]).')
    if self.chunk_length is not None and (
        not isinstance(self.chunk_length, int) or self.chunk_length < 1):
      raise ValueError(f'Reformer chunk_length={self.chunk_length!r} must be '
                       'a positive int or None.')

  def layout(self, length: int) -> tuple[int, int]:
    """(padded length, chunk length) for an input of `length`."""
    if self.chunk_length is None:
      padded = -(-length // self.num_buckets) * self.num_buckets
      return padded, padded // self.num_buckets
    padded = -(-length // self.chunk_length) * self.chunk_length
    return padded, self.chunk_length

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies LSH attention; see `base.Attention.attend`."""
    # The shared query-key is the projection named 'query'.
    qk, v = self.project_qkv(x, ('query', 'value'))
    _, head_dim, out_features = self.head_dims(x)
    real, length = padding_mask, x.shape[1]
    padded, chunk = self.layout(length)
    qk, real_p, _ = base.pad_to_multiple(qk, real, padded)
    v, _, _ = base.pad_to_multiple(v, real, padded)
    batch, heads, rounds = x.shape[0], self.num_heads, self.num_hashes

    # Buckets; padded positions go to an extra last bucket.
    rotations = lsh_rotations(self.hash_seed, head_dim, rounds,
                              self.num_buckets)
    buckets = hash_buckets(jax.lax.stop_gradient(qk), rotations, rounds)
    buckets = jnp.where(real_p[:, None, None, :], buckets, self.num_buckets)
    pos = jnp.arange(padded)
    order = jnp.argsort(buckets * padded + pos, axis=-1)  # [b, h, r, n]
    undo = jnp.argsort(order, axis=-1)
    order = order.reshape(batch, heads, rounds * padded)

    def gather(a):  # [b, n, h, d] -> sorted [b, h, r * n, d]
      a = jnp.swapaxes(a, 1, 2)
      return jnp.take_along_axis(a, order[..., None], axis=2)

    chunks = rounds * padded // chunk
    to_chunks = lambda a: a.reshape(batch, heads, chunks, chunk, *a.shape[3:])
    sq = to_chunks(gather(qk))
    sv = to_chunks(gather(v))
    st = to_chunks(order)
    s_real = to_chunks(jnp.take_along_axis(
        jnp.broadcast_to(real_p[:, None, :], (batch, heads, padded)),
        order % padded, axis=2))
    sk = length_normalized(sq).astype(sq.dtype) if self.normalize_keys else sq
    sk, sv, kt, k_real = (_look_one_back(a) for a in (sk, sv, st, s_real))
    sq = sq / jnp.sqrt(head_dim).astype(sq.dtype)
    logits = jnp.einsum('bhcqd,bhckd->bhcqk', sq, sk,
                        preferred_element_type=jnp.float32)
    if self.mask_self:
      same = (st[..., :, None] % padded) == (kt[..., None, :] % padded)
      logits = jnp.where(same, SELF_LOGIT, logits)
    probs, lse = _softmax_and_lse(logits, k_real[..., None, :])
    probs = self.attention_dropout(probs, deterministic)
    out = jnp.einsum('bhcqk,bhckd->bhcqd', probs.astype(sv.dtype), sv,
                     preferred_element_type=jnp.float32)

    # Unsort each round, then weigh the rounds by their log-sum-exps.
    out = out.reshape(batch, heads, rounds, padded, head_dim)
    lse = lse.reshape(batch, heads, rounds, padded)
    out = jnp.take_along_axis(out, undo[..., None], axis=3)
    lse = jnp.take_along_axis(lse, undo, axis=3)
    weights = base.safe_softmax(lse, jnp.isfinite(lse), axis=2)
    out = jnp.einsum('bhrn,bhrnd->bnhd', weights, out)[:, :length]
    out = out.astype(self.dtype)
    return self.output_projection(out_features)(out)
