"""`'xla_rows'`: evaluation on CPU one batch row at a time
(lra_msmra/kernels/cpu_rows.py), on a toy mechanism that offers it."""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra.attention import base
from lra_msmra.kernels import cpu_rows


class _RowsProbe(base.Attention):
  """A toy mechanism with an `'xla_rows'` implementation; it sows what it
  sees."""
  IMPLEMENTATIONS = ('xla', cpu_rows.IMPLEMENTATION)

  def __call__(self, x, *, padding_mask: Optional[jax.Array] = None,
               deterministic: bool = True, **kwargs):
    if (self.implementation == cpu_rows.IMPLEMENTATION
        and cpu_rows.loops(self, deterministic, kwargs)):
      return cpu_rows.by_rows(self, x, padding_mask)
    return super().__call__(x, padding_mask=padding_mask,
                            deterministic=deterministic, **kwargs)

  @nn.compact
  def attend(self, x, *, padding_mask, deterministic):
    del deterministic
    # Mixes positions (a masked mean over the sequence), so a loop that
    # mixed rows would show.
    h = self.projection(4, 'value')(x)
    real = padding_mask[:, :, None, None].astype(h.dtype)
    pooled = jnp.sum(h * real, 1, keepdims=True) / jnp.sum(real, 1,
                                                          keepdims=True)
    self.sow('intermediates', 'batch', jnp.asarray(x.shape[0]))
    return self.output_projection(x.shape[-1])(h + pooled)


def _lowered(fn, *args, platform='cpu'):
  # A fresh function each time: jit would reuse an earlier trace of `fn`.
  return jax.jit(lambda *a: fn(*a)).trace(*args).lower(
      lowering_platforms=(platform,)).as_text()


def test_rows_loop_only_for_a_cpu_evaluation(monkeypatch):
  rows_layer = _RowsProbe(num_heads=2, use_bias=True,
                          implementation='xla_rows')
  whole_layer = rows_layer.clone(implementation='xla')
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 8))
  mask = jnp.arange(5)[None, :] < jnp.array([[5], [3], [1]])
  variables = rows_layer.init(jax.random.PRNGKey(1), x, padding_mask=mask)
  evaluate = lambda v, x: rows_layer.apply(v, x, padding_mask=mask)
  # The tests' process has 8 CPU devices (tests/conftest.py): no loop there,
  # since the batch may be split over them.
  assert len(jax.devices('cpu')) > 1 and not cpu_rows.one_cpu_device()
  assert 'stablehlo.while' not in _lowered(evaluate, variables, x)
  # A process with one CPU device, as users run.
  monkeypatch.setattr(cpu_rows, 'one_cpu_device', lambda: True)
  assert 'stablehlo.while' in _lowered(evaluate, variables, x)
  for platform in ('cuda', 'tpu'):
    assert 'stablehlo.while' not in _lowered(evaluate, variables, x,
                                             platform=platform)
  # Each row was computed alone, and gives what the whole batch gives.
  rows = jax.jit(evaluate)(variables, x)
  whole = jax.jit(lambda v, x: whole_layer.apply(v, x, padding_mask=mask))(
      variables, x)
  np.testing.assert_allclose(rows, whole, rtol=1e-6, atol=1e-6)
  assert not np.any(np.asarray(rows)[~np.asarray(mask)])

  # Differentiated: the whole batch, with the same gradients bit for bit.
  def loss(layer):
    return lambda v, x: jnp.sum(jnp.sin(layer.apply(v, x, padding_mask=mask)))
  assert 'stablehlo.while' not in _lowered(jax.grad(loss(rows_layer), (0, 1)),
                                           variables, x)
  grads = jax.jit(jax.grad(loss(rows_layer), (0, 1)))(variables, x)
  want = jax.jit(jax.grad(loss(whole_layer), (0, 1)))(variables, x)
  jax.tree.map(np.testing.assert_array_equal, grads, want)


def test_rows_keep_the_whole_batch_where_a_row_loop_would_differ(
    monkeypatch):
  monkeypatch.setattr(cpu_rows, 'one_cpu_device', lambda: True)
  layer = _RowsProbe(num_heads=2, dropout_rate=0.5,
                     implementation='xla_rows')
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 8))
  variables = layer.init(jax.random.PRNGKey(1), x)
  calls = {
      # Sowing: a row loop would sow per row.
      'intermediates': lambda v, x: layer.apply(
          v, x, mutable=['intermediates']),
      # Dropout: its mask is drawn for the whole batch.
      'dropout': lambda v, x: layer.apply(
          v, x, deterministic=False, rngs={'dropout': jax.random.PRNGKey(2)}),
  }
  for name, call in calls.items():
    assert 'stablehlo.while' not in _lowered(call, variables, x), name
  _, sown = calls['intermediates'](variables, x)
  assert sown['intermediates']['batch'] == (3,)
