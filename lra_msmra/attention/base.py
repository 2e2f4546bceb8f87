"""Shared pieces of every attention mechanism: the contract and numerics helpers.

Every mechanism is a Linen module that subclasses `Attention`, so they all take
the same leading fields and are called the same way::

  layer = REGISTRY[name](num_heads=4, qkv_features=64, dropout_rate=0.1,
                         causal=False, dtype=jnp.float32, **mechanism_knobs)
  y = layer.apply(variables, x, padding_mask=mask, deterministic=True,
                  rngs={'dropout': key})

`x` is `[batch, length, features]`, `padding_mask` is `[batch, length]` bool
with True = real token, and `y` is `[batch, length, out_features]`.

A mechanism implements `attend` (same arguments; the mask has been checked
and is never None). `Attention.__call__` calls it and then applies the
padded-row rule, the same for every mechanism: the output at a padded query
position is exactly zero, output biases included. Real outputs never read
padded positions (their keys are masked), so the rule only fixes what the
layer returns there. The one exception is the softmax baseline
(`zero_padded_queries = False`): it keeps the LRA reference's values at
padded rows, because LRA's unmasked MEAN pooling and its CLS query on a
black pixel read them (docs/mechanisms/softmax.md §3.2, pitfalls P8, P9).

A mechanism's settings reach a model by one route, `Mechanism`
(`lra_msmra.attention`): the registry name, the knobs and the contract fields
its layers share, which makes the layers and, for a mechanism that needs
parameters owned by the whole model (shared by every layer, e.g. CST's
multi-scale position tables), that module. Such a mechanism overrides
`shared_module`, which reads the layer's fields (checked when the layer was
built); the model creates the module once, calls it once per forward pass,
and hands its output to every attention layer as the keyword argument
`shared`.

Most mechanisms start `attend` with `project_qkv`: the input in the layer's
dtype, projected to per-head queries, keys and values.

How a layer is computed is its `implementation` (`lra_msmra.kernels`): the
default `'xla'` is the mechanism's own code here, the numerical reference.
A mechanism with others switches in one place, its class table `KERNELS`:
for each implementation, the functions of its hot paths by name (the same
names for every implementation). `attend` calls `self.kernel(name)`;
`IMPLEMENTATIONS`, and the error for any other value, come from the table.
"""

from __future__ import annotations

import functools
from typing import (Any, Callable, ClassVar, Mapping, NamedTuple, Optional,
                    Sequence)

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.kernels.safe_softmax import safe_softmax  # pylint: disable=unused-import
from lra_msmra.kernels.safe_softmax import safe_softmax_parts  # pylint: disable=unused-import
from lra_msmra.kernels.safe_softmax import softmax_terms as _softmax_terms

Array = jax.Array
Dtype = Any

# Logit bias of a masked entry in the LRA reference attention
# (docs/protocol.md §3.1).
LRA_MASK_BIAS = -1e10


class HeadDims(NamedTuple):
  """The widths of a layer for an input width (`Attention.head_dims`)."""
  qkv_features: int
  head_dim: int
  out_features: int


