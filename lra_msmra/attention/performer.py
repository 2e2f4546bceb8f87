r"""Performer: FAVOR+ kernel attention (registry `performer`).

Paper: Choromanski et al., ICLR 2021, arXiv:2009.14794. Official LRA code:
google-research/long-range-arena, `lra_benchmarks/models/performer/`.

Kernel attention with positive random features for the softmax kernel
(`kernel='softmax'`) or ReLU features (`'relu'`, the official LRA default),
computed with `linear`'s sums; the features are a constant drawn from
`feature_seed`.

docs/mechanisms/performer.md: the computation, every departure from the
official code and why, padding, the causal form, the tested invariants and the
LRA settings.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base
from lra_msmra.attention import linear

Array = jax.Array

KERNELS = ('softmax', 'relu')
FEATURES = ('orthogonal', 'iid', 'deterministic')
# Official numerical stabilisers: added to softmax features / to the
# normaliser (softmax), and to relu features / to the normaliser (relu).
SOFTMAX_EPSILON = 1e-6
RELU_EPSILON = 1e-3
DENOMINATOR_EPSILON = {'softmax': 1e-6, 'relu': 0.0}


@functools.lru_cache(maxsize=32)
def random_projection(seed: int, num_features: int, dim: int, features: str,
                      ortho_scaling: int = 0) -> Optional[Array]:
  """The `[num_features, dim]` float32 projection W, or None (deterministic).

  Orthogonal: ceil(m / d) blocks, each the transposed Q of the QR of an
  independent Gaussian d x d matrix (orthonormal rows), the last one cut to
  the rows left; rows then scaled to the norms of the rows of a Gaussian
  m x d matrix (`ortho_scaling=0`) or to sqrt(d) (`1`). All draws come from
  `PRNGKey(seed)` (not the official code's sequence of keys). Computed
  eagerly, also under `jit` (a constant of the compiled program), and cached.
  """
  with jax.ensure_compile_time_eval():
    return _draw_projection(seed, num_features, dim, features, ortho_scaling)


def _draw_projection(seed, num_features, dim, features, ortho_scaling):
  if features == 'deterministic':
    return None
  key = jax.random.PRNGKey(seed)
  if features == 'iid':
    return jax.random.normal(key, (num_features, dim), jnp.float32)
  norm_key, block_key = jax.random.split(key)
  num_blocks = -(-num_features // dim)
  q, _ = jnp.linalg.qr(jax.random.normal(block_key, (num_blocks, dim, dim),
                                         jnp.float32))
  w = jnp.swapaxes(q, 1, 2).reshape(num_blocks * dim, dim)[:num_features]
  if ortho_scaling == 0:
    norms = jnp.linalg.norm(jax.random.normal(
        norm_key, (num_features, dim), jnp.float32), axis=1)
  else:
    norms = jnp.full((num_features,), math.sqrt(dim), jnp.float32)
  return norms[:, None] * w


def _project(x: Array, w: Optional[Array]) -> Array:
  return x if w is None else jnp.einsum('bnhd,md->bnhm', x, w)


def softmax_query_features(q: Array, w: Array) -> Array:
  """FAVOR+ query features (float32), stabilised by their row maximum."""
  scale = q.shape[-1] ** -0.25
  dash = _project(q * scale, w)
  half_norm = 0.5 * jnp.sum(jnp.square(q * scale), -1, keepdims=True)
  top = jnp.max(dash, axis=-1, keepdims=True)
  return (jnp.exp(dash - half_norm - top) + SOFTMAX_EPSILON) / math.sqrt(
      w.shape[0])


def softmax_key_logits(k: Array, w: Array) -> Array:
  """log of the unstabilised FAVOR+ key features, W k' - |k'|^2 / 2."""
  scale = k.shape[-1] ** -0.25
  return (_project(k * scale, w)
          - 0.5 * jnp.sum(jnp.square(k * scale), -1, keepdims=True))


def softmax_key_features(k: Array, w: Array, key_valid: Array) -> Array:
  """FAVOR+ key features, stabilised by the maximum of W k' over real keys.

  The official stabiliser is the maximum of the projections W k' (not of
  the logits) over all keys and features; padded keys are left out here.
  """
  scale = k.shape[-1] ** -0.25
  dash = _project(k * scale, w)
  masked = jnp.where(key_valid[:, :, None, None], dash, -jnp.inf)
  top = jnp.max(masked, axis=(1, 3), keepdims=True)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  half_norm = 0.5 * jnp.sum(jnp.square(k * scale), -1, keepdims=True)
  return (jnp.exp(dash - half_norm - top) + SOFTMAX_EPSILON) / math.sqrt(
      w.shape[0])


def relu_features(x: Array, w: Optional[Array], normalize: bool) -> Array:
  """Generalized-attention features relu(W x) + 1e-3 (float32)."""
  if normalize:
    x = x * x.shape[-1] ** -0.25
  return jax.nn.relu(_project(x, w)) + RELU_EPSILON


class PerformerAttention(base.Attention):
  """Performer attention (see the module docstring).

  Attributes:
    kernel: 'softmax' (FAVOR+) or 'relu' (generalized attention).
    num_features: m, the number of random features (unused when
      `features='deterministic'`).
    features: 'orthogonal', 'iid' or 'deterministic'; None = 'orthogonal'
      for softmax, 'deterministic' for relu (the official defaults).
    ortho_scaling: 0 (row norms of a Gaussian matrix) or 1 (sqrt(d)).
    normalize_data: divide q and k by d^{1/4} before the features; None =
      True for softmax (needed for exp(q.k / sqrt(d))), False for relu
      (official defaults).
    feature_seed: seed of the projection W.
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('softmax', {'kernel': 'softmax', 'num_features': 16}),
      ('relu', {'kernel': 'relu'}),
  )

  kernel: str = 'softmax'
  num_features: int = 256
  features: Optional[str] = None
  ortho_scaling: int = 0
  normalize_data: Optional[bool] = None
  feature_seed: int = 0

  def check_knobs(self) -> None:
    if self.kernel not in KERNELS:
      raise ValueError(f'Unknown Performer kernel {self.kernel!r}; valid: '
                       f'{KERNELS}.')
    if self.features is not None and self.features not in FEATURES:
      raise ValueError(f'Unknown Performer features {self.features!r}; '
                       f'valid: {FEATURES}.')
    if self.kernel == 'softmax' and self.features == 'deterministic':
      raise ValueError("kernel='softmax' needs random features "
                       "('orthogonal' or 'iid'), not 'deterministic'.")
    if self.kernel == 'softmax' and self.normalize_data is False:
      raise ValueError("kernel='softmax' estimates exp(q.k / sqrt(d)) only "
                       'with normalize_data=True (or None).')
    if not isinstance(self.num_features, int) or self.num_features < 1:
      raise ValueError(f'num_features={self.num_features!r} must be a '
                       'positive int.')
    if self.ortho_scaling not in (0, 1):
      raise ValueError(f'ortho_scaling={self.ortho_scaling!r} must be 0 or 1.')

  def feature_type(self) -> str:
    if self.features is not None:
      return self.features
    return 'orthogonal' if self.kernel == 'softmax' else 'deterministic'

  def projection_matrix(self, head_dim: int) -> Optional[Array]:
    """The layer's W `[num_features, head_dim]` (None if deterministic)."""
    return random_projection(self.feature_seed, self.num_features, head_dim,
                             self.feature_type(), self.ortho_scaling)

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies Performer attention; see `base.Attention.attend`.

    `deterministic` is unused (no attention dropout; W is fixed).
    """
    del deterministic
    real = padding_mask
    _, head_dim, out_features = self.head_dims(x)
    q, k, v = self.project_qkv(x)
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    w = self.projection_matrix(head_dim)
    log_scale = None
    if self.kernel == 'softmax':
      phi_q = softmax_query_features(q, w)
      if self.causal:
        logits = softmax_key_logits(k, w)
        log_scale = jnp.max(logits, axis=-1)
        phi_k = jnp.exp(logits - log_scale[..., None]) / math.sqrt(
            w.shape[0])
      else:
        phi_k = softmax_key_features(k, w, real)
    else:
      normalize = bool(self.normalize_data)
      phi_q = relu_features(q, w, normalize)
      phi_k = relu_features(k, w, normalize)
    if self.causal:
      num, den = linear.causal_kernel_sums(phi_q, phi_k, v, real, log_scale)
    else:
      num, den = linear.kernel_sums(phi_q, phi_k, v, real)
    eps = DENOMINATOR_EPSILON[self.kernel]
    den = den + 2 * eps * (jnp.abs(den) <= eps)
    ok = den != 0
    out = jnp.where(ok[..., None], num / jnp.where(ok, den, 1.0)[..., None],
                    0.0)
    return self.output_projection(out_features)(out.astype(self.dtype))
