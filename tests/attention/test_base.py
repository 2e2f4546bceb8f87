"""The contract's shared pieces (lra_msmra/attention/base.py): numerics
helpers and the `implementation` field."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import attention
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


@pytest.mark.parametrize('name', sorted(attention.REGISTRY))
def test_every_mechanism_has_the_xla_implementation(name):
  cls = attention.REGISTRY[name]
  assert cls.IMPLEMENTATIONS[0] == 'xla'
  # One switch: the implementations are the kernel table's, each with the
  # hot paths of 'xla'.
  assert cls.IMPLEMENTATIONS == tuple(cls.KERNELS)
  assert all(set(t) == set(cls.KERNELS['xla']) for t in cls.KERNELS.values())
  assert cls(num_heads=2).implementation == 'xla'
  cls(num_heads=2, implementation='xla')
  with pytest.raises(ValueError) as e:
    cls(num_heads=2, implementation='cuda')
  message = str(e.value)
  assert '\n' not in message
  assert message == (f"{cls.__name__} has no implementation='cuda'; valid: "
                     f'{cls.IMPLEMENTATIONS}.')


def test_a_kernel_table_missing_a_path_is_refused():
  with pytest.raises(TypeError, match=r"KERNELS\['fast'\] has the paths "
                     r"\[\], 'xla' has \['core'\]"):

    class Broken(base.Attention):  # pylint: disable=unused-variable
      KERNELS = {'xla': {'core': lambda layer: None}, 'fast': {}}


def test_the_layer_calls_the_function_of_its_implementation():
  calls = []

  class Switch(base.Attention):
    KERNELS = {'xla': {'core': lambda layer, x: calls.append(('xla', x))},
               'fast': {'core': lambda layer, x: calls.append(('fast', x))}}

  assert Switch.IMPLEMENTATIONS == ('xla', 'fast')
  Switch(implementation='fast').kernel('core')(1)
  Switch().kernel('core')(2)
  assert calls == [('fast', 1), ('xla', 2)]