class Attention(nn.Module):
  """Base class of all mechanisms: the shared fields of the contract.

  Attributes:
    num_heads: number of attention heads.
    qkv_features: total width of queries/keys/values (heads x head_dim);
      defaults to the input width.
    out_features: output width; defaults to the input width.
    dropout_rate: dropout on attention probabilities (where the mechanism has
      them).
    causal: if True, output i may depend on inputs j <= i only. A mechanism
      that has no causal form raises `NotImplementedError`.
    dtype: computation dtype of activations; parameters stay float32 and
      softmax/normalisers are computed in float32.
    use_bias: biases on the Q/K/V/output projections (False in LRA, True in
      the PyTorch protocol of Xiong et al.).
    kernel_init: initialiser of projection kernels (Xavier-uniform in LRA).
    bias_init: initialiser of projection biases.
    implementation: how the layer is computed (`lra_msmra.kernels`): one of
      the class's `IMPLEMENTATIONS`; `'xla'` (the default, every mechanism's)
      is the mechanism's own code and the numerical reference.
    zero_padded_queries: (class constant, not a field) the padded-row rule:
      True zeroes the output at padded query positions after `attend`.
    KERNELS: (class constant, not a field) the kernel switch:
      implementation name -> {hot path name -> function(layer, ...)}; the
      functions of one path take the same arguments and compute the same
      function under every implementation.
    IMPLEMENTATIONS: (class constant, not a field) the values `implementation`
      may take for this mechanism: the names of `KERNELS`.
    EXAMPLES: (class constant, not a field) `(id, knobs)` pairs that reach
      each of the mechanism's code paths at a few tokens; the tests take
      their cases from here, through the registry.
  """
  num_heads: int = 8
  qkv_features: Optional[int] = None
  out_features: Optional[int] = None
  dropout_rate: float = 0.0
  causal: bool = False
  dtype: Dtype = jnp.float32
  use_bias: bool = False
  kernel_init: Callable[..., Array] = nn.initializers.xavier_uniform()
  bias_init: Callable[..., Array] = nn.initializers.zeros
  implementation: str = 'xla'

  zero_padded_queries: ClassVar[bool] = True
  KERNELS: ClassVar[Mapping[str, Mapping[str, Callable[..., Any]]]] = {
      'xla': {}}
  # (id, knobs) settings that reach each of the mechanism's code paths at a
  # few tokens: the contract tests run every one, bidirectional and causal.
  EXAMPLES: ClassVar[tuple[tuple[str, Mapping[str, Any]], ...]] = (
      ('default', {}),)
  IMPLEMENTATIONS: ClassVar[tuple[str, ...]] = ('xla',)

  def __init_subclass__(cls, **kwargs: Any):
    super().__init_subclass__(**kwargs)
    paths = set(cls.KERNELS['xla'])
    for name, table in cls.KERNELS.items():
      if set(table) != paths:
        raise TypeError(f'{cls.__name__}.KERNELS[{name!r}] has the paths '
                        f"{sorted(table)}, 'xla' has {sorted(paths)}.")
    cls.IMPLEMENTATIONS = tuple(cls.KERNELS)

  def kernel(self, path: str) -> Callable[..., Any]:
    """The function of hot path `path` under this layer's implementation
    (`KERNELS`), called with the layer as its first argument."""
    return functools.partial(self.KERNELS[self.implementation][path], self)

  def __post_init__(self):
    if self.implementation not in self.IMPLEMENTATIONS:
      raise ValueError(
          f'{type(self).__name__} has no implementation='
          f'{self.implementation!r}; valid: {self.IMPLEMENTATIONS}.')
    self.check_knobs()
    super().__post_init__()

  def check_knobs(self) -> None:
    """Checks the mechanism's own fields (its knobs) when it is constructed.

    Every mechanism overrides this one hook, so a bad knob fails when the
    module is built (config validation builds it before anything runs), not
    at its first call. It raises ValueError for a bad value and
    NotImplementedError for a combination the mechanism has no form for
    (e.g. `causal=True` without a causal form). Checks that need the input
    length stay in the call; validation traces the model to reach them.
    """


  def __call__(self, x: Array, *, padding_mask: Optional[Array] = None,
               deterministic: bool = True, **kwargs: Any) -> Array:
    """Applies the mechanism (`attend`), then the padded-row rule.

    Args:
      x: `[batch, length, features]`.
      padding_mask: bool `[batch, length]`, True = real token; None = all
        real.
      deterministic: disables dropout.
      **kwargs: passed to `attend` (e.g. `shared`, see `shared_module`).

    Returns:
      `[batch, length, out_features]`; zero at padded positions if
      `zero_padded_queries`.
    """
    padding_mask = default_padding_mask(x, padding_mask)
    y = self.attend(x, padding_mask=padding_mask,
                    deterministic=deterministic, **kwargs)
    if self.zero_padded_queries:
      y = jnp.where(padding_mask[..., None], y, jnp.zeros((), y.dtype))
    return y

  def attend(self, x: Array, *, padding_mask: Array, deterministic: bool,
             **kwargs: Any) -> Array:
    """The mechanism itself; subclasses implement it (usually `nn.compact`).

    Args:
      x: `[batch, length, features]`.
      padding_mask: bool `[batch, length]`, True = real token.
      deterministic: disables dropout.
      **kwargs: mechanism-specific inputs (e.g. `shared`).

    Returns:
      `[batch, length, out_features]`; what it holds at padded query
      positions does not matter when `zero_padded_queries` is True.
    """
    raise NotImplementedError(
        f'{type(self).__name__} must implement attend(x, *, padding_mask, '
        'deterministic).')

  @nn.nowrap
  def shared_module(self, *, features: int, max_len: int,
                    name: str) -> Optional[nn.Module]:
    """Returns a module of model-level parameters shared by all layers, or None.

    `Mechanism.shared_module` (through `shared_inputs`) calls this on an
    unbound layer built with the same fields as the model's layers (so its
    knobs are checked, and `causal` says which form they take) inside the
    model's own compact method, where the returned module is created
    (`nn.nowrap`: this layer does not become its parent). The model calls
    the module once per forward pass and passes the result to every layer
    as `shared=...`.

    Args:
      features: model width.
      max_len: longest sequence the model sees (CLS included).
      name: the name to give the module (its parameter scope).
    """
    del features, max_len, name
    return None

  # -- helpers for subclasses ------------------------------------------------

  def head_dims(self, x: Array) -> HeadDims:
    """Returns (qkv_features, head_dim, out_features) for input `x`."""
    features = x.shape[-1]
    qkv = self.qkv_features or features
    if qkv % self.num_heads:
      raise ValueError(
          f'qkv_features={qkv} is not divisible by num_heads={self.num_heads}; '
          'choose qkv_dim as a multiple of num_heads.')
    return HeadDims(qkv, qkv // self.num_heads, self.out_features or features)

  def project_qkv(self, x: Array,
                  roles: Sequence[str] = ('query', 'key', 'value'), *,
                  scale_query: bool = False) -> tuple[Array, ...]:
    """The start of most `attend`s: `x` projected once per role.

    Args:
      x: `[batch, length, features]`; cast to the layer's dtype first.
      roles: the projections' names (their parameter scopes), in order.
      scale_query: divide the first projection (the query) by
        sqrt(head_dim).

    Returns:
      One `[batch, length, heads, head_dim]` array per role (`projection`).
    """
    head_dim = self.head_dims(x).head_dim
    x = x.astype(self.dtype)
    projected = [self.projection(head_dim, role)(x) for role in roles]
    if scale_query:
      projected[0] = projected[0] / jnp.sqrt(head_dim).astype(self.dtype)
    return tuple(projected)

  def projection(self, head_dim: int, name: str) -> nn.Module:
    """A `[..., features] -> [..., heads, head_dim]` projection."""
    return nn.DenseGeneral(
        features=(self.num_heads, head_dim), axis=-1, use_bias=self.use_bias,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        dtype=self.dtype, param_dtype=jnp.float32, name=name)

  def output_projection(self, out_features: int, name: str = 'out') -> nn.Module:
    """A `[..., heads, head_dim] -> [..., out_features]` projection."""
    return nn.DenseGeneral(
        features=out_features, axis=(-2, -1), use_bias=self.use_bias,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        dtype=self.dtype, param_dtype=jnp.float32, name=name)

  def attention_dropout(self, probs: Array, deterministic: bool) -> Array:
    """Dropout on attention probabilities, element-wise (not broadcast)."""
    if deterministic or self.dropout_rate == 0.0:
      return probs
    keep = 1.0 - self.dropout_rate
    mask = jax.random.bernoulli(self.make_rng('dropout'), keep, probs.shape)
    return jnp.where(mask, probs / keep, 0.0).astype(probs.dtype)


def default_padding_mask(x: Array, padding_mask: Optional[Array]) -> Array:
  """Returns `padding_mask` as bool `[batch, length]`, all True if None."""
  if padding_mask is None:
    return jnp.ones(x.shape[:2], dtype=bool)
  if padding_mask.shape != x.shape[:2]:
    raise ValueError(
        f'padding_mask has shape {padding_mask.shape}, expected '
        f'{x.shape[:2]} ([batch, length], True = real token).')
  return padding_mask.astype(bool)


def causal_mask(q_len: int, k_len: Optional[int] = None) -> Array:
  """Bool `[q_len, k_len]`, True where key j <= query i."""
  k_len = q_len if k_len is None else k_len
  return jnp.arange(k_len)[None, :] <= jnp.arange(q_len)[:, None]


def pad_to_length(x: Array, padding_mask: Array, length: int
                  ) -> tuple[Array, Array]:
  """Right-pads `[batch, n, ...]` and its mask to `length` >= n positions.

  The added positions are marked as padding. Returns the padded array and
  the padded mask.
  """
  extra = length - x.shape[1]
  if extra < 0:
    raise ValueError(f'Cannot pad {x.shape[1]} positions to {length}.')
  if extra == 0:
    return x, padding_mask
  pad = [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)
  return jnp.pad(x, pad), jnp.pad(padding_mask, [(0, 0), (0, extra)])


def pad_to_multiple(x: Array, padding_mask: Array, multiple: int
                    ) -> tuple[Array, Array, int]:
  """Right-pads `[batch, length, ...]` to a multiple of `multiple`.

  The added positions are marked as padding. Returns the padded array, the
  padded mask and the original length (to crop the output back).
  """
  length = x.shape[1]
  x, padding_mask = pad_to_length(x, padding_mask,
                                  length + (-length) % multiple)
  return x, padding_mask, length


# Queries per block of `blocked_attention`: a block's float32 scores against
# 2,048 keys (4 x 4 heads x batch) stay around 16 MB, small enough to be
# reused from one block to the next instead of allocated afresh.
ATTENTION_QUERY_BLOCK = 128


def blocked_attention(q: Array, k: Array, v: Array, key_valid: Array, *,
                      causal: bool = False,
                      block: int = ATTENTION_QUERY_BLOCK) -> Array:
  """Softmax attention computed one block of queries at a time.

  The same function as `einsum(safe_softmax(q . k, valid), v)` with
  `valid = key_valid` (and key j <= query i if `causal`), but the scores
  exist only for `block` queries at a time, in the forward and in the
  backward pass: the backward pass recomputes each block's weights from the
  saved per-row log-sum-exp (the memory layout of FlashAttention, Dao et
  al. 2022). Rows without a valid key give zeros, as in `safe_softmax`.
  There is no attention dropout here; a caller that drops attention weights
  uses the unblocked form.

  Args:
    q: queries `[batch, q_len, heads, head_dim]`, already scaled.
    k: keys `[batch, k_len, heads, head_dim]`.
    v: values `[batch, k_len, heads, v_dim]`.
    key_valid: bool `[batch, k_len]`, True = the key may be attended.
    causal: also mask key j > query i (needs q_len == k_len).
    block: queries per block; q_len need not be a multiple.

  Returns:
    `[batch, q_len, heads, v_dim]` in `v`'s dtype; scores, weights and
    normalisers are float32.
  """
  if causal and q.shape[1] != k.shape[1]:
    raise ValueError(
        f'causal blocked_attention needs as many queries as keys, got '
        f'{q.shape[1]} and {k.shape[1]}.')
  if block < 1:
    raise ValueError(f'block must be >= 1, got {block}.')
  length = q.shape[1]
  block = min(block, length)
  extra = (-length) % block
  if extra:
    q = jnp.pad(q, [(0, 0), (0, extra), (0, 0), (0, 0)])
  return _blocked_core(q, k, v, key_valid, causal, block)[:, :length]


def _split_blocks(x: Array, block: int) -> Array:
  """`[batch, n * block, ...] -> [n, batch, block, ...]`."""
  return jnp.swapaxes(
      x.reshape(x.shape[0], x.shape[1] // block, block, *x.shape[2:]), 0, 1)


def _merge_blocks(x: Array) -> Array:
  """Inverse of `_split_blocks`."""
  x = jnp.swapaxes(x, 0, 1)
  return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _block_scores(q: Array, k: Array, key_valid: Array, causal: bool,
                  start: Array) -> tuple[Array, Array]:
  """One block's float32 scores `[batch, heads, block, keys]` and mask."""
  scores = jnp.einsum('bqhd,bkhd->bhqk', q, k,
                      preferred_element_type=jnp.float32)
  valid = key_valid[:, None, None, :]
  if causal:
    rows = start + jnp.arange(q.shape[1])
    valid = valid & (jnp.arange(k.shape[1])[None, :] <= rows[:, None])
  return scores, valid


def _blocked_forward(q, k, v, key_valid, causal, block):
  """Returns (output, per-row log-sum-exp `[n, batch, heads, block, 1]`)."""

  def one(args):
    q_block, start = args
    scores, valid = _block_scores(q_block, k, key_valid, causal, start)
    (unnorm,), row_max, total = _softmax_terms([scores], [valid], -1)
    out = jnp.einsum('bhqk,bkhd->bqhd', (unnorm / total).astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return out.astype(v.dtype), row_max + jnp.log(total)

  starts = jnp.arange(q.shape[1] // block) * block
  out, lse = jax.lax.map(one, (_split_blocks(q, block), starts))
  return _merge_blocks(out), lse


def _blocked_backward(causal, block, residuals, g):
  q, k, v, key_valid, out, lse = residuals
  # d(out . g)/d(scores) = p * (g . v_k - sum_k p g . v_k); the subtracted
  # term is g . out per row.
  row_dot = jnp.einsum('bqhd,bqhd->bhq', g.astype(jnp.float32),
                       out.astype(jnp.float32))[..., None]
  row_dot = row_dot.reshape(*row_dot.shape[:2], -1, block, 1).transpose(
      2, 0, 1, 3, 4)  # [n, batch, heads, block, 1], as the saved lse.

  def step(carry, args):
    dk, dv = carry
    q_block, g_block, lse_block, dot_block, start = args
    scores, valid = _block_scores(q_block, k, key_valid, causal, start)
    p = jnp.where(valid, jnp.exp(scores - lse_block), 0.0)
    dv = dv + jnp.einsum('bhqk,bqhd->bkhd', p, g_block,
                         preferred_element_type=jnp.float32)
    dp = jnp.einsum('bqhd,bkhd->bhqk', g_block, v,
                    preferred_element_type=jnp.float32)
    ds = p * (dp - dot_block)
    dq = jnp.einsum('bhqk,bkhd->bqhd', ds, k,
                    preferred_element_type=jnp.float32)
    dk = dk + jnp.einsum('bhqk,bqhd->bkhd', ds, q_block,
                         preferred_element_type=jnp.float32)
    return (dk, dv), dq.astype(q.dtype)

  starts = jnp.arange(q.shape[1] // block) * block
  init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
  (dk, dv), dq = jax.lax.scan(
      step, init, (_split_blocks(q, block), _split_blocks(g, block), lse,
                   row_dot, starts))
  return (_merge_blocks(dq), dk.astype(k.dtype), dv.astype(v.dtype), None)


def _core_primal(q, k, v, key_valid, causal, block):
  return _blocked_forward(q, k, v, key_valid, causal, block)[0]


def _core_forward(q, k, v, key_valid, causal, block):
  out, lse = _blocked_forward(q, k, v, key_valid, causal, block)
  return out, (q, k, v, key_valid, out, lse)


_blocked_core = jax.custom_vjp(_core_primal, nondiff_argnums=(4, 5))
_blocked_core.defvjp(_core_forward, _blocked_backward)
