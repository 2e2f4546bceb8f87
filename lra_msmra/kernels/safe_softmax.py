"""A softmax over the valid entries of its rows, safe for rows with none.

What every mechanism's `'xla'` code (through `lra_msmra.attention.base`)
and the glue around the fused kernels normalise with: float32 whatever the
input dtype, zeros for rows without a valid entry, finite gradients for any
pattern of valid entries, and in parts, so that several key sets share one
softmax without being concatenated.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

Array = jax.Array


def safe_softmax(logits: Array, valid: Array, axis: int = -1) -> Array:
  """Softmax over the valid entries; rows with no valid entry give zeros.

  Computed in float32 whatever the input dtype. Gradients are finite for any
  pattern of `valid`, including rows that are entirely invalid.

  Args:
    logits: scores, any shape.
    valid: bool, broadcastable to `logits`; False entries get zero weight.
    axis: the axis to normalise over.

  Returns:
    float32 weights of `logits`' shape.
  """
  valid = jnp.broadcast_to(valid, logits.shape)
  unnorm, _, total = softmax_terms([logits], [valid], axis)
  return unnorm[0] / total


def safe_softmax_parts(logits: Sequence[Array], valid: Sequence[Array]
                       ) -> list[Array]:
  """`safe_softmax` over the last axis of the concatenated `logits`, in parts.

  The parts share their leading axes; one row maximum and one row total over
  all of them (a multi-part log-sum-exp) give the weights of the
  concatenation without building it, so no second copy of the logits or of
  their masks exists. Same numerics as `safe_softmax`: float32, zeros for
  rows without a valid entry, finite gradients.

  Args:
    logits: the parts `[..., keys_p]`.
    valid: bool, one per part, broadcastable to it.

  Returns:
    float32 weights, one array per part.
  """
  unnorm, _, total = softmax_terms(logits, valid, -1)
  return [u / total for u in unnorm]


def softmax_terms(logits: Sequence[Array], valid: Sequence[Array], axis: int
                   ) -> tuple[list[Array], Array, Array]:
  """The pieces of a safe softmax over `axis` of the concatenated parts.

  Returns the float32 unnormalised weights per part (zero where invalid),
  the shared row maximum (0 for rows without a valid entry; no gradient)
  and the shared row total (1 for such rows), so that the weights are
  `unnorm / total` and the log-sum-exp is `row_max + log(total)`.
  """
  masked = [jnp.where(m, l.astype(jnp.float32), -jnp.inf)
            for l, m in zip(logits, valid)]
  row_max = masked[0].max(axis, keepdims=True)
  for m in masked[1:]:
    row_max = jnp.maximum(row_max, m.max(axis, keepdims=True))
  row_max = jax.lax.stop_gradient(
      jnp.where(jnp.isfinite(row_max), row_max, 0.0))
  unnorm = [jnp.exp(m - row_max) for m in masked]
  total = unnorm[0].sum(axis, keepdims=True)
  for u in unnorm[1:]:
    total = total + u.sum(axis, keepdims=True)
  return unnorm, row_max, jnp.where(total > 0, total, 1.0)
