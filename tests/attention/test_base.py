"""Numerics helpers shared by the mechanisms (lra_msmra/attention/base.py)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention import base


def test_safe_softmax_parts_equals_safe_softmax_of_the_concatenation():
  rng = np.random.RandomState(0)
  a = jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float32)
  b = jnp.asarray(rng.standard_normal((2, 3, 5)) * 10, jnp.float32)
  valid_a = jnp.asarray(rng.rand(2, 1, 4) > 0.4)  # broadcasts over rows.
  valid_b = jnp.asarray(rng.rand(2, 3, 5) > 0.4)
  valid_a = valid_a.at[1].set(False)
  valid_b = valid_b.at[1, 0].set(False)  # Row (1, 0): nothing valid at all.
  whole = base.safe_softmax(
      jnp.concatenate([a, b], -1),
      jnp.concatenate([jnp.broadcast_to(valid_a, a.shape), valid_b], -1))
  parts = base.safe_softmax_parts([a, b], [valid_a, valid_b])
  np.testing.assert_allclose(jnp.concatenate(parts, -1), whole, rtol=1e-6,
                             atol=1e-7)
  assert not np.any(parts[0][1, 0]) and not np.any(parts[1][1, 0])
  grads = jax.grad(lambda x, y: sum(
      jnp.sum(jnp.sin(p)) for p in base.safe_softmax_parts(
          [x, y], [valid_a, valid_b])), argnums=(0, 1))(a, b)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def _dense_attention(q, k, v, key_valid, causal):
  valid = key_valid[:, None, None, :]
  if causal:
    valid = valid & base.causal_mask(q.shape[1], k.shape[1])[None, None]
  scores = jnp.einsum('bqhd,bkhd->bhqk', q, k)
  return jnp.einsum('bhqk,bkhd->bqhd', base.safe_softmax(scores, valid), v)


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('block', [1, 4, 11, 64])
def test_blocked_attention_equals_dense_attention_with_its_gradients(
    causal, block):
  rng = np.random.RandomState(0)
  q, k, v, cotangent = (
      jnp.asarray(rng.standard_normal((2, 11, 3, 5)) * 2, jnp.float32)
      for _ in range(4))
  # Example 1 has padding on both sides: with the causal mask its first three
  # queries see no valid key at all and must get zeros.
  key_valid = jnp.asarray([[True] * 11, [False] * 3 + [True] * 5 + [False] * 3])
  blocked, blocked_vjp = jax.vjp(
      lambda *a: base.blocked_attention(*a, key_valid, causal=causal,
                                        block=block), q, k, v)
  dense, dense_vjp = jax.vjp(
      lambda *a: _dense_attention(*a, key_valid, causal), q, k, v)
  # float32 round-off, relative to each array's scale.
  np.testing.assert_allclose(blocked, dense, atol=1e-5 * np.abs(dense).max())
  for got, want in zip(blocked_vjp(cotangent), dense_vjp(cotangent)):
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max())
  if causal:
    assert not np.any(blocked[1, :3])


def test_blocked_attention_with_fewer_queries_than_keys():
  rng = np.random.RandomState(1)
  q = jnp.asarray(rng.standard_normal((1, 5, 2, 4)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((1, 9, 2, 4)), jnp.float32)
          for _ in range(2))
  key_valid = jnp.asarray([[True] * 7 + [False] * 2])
  np.testing.assert_allclose(
      base.blocked_attention(q, k, v, key_valid, block=2),
      _dense_attention(q, k, v, key_valid, False), atol=1e-5)
  with pytest.raises(ValueError, match='as many queries as keys'):
    base.blocked_attention(q, k, v, key_valid, causal=True)


def test_after_keeps_values_and_stays_on_each_devices_rows():
  anchor = jnp.arange(8 * 3 * 2, dtype=jnp.float32).reshape(8, 3, 2)
  stats = jnp.ones((8, 3, 1), jnp.float32)
  np.testing.assert_array_equal(base.after(anchor, stats)[0], stats)
  poisoned = base.after(anchor.at[2, 0, 0].set(jnp.nan), stats)[0]
  assert np.isnan(poisoned[2]).all() and not np.isnan(np.delete(
      np.asarray(poisoned), 2, axis=0)).any()
  with pytest.raises(ValueError, match='leading axis'):
    base.after(anchor, jnp.ones((3,)))
  # Batch-sharded over 8 devices (data parallelism): no communication.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ('data',))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  hlo = jax.jit(base.after, in_shardings=(rows, rows),
                out_shardings=rows).lower(anchor, stats).compile().as_text()
  for op in ('all-reduce', 'all-gather', 'collective-permute', 'all-to-all'):
    assert op not in hlo, op


class _RowsProbe(base.Attention):
  """A toy mechanism that opts into `rows_on_cpu`; it sows what it sees."""
  rows_on_cpu = True

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


def test_rows_on_cpu_loops_only_for_a_cpu_evaluation(monkeypatch):
  layer = _RowsProbe(num_heads=2, use_bias=True)
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 8))
  mask = jnp.arange(5)[None, :] < jnp.array([[5], [3], [1]])
  variables = layer.init(jax.random.PRNGKey(1), x, padding_mask=mask)
  evaluate = lambda v, x: layer.apply(v, x, padding_mask=mask)
  # The tests' process has 8 CPU devices (tests/conftest.py): no loop there,
  # since the batch may be split over them.
  assert len(jax.devices('cpu')) > 1 and not base.one_cpu_device()
  assert 'stablehlo.while' not in _lowered(evaluate, variables, x)
  # A process with one CPU device, as users run.
  monkeypatch.setattr(base, 'one_cpu_device', lambda: True)
  assert 'stablehlo.while' in _lowered(evaluate, variables, x)
  for platform in ('cuda', 'tpu'):
    assert 'stablehlo.while' not in _lowered(evaluate, variables, x,
                                             platform=platform)
  # Each row was computed alone, and gives what the whole batch gives.
  rows = jax.jit(evaluate)(variables, x)
  monkeypatch.setattr(_RowsProbe, 'rows_on_cpu', False)
  whole = jax.jit(lambda v, x: layer.apply(v, x, padding_mask=mask))(
      variables, x)
  np.testing.assert_allclose(rows, whole, rtol=1e-6, atol=1e-6)
  monkeypatch.setattr(_RowsProbe, 'rows_on_cpu', True)

  # Differentiated: the whole batch, with the same gradients bit for bit.
  def loss(v, x):
    return jnp.sum(jnp.sin(layer.apply(v, x, padding_mask=mask)))
  assert 'stablehlo.while' not in _lowered(jax.grad(loss, (0, 1)),
                                           variables, x)
  grads = jax.jit(jax.grad(loss, (0, 1)))(variables, x)
  monkeypatch.setattr(_RowsProbe, 'rows_on_cpu', False)
  want = jax.jit(jax.grad(loss, (0, 1)))(variables, x)
  jax.tree.map(np.testing.assert_array_equal, grads, want)


def test_rows_on_cpu_keeps_the_whole_batch_where_a_row_loop_would_differ(
    monkeypatch):
  monkeypatch.setattr(base, 'one_cpu_device', lambda: True)
  layer = _RowsProbe(num_heads=2, dropout_rate=0.5)
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
