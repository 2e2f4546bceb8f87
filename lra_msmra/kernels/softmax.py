"""Softmax attention as users run it: cuDNN's and the TPU's fused kernels.

The `softmax` mechanism (`lra_msmra.attention.softmax`) computes full softmax
attention; its `'xla'` implementation is the LRA reference code. Users on
accelerators run the same function through a fused flash attention, which
never forms the `[length, length]` weights:

* `'cudnn'` (NVIDIA GPUs): `jax.nn.dot_product_attention(...,
  implementation='cudnn')`, cuDNN's flash attention. bfloat16 and float16
  only (cuDNN has no float32 form): a layer with another dtype is refused
  when it is built. Head dims must be multiples of 8, at most 128 before
  Hopper and 256 from Hopper on (JAX checks this when it traces the call on
  a GPU).
* `'tpu_flash'` (Cloud TPUs): the Pallas TPU flash attention that ships with
  JAX (`jax.experimental.pallas.ops.tpu.flash_attention`). Head dims up to
  128, or multiples of 128.

Padding, any pattern. cuDNN masks padding through sequence lengths, which
only describe trailing padding (real tokens first). A padding mask of
another shape (Image's black pixels with `model.mask_padding`, left
padding) is first made trailing: each row's tokens are reordered, real ones
first in their original order (a stable partition, `real_first`), attended
with the row's number of real tokens as its length, and put back. Attention
never reads positions (they are in the embeddings), and a stable partition
keeps the order of the real tokens, so the causal mask among them is
unchanged too: for trailing padding the reordering is the identity, for
any other it computes the same function. The TPU kernel takes padding as
segment ids (`segment_ids`): a real token gets id 1 and attends only to id
1, a padded position id 0; lengths are padded to a multiple of the kernel's
key block (`TPU_BLOCK`) with more id-0 positions.

Padded query rows are zero, output biases included: the padded-row rule of
every other mechanism (`lra_msmra.attention.base`). Only the `'xla'`
implementation keeps LRA's values there (docs/mechanisms/softmax.md §3.2):
a padded query attends uniformly to every position. With unmasked MEAN
pooling (P9) or a CLS query on a black pixel (P8), models read those rows,
so the fused implementations compute another model in that setting.

Neither kernel has attention dropout (neither forms the weights), so a layer
with `dropout_rate > 0` and one of them is refused when it is built
(`check`); set `config.model.attention_dropout_rate=0`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array

IMPLEMENTATIONS = ('cudnn', 'tpu_flash')
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
# The TPU kernel's key block (its default block sizes): the key length must
# be a multiple of it.
TPU_BLOCK = 128
# What `cudnn_attention` asks of `jax.nn.dot_product_attention`; the tests
# set 'xla' to run the same arguments on the CPU.
CUDNN_BACKEND = 'cudnn'


def check(implementation: str, *, dtype: Any, dropout_rate: float) -> None:
  """Refuses what a fused implementation cannot compute (at construction).

  Raises:
    ValueError: one line naming the field and the fix.
  """
  if dropout_rate:
    raise ValueError(
        f'implementation={implementation!r} has no attention dropout (the '
        f'fused kernel never forms the weights), got dropout_rate='
        f'{dropout_rate}: set config.model.attention_dropout_rate=0 or use '
        "implementation='xla'.")
  if implementation == 'cudnn' and jnp.dtype(dtype) not in CUDNN_DTYPES:
    raise ValueError(
        "implementation='cudnn' computes in bfloat16 or float16 only "
        f"(cuDNN's flash attention has no {jnp.dtype(dtype).name} form): set "
        "config.model.dtype='bfloat16' or use implementation='xla'.")


def attention(implementation: str, q: Array, k: Array, v: Array,
              padding_mask: Array, *, causal: bool, scale: float) -> Array:
  """Softmax attention through a fused kernel.

  Args:
    implementation: one of `IMPLEMENTATIONS`.
    q: queries `[batch, length, heads, head_dim]`, not scaled.
    k: keys, same shape.
    v: values, same shape.
    padding_mask: bool `[batch, length]`, True = real token, any pattern.
    causal: also mask key j > query i.
    scale: the logits' factor (1 / sqrt(head_dim)).

  Returns:
    `[batch, length, heads, head_dim]` in `v`'s dtype; zero at padded
    queries.
  """
  if implementation == 'cudnn':
    return cudnn_attention(q, k, v, padding_mask, causal=causal, scale=scale)
  if implementation == 'tpu_flash':
    return tpu_flash_attention(q, k, v, padding_mask, causal=causal,
                               scale=scale)
  raise ValueError(f'implementation={implementation!r}; valid: '
                   f'{IMPLEMENTATIONS}.')


def real_first(padding_mask: Array) -> tuple[Array, Array, Array]:
  """The stable partition of each row that puts its real tokens first.

  Args:
    padding_mask: bool `[batch, length]`, True = real token.

  Returns:
    `(order, place, lengths)`: int32 `[batch, length]` `order`, the original
    position of each slot of the reordered row (`reordered = x[order]`);
    int32 `[batch, length]` `place`, the slot of each original position (its
    inverse, `x = reordered[place]`); int32 `[batch]` `lengths`, the number of
    real tokens of each row. Where a row's padding is trailing, `order` and
    `place` are the identity.
  """
  real = padding_mask.astype(jnp.int32)
  lengths = real.sum(1)
  place = jnp.where(padding_mask, jnp.cumsum(real, 1) - 1,
                    lengths[:, None] + jnp.cumsum(1 - real, 1) - 1)
  positions = jnp.broadcast_to(jnp.arange(padding_mask.shape[1]),
                               padding_mask.shape)
  order = jax.vmap(lambda p, i: jnp.zeros_like(p).at[p].set(
      i, unique_indices=True))(place, positions)
  return order, place, lengths


@jax.custom_vjp
def _take_rows(x: Array, index: Array, inverse: Array) -> Array:
  """`x[b, index[b]]` for `[batch, length, ...]` `x` and a permutation
  `index` of each row whose inverse is `inverse`; the backward pass is the
  inverse gather (no scatter)."""
  return jax.vmap(lambda row, i: row[i])(x, index)


def _take_rows_fwd(x, index, inverse):
  return _take_rows(x, index, inverse), (index, inverse)


def _take_rows_bwd(residuals, g):
  index, inverse = residuals
  return _take_rows(g, inverse, index), None, None


_take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def cudnn_attention(q: Array, k: Array, v: Array, padding_mask: Array, *,
                    causal: bool, scale: float) -> Array:
  """`attention` through cuDNN (see the module docstring), shapes as there.

  A row without any real token is given a length of 1 (its first reordered
  slot) so that no row of the kernel is empty; its output is zeroed.

  Raises:
    ValueError: in a process where JAX finds no cuDNN (no NVIDIA GPU).
  """
  order, place, lengths = real_first(padding_mask)
  q, k, v = (_take_rows(t, order, place) for t in (q, k, v))
  lengths = jnp.maximum(lengths, 1)
  try:
    out = jax.nn.dot_product_attention(
        q, k, v, scale=scale, is_causal=causal, query_seq_lengths=lengths,
        key_value_seq_lengths=lengths, implementation=CUDNN_BACKEND)
  except RuntimeError as e:
    # JAX's "cuDNN is not detected." or, with the CUDA plugin installed
    # but no GPU, "cuDNN not found.".
    if 'not detected' not in str(e) and 'not found' not in str(e):
      raise
    raise ValueError(
        f"implementation='cudnn' needs cuDNN on an NVIDIA GPU; JAX has none "
        f"in this process ({e}): run on a GPU or use implementation='xla'."
    ) from e
  out = _take_rows(out, place, order)
  return jnp.where(padding_mask[:, :, None, None], out,
                   jnp.zeros((), out.dtype))


def segment_ids(padding_mask: Array, multiple: int = TPU_BLOCK) -> Array:
  """int32 `[batch, padded length]`: 1 at real tokens, 0 at padding, with
  the length padded by 0s to a multiple of `multiple`."""
  extra = (-padding_mask.shape[1]) % multiple
  return jnp.pad(padding_mask.astype(jnp.int32), [(0, 0), (0, extra)])


def tpu_flash_attention(q: Array, k: Array, v: Array, padding_mask: Array, *,
                        causal: bool, scale: float) -> Array:
  """`attention` through the Pallas TPU flash attention (see the module
  docstring), shapes as there."""
  # Imported here: Pallas adds a tenth of a second to every start otherwise.
  from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash  # pylint: disable=g-import-not-at-top
  length = q.shape[1]
  ids = segment_ids(padding_mask)
  extra = ids.shape[1] - length

  def heads_first(t):  # [batch, padded length, heads, dim] -> the kernel's.
    return jnp.pad(t, [(0, 0), (0, extra), (0, 0), (0, 0)]).transpose(
        0, 2, 1, 3)
  out = tpu_flash.flash_attention(
      heads_first(q), heads_first(k), heads_first(v),
      segment_ids=tpu_flash.SegmentIds(q=ids, kv=ids), causal=causal,
      sm_scale=scale)
  out = out.transpose(0, 2, 1, 3)[:, :length]
  return jnp.where(padding_mask[:, :, None, None], out,
                   jnp.zeros((), out.dtype))
