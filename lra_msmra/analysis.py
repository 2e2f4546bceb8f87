"""What a trained model attends to: influence maps of one attention sub-layer.

Efficient mechanisms have no single attention matrix to plot (CST mixes local
and slice-level attention, Transformer-LS adds landmarks to a window, AdaMRA
routes queries to compressed keys, Combiner factorises through summaries). A
quantity every mechanism has is the Jacobian of its output with respect to its
input. For one example, the influence of input position j on output position
i of the attention sub-layer of a chosen layer is

  influence[i, j] = || d y_i / d x_j ||_F,

the Frobenius norm of the `[out_features, features]` block of the Jacobian,
where x is the sub-layer's input (the LayerNorm output inside the block) and
y its output. It is zero exactly where output i cannot see input j, so the
map shows each mechanism's real support: the window and landmarks of
Transformer-LS, the slices and their extensions of CST, causal triangles.

Per head (`per_head=True`), y_i is replaced by head h's output at i, the
`[heads, head_dim]` input of the layer's output projection. This needs a
layer whose output *is* its output projection applied once to per-head
outputs (softmax, Transformer-LS, AdaMRA, where the heads are the subheads
of the routed resolution head, and Combiner); CST applies its output
projection to the local attention and again inside the slice-level attention,
so its heads are mixed before the output and only the per-layer map exists.
A layer that does not fit is detected and refused with an error.

Choices:

* The sub-layer's input is captured by running the whole model once
  (`nn.intercept_methods`), with dropout off; model-level shared inputs of a
  mechanism (e.g. CST's position tables) are held fixed.
* The map is a first-order sensitivity at this input: a discrete choice (the
  argmax of AdaMRA's router) contributes no derivative, so the map shows the
  support given the choices made for this example.
* Derivatives are taken in float32 even for models trained in bfloat16 (the
  parameters are float32 anyway).
* Cost: one backward pass per output feature of each requested query row
  (`len(query_positions) x out_features` of them), batched; ask for a subset
  of rows at long lengths.
* The softmax baseline follows LRA: a padded query attends uniformly to all
  keys, so padded rows of its map are not zero; real rows never depend on
  padded inputs for any mechanism.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra.attention import base

Array = jax.Array


@dataclasses.dataclass
class AttentionCall:
  """One call of an attention sub-layer inside a model.

  Attributes:
    path: module path, e.g. `('encoder', 'block_0', 'attention')`.
    module: an unbound copy of the layer (same fields).
    params: the layer's parameters.
    inputs: its input `[batch, length, features]`.
    padding_mask: bool `[batch, length]`, True = real token.
    shared: the model-level input of the mechanism (`shared=`), or None.
  """
  path: tuple[str, ...]
  module: base.Attention
  params: Any
  inputs: Array
  padding_mask: Array
  shared: Any

  def apply(self, x: Array, padding_mask: Array, module: Optional[
      base.Attention] = None) -> Array:
    """Runs the layer (dropout off) on `x` `[batch, length, features]`."""
    kw = {} if self.shared is None else {'shared': self.shared}
    return (module or self.module).apply(
        {'params': self.params}, x, padding_mask=padding_mask,
        deterministic=True, **kw)


@dataclasses.dataclass
class Influence:
  """An influence map of one attention sub-layer on one example.

  Attributes:
    values: `[rows, length]`, or `[heads, rows, length]` per head:
      `values[..., r, j]` is how strongly output position
      `query_positions[r]` depends on input position j.
    query_positions: `[rows]` positions of the rows.
    padding_mask: bool `[length]`, True = real token.
    num_prefix: positions in front of the first input token (1 for a CLS
      token, else 0): input token t sits at position t + num_prefix.
    per_head: whether `values` has a heads axis.
  """
  values: np.ndarray
  query_positions: np.ndarray
  padding_mask: np.ndarray
  num_prefix: int
  per_head: bool


def capture_attention_calls(model: nn.Module, params: Any,
                            batch: Mapping[str, Any]) -> list[AttentionCall]:
  """Runs `model` once on `batch` and records every attention sub-layer call.

  Args:
    model: a model of `lra_msmra.models.create_model` (or any Linen module
      whose attention layers subclass `lra_msmra.attention.base.Attention`).
    params: its parameters.
    batch: `{'inputs': ids [batch, length]}` (plus `'inputs2'` for
      Retrieval), as for `model.apply`.

  Returns:
    The calls in execution order: one per layer, and per document for the
    Retrieval dual encoder (layer 0 of `inputs`, layer 1 of `inputs`, ...,
    then the same for `inputs2`).
  """
  found = []  # (path, unbound module), filled while tracing.

  def interceptor(next_fun, args, kwargs, context):
    if (isinstance(context.module, base.Attention) and
        context.method_name == '__call__'):
      module = context.module
      found.append((tuple(module.path), module.clone(parent=None, name=None),
                    args[0], base.default_padding_mask(
                        args[0], kwargs.get('padding_mask')),
                    kwargs.get('shared')))
    return next_fun(*args, **kwargs)

  def run(params, batch):
    with nn.intercept_methods(interceptor):
      model.apply({'params': params}, batch, deterministic=True)
    return [f[2:] for f in found]

  # Under jit: one compiled forward pass instead of op-by-op dispatch.
  arrays = jax.jit(run)(params, batch)
  all_params = flax.core.unfreeze(params)
  calls = []
  for (path, module, *_), (inputs, padding_mask, shared) in zip(found,
                                                                 arrays):
    layer_params = all_params
    for name in path:
      layer_params = layer_params[name]
    calls.append(AttentionCall(path=path, module=module, params=layer_params,
                               inputs=inputs, padding_mask=padding_mask,
                               shared=shared))
  return calls


def find_call(calls: Sequence[AttentionCall], layer: int,
              document: int = 0) -> AttentionCall:
  """Picks the call of encoder layer `layer` (of document 0 or 1)."""
  by_layer = [c for c in calls if f'block_{layer}' in c.path]
  if not by_layer:
    layers = sorted({p for c in calls for p in c.path
                     if p.startswith('block_')})
    raise ValueError(f'No attention call of layer {layer}; the model has '
                     f'{layers}.')
  if document >= len(by_layer):
    raise ValueError(f'document={document}, but layer {layer} runs '
                     f'{len(by_layer)} time(s) per forward pass (2 for the '
                     'Retrieval dual encoder).')
  return by_layer[document]


def _out_projection_interceptor(captured: list):
  """Records the inputs and outputs of the layer's own `out` projection."""

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if (context.method_name == '__call__' and
        tuple(context.module.path) == ('out',)):
      captured.append((args[0], out))
    return out
  return interceptor


