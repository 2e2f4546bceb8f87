r"""Linear Transformer attention, elu(x) + 1 kernel (registry `linear`).

Paper: Katharopoulos et al., ICML 2020, arXiv:2006.16236. Official LRA code:
google-research/long-range-arena, `lra_benchmarks/models/linear_transformer/`.

y_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)
with phi(x) = elu(x) + 1, in O(N d^2); the causal form is a scan over positions
(`causal_kernel_sums`), which `performer` shares.

docs/mechanisms/linear.md: the computation, every departure from the official
code and why, padding, the causal form, the tested invariants and the LRA
settings.
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp

from lra_msmra.attention import base

Array = jax.Array

# The official code's epsilon in the normaliser 1 / (phi(q) . sum phi(k) + eps).
EPSILON = 1e-6


def elu_feature_map(x: Array) -> Array:
  """phi(x) = elu(x) + 1, elementwise, float32 (always positive)."""
  return jax.nn.elu(x.astype(jnp.float32)) + 1.0


def kernel_sums(phi_q: Array, phi_k: Array, v: Array, key_valid: Array
                ) -> tuple[Array, Array]:
  """Bidirectional kernel-attention numerator and denominator.

  Args:
    phi_q: non-negative query features `[batch, length, heads, m]`.
    phi_k: non-negative key features `[batch, length, heads, m]`.
    v: values `[batch, length, heads, d]`.
    key_valid: bool `[batch, length]`; False keys enter neither sum.

  Returns:
    float32 (numerator `[batch, length, heads, d]` = sum_j (phi_q_i .
    phi_k_j) v_j, denominator `[batch, length, heads]` = sum_j phi_q_i .
    phi_k_j), over valid keys j.
  """
  phi_k = jnp.where(key_valid[:, :, None, None], phi_k, 0.0)
  kv = jnp.einsum('bnhm,bnhd->bhmd', phi_k, v.astype(jnp.float32))
  num = jnp.einsum('bnhm,bhmd->bnhd', phi_q, kv)
  den = jnp.einsum('bnhm,bhm->bnh', phi_q, phi_k.sum(axis=1))
  return num, den


def causal_kernel_sums(phi_q: Array, phi_k: Array, v: Array,
                       key_valid: Array, key_log_scale: Optional[Array] = None
                       ) -> tuple[Array, Array]:
  """Causal kernel sums: position i sums over valid keys j <= i only.

  A scan over positions carries S = sum_j w_j phi_k_j v_j^T and
  z = sum_j w_j phi_k_j, so output i reads nothing after position i (exactly
  causal, bit for bit). With `key_log_scale` s_j, key j's features count
  with weight w_j = exp(s_j); the state is kept relative to the running
  maximum of s, so large scales never overflow: numerator and denominator
  of row i are both multiplied by exp(-max_{j <= i} s_j), which cancels in
  their ratio.

  Args:
    phi_q, phi_k, v, key_valid: as `kernel_sums`.
    key_log_scale: optional float32 `[batch, length, heads]`.

  Returns:
    (numerator, denominator) as `kernel_sums`, at the running scale.
  """
  batch, _, heads, m = phi_k.shape
  d = v.shape[-1]
  phi_k = jnp.where(key_valid[:, :, None, None], phi_k, 0.0)
  v = v.astype(jnp.float32)
  scaled = key_log_scale is not None
  if scaled:
    log_scale = jnp.where(key_valid[:, :, None], key_log_scale, -jnp.inf)
  else:
    log_scale = jnp.zeros((batch, phi_k.shape[1], heads), jnp.float32)
  seq = lambda a: jnp.moveaxis(a, 1, 0)

  def step(carry, inputs):
    s_state, z_state, top = carry
    q_t, k_t, v_t, s_t = inputs
    if scaled:
      new_top = jnp.maximum(top, s_t)
      finite = jnp.isfinite(new_top)
      ref = jnp.where(finite, new_top, 0.0)
      keep = jnp.where(jnp.isfinite(top), jnp.exp(top - ref), 0.0)
      w_t = jnp.where(jnp.isfinite(s_t), jnp.exp(s_t - ref), 0.0)
      s_state = s_state * keep[..., None, None]
      z_state = z_state * keep[..., None]
      k_t = k_t * w_t[..., None]
    else:
      new_top = top
    s_state = s_state + k_t[..., :, None] * v_t[..., None, :]
    z_state = z_state + k_t
    num = jnp.einsum('bhm,bhmd->bhd', q_t, s_state)
    den = jnp.einsum('bhm,bhm->bh', q_t, z_state)
    return (s_state, z_state, new_top), (num, den)

  init = (jnp.zeros((batch, heads, m, d), jnp.float32),
          jnp.zeros((batch, heads, m), jnp.float32),
          jnp.full((batch, heads), -jnp.inf, jnp.float32))
  _, (num, den) = lax.scan(step, init, (seq(phi_q), seq(phi_k), seq(v),
                                        seq(log_scale)))
  return jnp.moveaxis(num, 0, 1), jnp.moveaxis(den, 0, 1)


class LinearAttention(base.Attention):
  """Linear Transformer attention (see the module docstring).

  No knobs beyond the shared contract: the feature map (elu + 1) and the
  normaliser's epsilon (1e-6) are those of the paper and the official code.
  """

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies linear attention; see `base.Attention.attend`.

    `deterministic` is unused (no attention dropout, module docstring).
    """
    del deterministic
    q, k, v = self.project_qkv(x)
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    sums = causal_kernel_sums if self.causal else kernel_sums
    num, den = sums(phi_q, phi_k, v, padding_mask)
    out = num / (den + EPSILON)[..., None]
    out = out.astype(self.dtype)
    return self.output_projection(self.head_dims(x).out_features)(out)
