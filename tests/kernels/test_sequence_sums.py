"""Weighted sums over the sequence: the GPU's form equals the product."""

import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra.kernels import sequence_sums


def test_the_gpu_form_equals_the_matrix_product_with_gradients():
  w = jax.random.normal(jax.random.PRNGKey(0), (2, 37, 3, 5))
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 37, 3, 8))
  cot = jax.random.normal(jax.random.PRNGKey(2), (2, 3, 5, 8))
  want = jnp.einsum('bnhr,bnhd->bhrd', w, x)
  for form in (sequence_sums._reduce, sequence_sums._product,
               sequence_sums.weighted_sums):
    np.testing.assert_allclose(form(w, x), want, rtol=1e-5, atol=1e-5)
    got = jax.grad(lambda w, x, f=form: jnp.sum(f(w, x) * cot),
                   (0, 1))(w, x)
    expected = jax.grad(
        lambda w, x: jnp.sum(jnp.einsum('bnhr,bnhd->bhrd', w, x) * cot),
        (0, 1))(w, x)
    for g, e in zip(got, expected):
      np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_the_gpu_form_moves_no_activation_in_its_program():
  # On GPUs the sums are a multiply-reduce: neither the forward nor the
  # gradient program transposes an array of the sequence's length.
  w = jax.ShapeDtypeStruct((2, 64, 3, 5), jnp.float32)
  x = jax.ShapeDtypeStruct((2, 64, 3, 8), jnp.float32)

  def loss(w, x):
    return jnp.sum(sequence_sums._reduce(w, x) ** 2)
  jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1)))(w, x)
  big = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == 'transpose'
         and 64 in e.invars[0].aval.shape]
  assert not big
  # The matrix product's gradient does.
  jaxpr = jax.make_jaxpr(jax.grad(
      lambda w, x: jnp.sum(sequence_sums._product(w, x) ** 2), (0, 1)))(w, x)
  assert any(e.primitive.name == 'transpose'
             and 64 in e.invars[0].aval.shape for e in jaxpr.jaxpr.eqns)