def _check_per_head(call: AttentionCall, module: base.Attention, x: Array,
                    mask: Array) -> None:
  """Raises ValueError unless output = `out` projection applied once."""

  def run(x, mask):
    captured = []
    with nn.intercept_methods(_out_projection_interceptor(captured)):
      y = call.apply(x, mask, module)
    return y, captured

  y, captured = jax.jit(run)(x, mask)
  name = type(module).__name__
  if len(captured) != 1:
    raise ValueError(
        f'{name} applies its output projection `out` {len(captured)} times '
        'per call (CST: to the local attention and inside the slice-level '
        'attention), so its heads are mixed before the output and there is '
        'no per-head map; use per_head=False for the per-layer map.')
  heads_in, projected = captured[0]
  # Mechanisms that pad internally project the padded length; crop it.
  projected = projected[:, :y.shape[1]]
  real = np.asarray(mask)
  if heads_in.ndim != 4 or projected.shape != y.shape or not np.allclose(
      np.asarray(projected)[real], np.asarray(y)[real], rtol=1e-5,
      atol=1e-6):
    raise ValueError(
        f'The output of {name} is not its output projection `out` of '
        '[batch, length, heads, head_dim] head outputs (something is added '
        'after it), so there is no per-head map; use per_head=False.')


@functools.partial(jax.jit, static_argnames=('fn', 'batch_size'))
def _jacobian_row_norms(fn, x: Array, rows: Array, batch_size: int) -> Array:
  """sqrt(sum_f sum_e (d fn(x)[i, g, f] / d x[j, e])^2) -> [rows, G, L]."""
  y, vjp_fn = jax.vjp(fn, x)
  _, groups, features = y.shape

  def squared_grads(index):
    i, g, f = index
    cotangent = jnp.zeros(y.shape, y.dtype).at[i, g, f].set(1)
    (grad,) = vjp_fn(cotangent)
    return jnp.sum(jnp.square(grad.astype(jnp.float32)), axis=-1)  # [L]

  def row(index):
    i, g = index
    f = jnp.arange(features)
    per_feature = jax.lax.map(
        squared_grads, (jnp.full_like(f, i), jnp.full_like(f, g), f),
        batch_size=batch_size)
    return jnp.sqrt(jnp.sum(per_feature, axis=0))

  i = jnp.repeat(rows, groups)
  g = jnp.tile(jnp.arange(groups), rows.shape[0])
  out = jax.lax.map(row, (i, g))  # [rows * G, L]
  return out.reshape(rows.shape[0], groups, -1)


