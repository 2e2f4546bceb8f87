"""Block-sparse softmax attention: one softmax over several parts of keys.

The common core of the sparse-pattern mechanisms (`local`, `sparse`,
`longformer`, `bigbird`). Queries are cut into G blocks of B consecutive
positions (`[batch, heads, G, B, d]`). Every query block sees a few *parts*
of keys, and one softmax is taken over the union of its parts:

* a **tiled** part holds keys and values per block, `[batch, heads, G, S, d]`
  (e.g. the block's own keys, a sliding-window tile, random blocks);
* a **shared** part holds keys and values seen by every block,
  `[batch, heads, S, d]` (e.g. global tokens, summary positions), so they
  are not copied once per block.

Each part carries a boolean validity broadcastable to `[batch, heads, G, B,
S]` (the pattern, the key padding mask, and any de-duplication where a key
appears in two parts). The softmax over the parts is the shared-maximum,
shared-total one of `base.safe_softmax_parts`: float32, zero weights for
rows without a valid key, finite gradients for any mask. Dropout, when
asked for, is one element-wise mask over the weights of all parts, as
`base.Attention.attention_dropout` draws over a softmax's weights.

Everything here is a pure function of arrays; the mechanisms build the parts
(static index arrays from numpy, gathers, masks) and call `attend`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra.attention import base

Array = jax.Array


class Part(NamedTuple):
  """Keys, values and validity of one part (see the module docstring).

  keys, values: `[batch, heads, G, S, d]` (tiled) or `[batch, heads, S, d]`
    (shared by every block).
  valid: bool, broadcastable to `[batch, heads, G, B, S]`.
  """
  keys: Array
  values: Array
  valid: Array


def heads_major(x: Array) -> Array:
  """`[batch, length, heads, d] -> [batch, heads, length, d]`."""
  return jnp.swapaxes(x, 1, 2)


def positions_major(x: Array) -> Array:
  """`[batch, heads, length, d] -> [batch, length, heads, d]`."""
  return jnp.swapaxes(x, 1, 2)


def to_blocks(x: Array, block: int) -> Array:
  """`[batch, heads, G * block, d] -> [batch, heads, G, block, d]`."""
  b, h, n, d = x.shape
  if n % block:
    raise ValueError(f'length {n} is not a multiple of the block {block}.')
  return x.reshape(b, h, n // block, block, d)


def from_blocks(x: Array) -> Array:
  """Inverse of `to_blocks`."""
  b, h, g, block, d = x.shape
  return x.reshape(b, h, g * block, d)


def append_empty(x: Array, key_valid: Array) -> tuple[Array, Array]:
  """Appends one all-zero, invalid position at index `length`.

  Index arrays point out-of-range slots (before position 0, past the end, an
  unused random slot) at it, so that a gather never reads a real key there.

  Args:
    x: `[batch, heads, length, d]`.
    key_valid: bool `[batch, length]`.

  Returns:
    `[batch, heads, length + 1, d]` and `[batch, length + 1]`.
  """
  x = jnp.pad(x, [(0, 0), (0, 0), (0, 1), (0, 0)])
  return x, jnp.pad(key_valid, [(0, 0), (0, 1)])


def gather_tiles(x: Array, index: np.ndarray) -> Array:
  """Keys or values at `index`, one tile per block.

  Args:
    x: `[batch, heads, length, d]`.
    index: int `[G, S]` (same for every head) or `[heads, G, S]`.

  Returns:
    `[batch, heads, G, S, d]`.
  """
  index = jnp.asarray(index)
  if index.ndim == 2:
    return jnp.take(x, index, axis=2)
  per_head = lambda xh, ih: jnp.take(xh, ih, axis=1)  # [b, n, d], [G, S]
  return jax.vmap(per_head, in_axes=(1, 0), out_axes=1)(x, index)


def gather_valid(key_valid: Array, index: np.ndarray) -> Array:
  """The key mask at `index`, broadcastable to `[batch, heads, G, B, S]`.

  Args:
    key_valid: bool `[batch, length]`.
    index: int `[G, S]` or `[heads, G, S]`.
  """
  index = jnp.asarray(index)
  if index.ndim == 2:
    return jnp.take(key_valid, index, axis=1)[:, None, :, None, :]
  return jnp.take(key_valid, index, axis=1)[:, :, :, None, :]


def attend(q: Array, parts: Sequence[Part], dropout_rng: Optional[Array] = None,
           dropout_rate: float = 0.0) -> tuple[Array, list[Array]]:
  """One softmax over all parts for every query block.

  Args:
    q: scaled queries `[batch, heads, G, B, d]`.
    parts: the key parts (`Part`), tiled or shared.
    dropout_rng: key of the attention dropout (None: no dropout). One
      element-wise mask is drawn for the weights of all parts together (a
      single draw compiles much faster on CPU than one per part).
    dropout_rate: probability of dropping a weight.

  Returns:
    `[batch, heads, G, B, d_v]` in `q`'s dtype, and the float32 weights per
    part `[batch, heads, G, B, S]` before dropout.
  """
  logits, valid = [], []
  for part in parts:
    pattern = ('bhgqd,bhgsd->bhgqs' if part.keys.ndim == 5
               else 'bhgqd,bhsd->bhgqs')
    logits.append(jnp.einsum(pattern, q, part.keys,
                             preferred_element_type=jnp.float32))
    valid.append(part.valid)
  probs = base.safe_softmax_parts(logits, valid)
  weights = probs
  if dropout_rng is not None and dropout_rate > 0.0:
    keep_prob = 1.0 - dropout_rate
    widths = [p.shape[-1] for p in probs]
    keep = jax.random.bernoulli(dropout_rng, keep_prob,
                                probs[0].shape[:-1] + (sum(widths),))
    starts = np.cumsum([0] + widths)
    weights = [jnp.where(keep[..., a:a + w], p / keep_prob, 0.0)
               for p, a, w in zip(probs, starts, widths)]
  out = 0.0
  for part, w in zip(parts, weights):
    pattern = ('bhgqs,bhgsd->bhgqd' if part.values.ndim == 5
               else 'bhgqs,bhsd->bhgqd')
    out = out + jnp.einsum(pattern, w.astype(q.dtype), part.values,
                           preferred_element_type=jnp.float32)
  return out.astype(q.dtype), probs


def dropout_args(module, deterministic: bool) -> dict:
  """`attend`'s dropout arguments for an `Attention` module (a fresh key).

  Empty when `deterministic` or the module's `dropout_rate` is 0. Call it
  once per `attend` call, so that every call draws its own mask.
  """
  if deterministic or module.dropout_rate == 0.0:
    return {}
  return {'dropout_rng': module.make_rng('dropout'),
          'dropout_rate': module.dropout_rate}


def window_index(num_blocks: int, block: int, left: int, right: int,
                 length: int) -> np.ndarray:
  """Key positions of a sliding window, one tile per query block.

  Block g (queries [g B, (g + 1) B)) gets the keys [g B - left, (g + 1) B +
  right): the union of the windows [i - left, i + right] of its queries.
  Positions outside [0, length) point at index `length` (`append_empty`).

  Returns:
    int32 `[num_blocks, left + block + right]`.
  """
  start = np.arange(num_blocks)[:, None] * block - left
  index = start + np.arange(left + block + right)[None, :]
  return np.where((index >= 0) & (index < length), index,
                  length).astype(np.int32)
