"""Dense float64 references and shared checks for the sparse-pattern tests.

A sparse-pattern mechanism (`local`, `sparse`, `longformer`, `bigbird`) is
softmax attention in which query i may only see the keys j with
`allowed[i, j]`. `dense_attention` computes that in plain numpy float64 with
an explicit N x N (or heads x N x N) pattern, so each test only has to write
down its mechanism's pattern from the paper's and the official code's rules.
The checks below (finite differences, padding invariance, the data-parallel
mesh) are shared by those tests and by `linformer`'s; `params` (parameters
without compiling the initialiser) and `jitted` (one compiled apply per
layer configuration) by every LRA-model test, to keep their time down.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from lra_msmra import sharding


def masks(length: int, holes=None) -> np.ndarray:
  """Row 0 all real; row 1 with padded `holes` (default: first, middle two,
  last); row 2 one real token, in the middle."""
  if holes is None:
    holes = (0, length // 2, length // 2 + 1, length - 1)
  m = np.ones((3, length), bool)
  m[1, list(holes)] = False
  m[2] = False
  m[2, length // 2] = True
  return m


def inputs(length: int, features: int, seed: int = 0, holes=None):
  x = np.random.RandomState(seed).standard_normal(
      (3, length, features)).astype(np.float32)
  return x, masks(length, holes)


def params(layer, x, mask, seed: int = 0):
  """Parameters of the layer's shapes without compiling its initialiser.

  `layer.init` under `jit` compiles the whole forward pass, the largest part
  of these tests' time; `eval_shape` only traces it. Kernels are drawn
  N(0, 1 / fan_in) (fan_in: the input axis, all but the last axis for the
  output projection), biases are zero, every other parameter (tables,
  low-rank and sorting kernels) as a kernel over its first axis.
  """
  shapes = jax.eval_shape(layer.init, jax.random.PRNGKey(seed),
                          jnp.asarray(x), padding_mask=jnp.asarray(mask))
  rng = np.random.RandomState(seed)

  def draw(path, leaf):
    names = [str(getattr(k, 'key', k)) for k in path]
    if names[-1] == 'bias':
      return jnp.zeros(leaf.shape, leaf.dtype)
    fan_in = (math.prod(leaf.shape[:-1]) if names[-2:-1] == ['out']
              else leaf.shape[0])
    value = rng.standard_normal(leaf.shape) / math.sqrt(max(fan_in, 1))
    return jnp.asarray(value, leaf.dtype)
  return jax.tree_util.tree_map_with_path(draw, shapes['params'])


def init(layer, x, mask, seed: int = 0):
  """`params`, with random biases (if any) so that they matter."""
  rng = np.random.RandomState(seed + 100)

  def perturb(path, p):
    name = str(getattr(path[-1], 'key', path[-1]))
    if name == 'bias':
      return 0.3 * rng.standard_normal(p.shape).astype(np.float32)
    return p
  return {'params': jax.tree_util.tree_map_with_path(
      perturb, params(layer, x, mask, seed))}


_JITTED = {}


def jitted(layer, **kw):
  """`layer.apply(v, x, padding_mask=m, **kw)` under `jit`, one compiled
  function per layer configuration and shapes for the whole test session
  (a fresh `jax.jit(lambda ...)` per call would compile again)."""
  key = (repr(layer), repr(sorted(kw.items())))
  if key not in _JITTED:
    _JITTED[key] = jax.jit(
        lambda v, a, m: layer.apply(v, a, padding_mask=m, **kw))
  return _JITTED[key]


def call(layer, variables, x, mask, **kw):
  """The jitted apply's output as it is (traceable, e.g. under `jax.grad`;
  a tuple with `mutable=`)."""
  return jitted(layer, **kw)(variables, jnp.asarray(x), jnp.asarray(mask))


def apply(layer, variables, x, mask, **kw):
  return np.asarray(call(layer, variables, x, mask, **kw))


def dense(p, name, x):
  """A DenseGeneral of the parameters `p[name]` in float64."""
  kernel = np.asarray(p[name]['kernel'], np.float64)
  out = np.tensordot(x, kernel, axes=([-1], [0]))
  if 'bias' in p[name]:
    out = out + np.asarray(p[name]['bias'], np.float64)
  return out


def masked_softmax(logits, valid, axis=-1):
  """Softmax over valid entries; rows without one give zeros."""
  logits = np.where(valid, logits, -np.inf)
  top = np.max(logits, axis=axis, keepdims=True)
  top = np.where(np.isfinite(top), top, 0.0)
  e = np.where(valid, np.exp(logits - top), 0.0)
  total = e.sum(axis=axis, keepdims=True)
  return e / np.where(total > 0, total, 1.0)


def output(p, heads_out, mask):
  """Output projection of `[batch, N, heads, d]`, zero at padded rows."""
  y = np.tensordot(heads_out, np.asarray(p['out']['kernel'], np.float64),
                   axes=([-2, -1], [0, 1]))
  if 'bias' in p['out']:
    y = y + np.asarray(p['out']['bias'], np.float64)
  return y * mask[..., None]


def qkv(p, x, names=('query', 'key', 'value')):
  """Scaled queries, keys and values `[batch, N, heads, d]` in float64."""
  q, k, v = (dense(p, n, x) for n in names)
  return q / math.sqrt(q.shape[-1]), k, v


def attention_rows(q, k, v, visible):
  """Per-example softmax attention; `visible` `[batch or 1, H or 1, N, M]`."""
  logits = np.einsum('bnhd,bmhd->bhnm', q, k)
  probs = masked_softmax(logits, visible)
  return np.einsum('bhnm,bmhd->bnhd', probs, v)


def dense_attention(variables, x, mask, allowed):
  """Softmax attention restricted to `allowed`, in float64.

  Args:
    variables: the layer's variables (projections `query`, `key`, `value`,
      `out`).
    x: `[batch, N, features]`.
    mask: bool `[batch, N]`, True = real.
    allowed: bool `[N, N]` or `[heads, N, N]`: query i may see key j.

  Returns:
    `[batch, N, out_features]`, zero at padded rows.
  """
  p = variables['params']
  x = np.asarray(x, np.float64)
  q, k, v = qkv(p, x)
  allowed = np.asarray(allowed, bool)
  if allowed.ndim == 2:
    allowed = allowed[None]
  visible = allowed[None] & mask[:, None, None, :]
  return output(p, attention_rows(q, k, v, visible), mask)


def check_gradients(layer, variables, x, mask, reference: Callable,
                    seed: int = 0, rtol: float = 1e-3, atol: float = 1e-3):
  """JAX gradients against central differences of the float64 reference.

  Compares the directional derivative of sum(w * y) along one random
  direction in parameters and input: the analytic one from `jax.grad` of
  the layer, the numeric one from `reference(variables, x)`. Returns the
  analytic gradients (parameters, input).
  """
  rng = np.random.RandomState(seed)
  out = jax.eval_shape(lambda v, a: layer.apply(v, a, padding_mask=mask),
                       variables, jnp.asarray(x))  # shape only, no compile
  w = rng.standard_normal(out.shape)
  d_params = jax.tree.map(lambda a: rng.standard_normal(a.shape),
                          variables['params'])
  d_x = rng.standard_normal(x.shape)
  grads = jax.jit(jax.grad(
      lambda v, a: jnp.sum(w * layer.apply(v, a, padding_mask=mask)),
      argnums=(0, 1)))(variables, jnp.asarray(x))
  analytic = float(np.sum(np.asarray(grads[1], np.float64) * d_x)) + sum(
      float(np.sum(np.asarray(g, np.float64) * e)) for g, e in zip(
          jax.tree.leaves(grads[0]['params']), jax.tree.leaves(d_params)))

  def loss(t):
    v = {'params': jax.tree.map(
        lambda a, e: np.asarray(a, np.float64) + t * e, variables['params'],
        d_params)}
    return float(np.sum(w * reference(v, x + t * d_x)))
  step = 1e-5
  numeric = (loss(step) - loss(-step)) / (2 * step)
  np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol)
  return grads


def check_padding_invariance(layer, variables, x, mask, seed: int = 7
                             ) -> None:
  """Changing padded inputs changes no real output, and padded ones are 0."""
  y = apply(layer, variables, x, mask)
  noise = 10.0 * np.random.RandomState(seed).standard_normal(x.shape)
  y2 = apply(layer, variables, np.where(mask[..., None], x, noise), mask)
  np.testing.assert_allclose(y2[mask], y[mask], rtol=1e-5, atol=1e-6)
  assert np.all(y[~mask] == 0.0) and np.all(y2[~mask] == 0.0)
  assert np.all(np.isfinite(y))


def with_padded_row(x, mask):
  """The inputs with one more row, all padding (a copy of row 0's values)."""
  return (np.concatenate([x, x[:1]]),
          np.concatenate([mask, np.zeros((1, mask.shape[1]), bool)]))


def check_any_padding(layer, variables, x, mask, seed: int = 0) -> None:
  """Finite outputs and gradients for every row (fully padded ones too),
  padded rows zero, real outputs blind to large padded inputs, and no
  gradient reaching padded inputs."""
  y = apply(layer, variables, x, mask)
  assert np.all(np.isfinite(y)) and np.all(y[~mask] == 0.0)
  noise = 50.0 * np.random.RandomState(seed).standard_normal(x.shape)
  y2 = apply(layer, variables, np.where(mask[..., None], x, noise), mask)
  np.testing.assert_allclose(y2[mask], y[mask], rtol=1e-5, atol=1e-6)

  def loss(v, a):
    return jnp.sum(call(layer, v, a, mask) ** 2)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(variables, jnp.asarray(x))
  for g in jax.tree_util.tree_leaves(grads):
    assert np.all(np.isfinite(np.asarray(g)))
  assert np.all(np.asarray(grads[1])[~mask] == 0.0)


def check_mesh(layer, variables, x, mask, atol: float = 1e-5) -> None:
  """Forward and gradients sharded over the data-parallel mesh (all fake
  devices) equal the single-device ones."""
  devices = jax.devices()
  reps = len(devices)
  xb = jnp.asarray(np.tile(x, (reps, 1, 1))[:reps])
  mb = jnp.asarray(np.tile(mask, (reps, 1))[:reps])
  mesh = sharding.create_mesh()
  batch = NamedSharding(mesh, P(sharding.DATA_AXIS))

  def loss(v, a, m):
    y = layer.apply(v, a, padding_mask=m)
    return jnp.sum(y ** 2), y
  fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (l1, y1), g1 = fn(variables, xb, mb)
  (l8, y8), g8 = fn(jax.device_put(variables, sharding.replicated(mesh)),
                    jax.device_put(xb, batch), jax.device_put(mb, batch))
  assert len(y8.sharding.device_set) == reps
  np.testing.assert_allclose(np.asarray(y8), np.asarray(y1), atol=atol)
  np.testing.assert_allclose(float(l8), float(l1), rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=1e-4, atol=atol), g8, g1)