def influence_map(call: AttentionCall, *, example: int = 0,
                  per_head: bool = False,
                  query_positions: Optional[Sequence[int]] = None,
                  batch_size: int = 64) -> np.ndarray:
  """Influence of each input position on each output position of a layer.

  Args:
    call: a captured attention call (`capture_attention_calls`).
    example: which example of the batch.
    per_head: one map per head (see the module docstring for which
      mechanisms have one) instead of one for the layer.
    query_positions: output positions to compute (default: all).
    batch_size: backward passes run together (memory vs speed).

  Returns:
    float32 `[rows, length]`, or `[heads, rows, length]` with `per_head`.

  Raises:
    ValueError: `per_head` for a layer whose heads are mixed before its
      output.
  """
  module = call.module.clone(dtype=jnp.float32)
  x = jnp.asarray(call.inputs[example:example + 1], jnp.float32)
  mask = call.padding_mask[example:example + 1]
  length = x.shape[1]
  rows = np.arange(length) if query_positions is None else np.asarray(
      query_positions)
  if rows.ndim != 1 or rows.size == 0 or rows.min() < 0 or (
      rows.max() >= length):
    raise ValueError(f'query_positions must be positions in 0..{length - 1}.')

  if per_head:
    _check_per_head(call, module, x, mask)

    def fn(x1):
      captured = []
      with nn.intercept_methods(_out_projection_interceptor(captured)):
        call.apply(x1[None], mask, module)
      return captured[0][0][0, :length]  # [L, heads, head_dim]
  else:
    def fn(x1):
      return call.apply(x1[None], mask, module)[0][:, None]  # [L, 1, D]

  norms = _jacobian_row_norms(fn, x[0], jnp.asarray(rows), batch_size)
  norms = np.asarray(norms)
  return np.transpose(norms, (1, 0, 2)) if per_head else norms[:, 0]


def attention_influence(model: nn.Module, params: Any,
                        batch: Mapping[str, Any], *, layer: int,
                        example: int = 0, document: int = 0,
                        per_head: bool = False,
                        query_positions: Optional[Sequence[int]] = None,
                        batch_size: int = 64) -> Influence:
  """The influence map of layer `layer`'s attention on one example.

  Args:
    model: a model of `lra_msmra.models.create_model`, e.g. from
      `lra_msmra.load_checkpoint`.
    params: its parameters.
    batch: model inputs, `{'inputs': ids [batch, length]}` (plus `'inputs2'`
      for Retrieval).
    layer: encoder layer, 0-based.
    example: which example of the batch.
    document: Retrieval only: 0 for `inputs`, 1 for `inputs2`.
    per_head: one map per head (not for CST, see the module docstring).
    query_positions: output positions to compute (default: all).
    batch_size: backward passes run together.

  Returns:
    The map with its positions (see `Influence`).
  """
  call = find_call(capture_attention_calls(model, params, batch), layer,
                   document)
  key = 'inputs2' if document else 'inputs'
  length = call.inputs.shape[1]
  values = influence_map(call, example=example, per_head=per_head,
                         query_positions=query_positions,
                         batch_size=batch_size)
  rows = (np.arange(length) if query_positions is None
          else np.asarray(query_positions))
  return Influence(
      values=values, query_positions=rows,
      padding_mask=np.asarray(call.padding_mask[example]),
      num_prefix=length - np.shape(batch[key])[1], per_head=per_head)
