r"""Synthesizer: synthetic attention weights (registry `synthesizer`).

Paper: Tay et al., ICML 2021, arXiv:2005.00743. Official LRA code: google-
research/long-range-arena, `lra_benchmarks/models/synthesizer/`.

The logits are the sum of the parts of `synthesizer_mode` (a learned random
table, its factorisation, a dense map of the query token) plus the dot product
unless `ignore_dot_product`; one softmax over the keys.

docs/mechanisms/synthesizer.md: the computation, every departure from the
official code and why, padding, the causal form, the tested invariants and the
LRA settings.
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base

Array = jax.Array

PARTS = ('random', 'factorized_random', 'dense')


def parts_of(mode: str) -> tuple[str, ...]:
  """The parts of a `synthesizer_mode` such as 'dense+random'."""
  parts = tuple(p.strip() for p in mode.split('+'))
  unknown = [p for p in parts if p not in PARTS]
  if unknown or len(set(parts)) != len(parts) or (
      'random' in parts and 'factorized_random' in parts):
    raise ValueError(
        f'Unknown synthesizer_mode {mode!r}: use one or two of {PARTS} '
        "joined by '+', at most one random table (e.g. 'dense+random').")
  return parts


class SynthesizerAttention(base.Attention):
  """Synthesizer attention (see the module docstring).

  Attributes:
    synthesizer_mode: the synthetic parts, e.g. 'random' (official LRA),
      'factorized_random', 'dense' or 'dense+random'.
    ignore_dot_product: drop the q.k / sqrt(d) logits (and the query and key
      projections).
    factorized_k: rank k of `factorized_random`.
    max_length: table size L; None = the length at initialisation.
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('random', {}),
      ('dense_factorized_only', {
          'synthesizer_mode': 'dense+factorized_random', 'factorized_k': 4,
          'ignore_dot_product': True}),
  )

  synthesizer_mode: str = 'random'
  ignore_dot_product: bool = False
  factorized_k: int = 32
  max_length: Optional[int] = None

  def check_knobs(self) -> None:
    parts_of(self.synthesizer_mode)
    if not isinstance(self.factorized_k, int) or self.factorized_k < 1:
      raise ValueError(f'factorized_k={self.factorized_k!r} must be a '
                       'positive int.')
    if self.max_length is not None and (not isinstance(self.max_length, int)
                                        or self.max_length < 1):
      raise ValueError(f'max_length={self.max_length!r} must be a positive '
                       'int or None (the length at initialisation).')

  def _table(self, name: str, shape_of, length: int, axis: int) -> Array:
    """A parameter whose `axis` is the table size L (stored size if any)."""
    if self.has_variable('params', name):
      size = self.get_variable('params', name).shape[axis]
    else:
      size = self.max_length or length
    if length > size:
      raise ValueError(
          f'Synthesizer table {name!r} has {size} positions but the input '
          f'has {length}; set max_length >= {length} (model.attention_kw).')
    return self.param(name, self.kernel_init, shape_of(size))

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies Synthesizer attention; see `base.Attention.attend`."""
    real = padding_mask
    _, head_dim, out_features = self.head_dims(x)
    n = x.shape[1]
    heads = self.num_heads
    x = x.astype(self.dtype)
    v, = self.project_qkv(x, ('value',))
    logits = jnp.zeros((x.shape[0], heads, n, n), jnp.float32)
    if not self.ignore_dot_product:
      q, k = self.project_qkv(x, ('query', 'key'), scale_query=True)
      logits = logits + jnp.einsum('bqhd,bkhd->bhqk', q, k,
                                   preferred_element_type=jnp.float32)
    parts = parts_of(self.synthesizer_mode)
    if 'random' in parts:
      table = self._table('random', lambda s: (heads, s, s), n, 1)
      logits = logits + table[None, :, :n, :n]
    if 'factorized_random' in parts:
      r = self.factorized_k
      left = self._table('random1', lambda s: (heads, s, r), n, 1)
      right = self._table('random2', lambda s: (heads, r, s), n, 2)
      logits = logits + jnp.einsum('hik,hkj->hij', left[:, :n],
                                   right[:, :, :n])[None]
    if 'dense' in parts:
      hidden = nn.relu(self.projection(head_dim, 'dense_syn')(x))
      kernel = self._table('dense_syn_length', lambda s: (head_dim, s), n, 1)
      # Logits in float32 (also with bfloat16 activations).
      dense = jnp.einsum('bnhd,dl->bhnl', hidden.astype(jnp.float32),
                         kernel[:, :n])
      if self.use_bias:
        size = kernel.shape[1]
        bias = self.param('dense_syn_length_bias', self.bias_init, (size,))
        dense = dense + bias[:n]
      logits = logits + dense
    valid = real[:, None, None, :]
    if self.causal:
      valid = valid & base.causal_mask(n)[None, None]
    probs = base.safe_softmax(logits, valid)
    probs = self.attention_dropout(probs, deterministic).astype(self.dtype)
    y = jnp.einsum('bhqk,bkhd->bqhd', probs, v)
    y = y.astype(self.dtype)
    return self.output_projection(out_features)(y)
