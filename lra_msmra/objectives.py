"""What a run trains its model to do: classify, or predict the task's own
tokens (self-pretraining).

LRA trains every model from random initialisation on the labels. Amos,
Berant and Gupta ("Never Train from Scratch", ICLR 2024) first pretrain on
the downstream task's own training inputs, with no labels and no other
data, then fine-tune: docs/pretraining.md. `config.objective` picks one:

* `'classify'`: the task's labels (LRA; every config's default).
* `'masked'`: a share `config.masking.rate` of the real tokens of each
  input is replaced by a mask token (id `vocab_size`, one row more in the
  embedding) and predicted from the rest. With `config.masking.span` > 1,
  masked runs of that many tokens start at random, so that a run's
  neighbours do not give it away. Pixels are the 256-way tokens the LRA
  models embed.
* `'causal'`: each token predicts the next one, under the mechanism's
  causal form (a mechanism without one is refused, naming `'masked'`).

Padding (`model.mask_padding`: id 0) is never masked and never a target.
Retrieval's two documents are pretrained as two single sequences. The loss
and accuracy are over the predicted tokens only: the functions below give
each token a weight, and the step sums the classification metrics per
token instead of per example (`lra_msmra.steps`).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

OBJECTIVES = ('classify', 'masked', 'causal')
# The masking of every evaluation batch comes from this key, so a model's
# validation loss is comparable from one evaluation to the next.
EVAL_MASKING_SEED = 0


def check(config: Mapping[str, Any]) -> None:
  """Checks `config.objective`, `config.masking` and `config.init_from`.

  Raises:
    ValueError: naming the key and the fix.
  """
  objective = config['objective']
  if objective not in OBJECTIVES:
    raise ValueError(f'config.objective={objective!r}; valid: {OBJECTIVES}.')
  masking = config['masking']
  rate, span = masking['rate'], masking['span']
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
      0.0 < rate < 1.0):
    raise ValueError(f'config.masking.rate={rate!r} must be a number in '
                     '(0, 1): the share of real tokens masked.')
  if isinstance(span, bool) or not isinstance(span, int) or span < 1:
    raise ValueError(f'config.masking.span={span!r} must be a positive '
                     'integer (1: tokens masked one by one).')
  init_from = config['init_from']
  if not isinstance(init_from, str):
    raise ValueError(f'config.init_from={init_from!r} must be a string: '
                     "the workdir of a finished run, or '' to start from "
                     'random initialisation.')
  if init_from and objective != 'classify':
    raise ValueError(
        f'config.init_from={init_from!r} with config.objective='
        f"{objective!r}: a run starts from a pretrained encoder to "
        "fine-tune it on the labels. Set config.objective='classify', or "
        "config.init_from='' to pretrain from scratch.")


def embedding_rows(objective: str, vocab_size: int) -> int:
  """Rows of the encoder's token table: one more for the mask token."""
  return vocab_size + 1 if objective == 'masked' else vocab_size


def mask_positions(rng: jax.Array, real: jax.Array, rate: float, span: int
                   ) -> jax.Array:
  """Bool `[batch, length]`: the real positions to mask.

  Runs of `span` positions start independently with probability
  p = 1 - (1 - rate) ** (1 / span), so that a position is covered by some
  run with probability `rate` (away from the edges); positions that are not
  real are never masked. Each row gets at least one masked position when
  it has a real one, so every example has a target.
  """
  p = 1.0 - (1.0 - rate) ** (1.0 / span)
  start_rng, fallback_rng = jax.random.split(rng)
  starts = jax.random.bernoulli(start_rng, p, real.shape)
  covered = starts
  for shift in range(1, span):  # A run covers its start and span - 1 more.
    covered = covered | jnp.pad(starts, ((0, 0), (shift, 0)))[:, :-shift]
  masked = covered & real
  # A row with real tokens and nothing masked: mask one of them at random.
  score = jnp.where(real, jax.random.uniform(fallback_rng, real.shape), -1.0)
  pick = jnp.arange(real.shape[1])[None, :] == jnp.argmax(score, axis=1)[
      :, None]
  empty = ~masked.any(axis=1, keepdims=True)
  return masked | (empty & pick & real)


def masked_inputs(rng: jax.Array, ids: jax.Array, real: jax.Array, *,
                  rate: float, span: int, mask_id: int
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(inputs, targets, token weights) of the masked objective."""
  masked = mask_positions(rng, real, rate, span)
  inputs = jnp.where(masked, jnp.asarray(mask_id, ids.dtype), ids)
  return inputs, ids, masked.astype(jnp.float32)


def causal_targets(ids: jax.Array, real: jax.Array
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(inputs, targets, token weights) of next-token prediction: position i
  predicts token i + 1 where both are real; the last position predicts
  nothing."""
  targets = jnp.pad(ids[:, 1:], ((0, 0), (0, 1)))
  next_real = jnp.pad(real[:, 1:], ((0, 0), (0, 1)))
  return ids, targets, (real & next_real).astype(jnp.float32)
