"""Optimizers and learning-rate schedules of the three LRA protocols.

* LRA (docs/protocol.md §4): Adam(0.9, 0.98, 1e-9) with decoupled weight decay
  scaled by the learning rate on every parameter, and the factor-string
  schedules of `create_learning_rate_scheduler` (`constant`, `linear_warmup`,
  `rsqrt_decay`, `rsqrt_normalized_decay`, `decay_every`, `cosine_decay`),
  evaluated at the 0-based update index, so the first update has lr 0 (P18).
* Xiong et al. (docs/protocol.md §8.3): AdamW(0.9, 0.999, 1e-6) under PyTorch's
  `OneCycleLR` with linear annealing, including the cycling of Adam's beta1
  between 0.95 and 0.85 (`cycle_momentum`).
* CST (docs/protocol.md §9.1): AdamW with linear warmup then linear decay to 0.

Each schedule and optimizer is a small ConfigDict whose keys must be exactly
those listed in `SCHEDULE_KEYS` / `OPTIMIZER_KEYS` for its `name`, so a key that
would be ignored is an error.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lra_msmra import config_lib

Schedule = Callable[[jax.Array], jax.Array]

SCHEDULE_KEYS = {
    'factors': {'name', 'factors', 'base_learning_rate', 'warmup_steps',
                'steps_per_cycle', 'decay_factor', 'steps_per_decay'},
    'one_cycle': {'name', 'max_learning_rate', 'warmup_steps', 'div_factor',
                  'final_div_factor'},
    'warmup_linear_decay': {'name', 'learning_rate', 'warmup_steps'},
}
OPTIMIZER_KEYS = {
    'adam': {'name', 'b1', 'b2', 'eps', 'weight_decay', 'grad_clip_norm'},
    'adam_cycled_b1': {'name', 'b1_range', 'b2', 'eps', 'weight_decay',
                       'grad_clip_norm'},
}
FACTORS = ('constant', 'linear_warmup', 'rsqrt_decay', 'rsqrt_normalized_decay',
           'decay_every', 'cosine_decay')


def check_keys(section: str, cfg: Mapping[str, Any],
               allowed: Mapping[str, set[str]]) -> None:
  """Raises ValueError unless `cfg` has exactly the keys of its `name`."""
  name = cfg.get('name')
  if name not in allowed:
    raise ValueError(f'config.{section}.name={name!r} is not one of '
                     f'{sorted(allowed)}.')
  keys = set(cfg.keys())
  missing, extra = allowed[name] - keys, keys - allowed[name]
  if missing or extra:
    raise ValueError(
        f'config.{section} (name={name!r}) must have exactly the keys '
        f'{sorted(allowed[name])}; missing {sorted(missing)}, not used by '
        f'this {section} {sorted(extra)}.')


# Numbers of config.optimizer and config.schedule: (lowest allowed, whether
# the lowest value itself is allowed).
_POSITIVE, _NON_NEGATIVE = (0.0, False), (0.0, True)
_NUMBER_BOUNDS = {
    'eps': _POSITIVE, 'weight_decay': _NON_NEGATIVE,
    'grad_clip_norm': _NON_NEGATIVE, 'base_learning_rate': _POSITIVE,
    'max_learning_rate': _POSITIVE, 'learning_rate': _POSITIVE,
    'warmup_steps': _NON_NEGATIVE, 'decay_factor': _POSITIVE,
    'steps_per_decay': (1.0, True), 'div_factor': _POSITIVE,
    'final_div_factor': _POSITIVE,
}


def check_config(optimizer_cfg: Mapping[str, Any],
                 schedule_cfg: Mapping[str, Any], num_train_steps: int) -> None:
  """Checks config.optimizer and config.schedule: keys, values, and that the
  pair builds (unknown schedule factors, an optimizer that needs another
  schedule). Raises ValueError naming the key."""
  check_keys('optimizer', optimizer_cfg, OPTIMIZER_KEYS)
  check_keys('schedule', schedule_cfg, SCHEDULE_KEYS)
  for section, cfg in (('optimizer', optimizer_cfg),
                       ('schedule', schedule_cfg)):
    for key, value in cfg.items():
      if key not in _NUMBER_BOUNDS:
        continue
      low, inclusive = _NUMBER_BOUNDS[key]
      if not config_lib.is_number(value) or value < low or (
          value == low and not inclusive):
        bound = f'>= {low:g}' if inclusive else f'> {low:g}'
        raise ValueError(f'config.{section}.{key}={value!r} must be a number '
                         f'{bound}.')
  betas = []
  if 'b1' in optimizer_cfg:
    betas.append(('b1', optimizer_cfg['b1']))
  if 'b1_range' in optimizer_cfg:
    b1_range = tuple(optimizer_cfg['b1_range'])
    betas += [('b1_range', b) for b in b1_range]
    if len(b1_range) != 2:
      raise ValueError(f"config.optimizer.b1_range={optimizer_cfg['b1_range']!r}"
                       ' must be a pair (start, middle) of the OneCycle beta1 '
                       'cycle.')
  betas.append(('b2', optimizer_cfg['b2']))
  for key, value in betas:
    if not config_lib.is_number(value) or not 0.0 <= value < 1.0:
      raise ValueError(f'config.optimizer.{key}={value!r} must be in [0, 1).')
  cycle = schedule_cfg.get('steps_per_cycle')
  if cycle is not None and (not config_lib.is_int(cycle) or
                            (cycle < 1 and cycle != -1)):
    raise ValueError(f'config.schedule.steps_per_cycle={cycle!r} must be a '
                     'positive integer or -1 (= num_train_steps).')
  # Builds the optimizer (no parameters).
  create_optimizer(optimizer_cfg, schedule_cfg, num_train_steps)


def create_learning_rate_schedule(cfg: Mapping[str, Any],
                                  num_train_steps: int) -> Schedule:
  """Returns `lr(step)` with `step` the 0-based update index."""
  check_keys('schedule', cfg, SCHEDULE_KEYS)
  name = cfg['name']
  warmup = float(cfg['warmup_steps'])

  if name == 'factors':
    factors = [f.strip() for f in cfg['factors'].split('*')]
    for f in factors:
      if f not in FACTORS:
        raise ValueError(f'Unknown schedule factor {f!r} in '
                         f'config.schedule.factors; valid: {FACTORS}.')
    base = float(cfg['base_learning_rate'])
    cycle = float(cfg['steps_per_cycle'] if cfg['steps_per_cycle'] > 0
                  else num_train_steps)
    decay_factor = float(cfg['decay_factor'])
    steps_per_decay = int(cfg['steps_per_decay'])

    def factor_schedule(step):
      t = jnp.asarray(step, jnp.float32)
      lr = jnp.asarray(1.0, jnp.float32)
      for f in factors:
        if f == 'constant':
          lr = lr * base
        elif f == 'linear_warmup':
          lr = lr * jnp.minimum(1.0, t / max(warmup, 1e-9))
        elif f == 'rsqrt_decay':
          lr = lr / jnp.sqrt(jnp.maximum(t, warmup))
        elif f == 'rsqrt_normalized_decay':
          lr = lr * jnp.sqrt(warmup) / jnp.sqrt(jnp.maximum(t, warmup))
        elif f == 'decay_every':
          lr = lr * decay_factor ** jnp.floor(t / steps_per_decay)
        elif f == 'cosine_decay':
          progress = jnp.maximum(0.0, (t - warmup) / cycle)
          frac = progress - jnp.floor(progress)
          lr = lr * jnp.maximum(0.0, 0.5 * (1.0 + jnp.cos(jnp.pi * frac)))
      return lr
    return factor_schedule

  if name == 'one_cycle':
    return one_cycle_schedules(cfg, num_train_steps)[0]

  # warmup_linear_decay: 0 -> lr over warmup, then linearly to 0 at the end.
  peak = float(cfg['learning_rate'])
  total = float(num_train_steps)

  def warmup_linear_decay(step):
    t = jnp.asarray(step, jnp.float32)
    up = t / max(warmup, 1.0)
    down = jnp.maximum(0.0, (total - t) / max(total - warmup, 1.0))
    return peak * jnp.where(t < warmup, up, down)
  return warmup_linear_decay


def one_cycle_schedules(cfg: Mapping[str, Any], num_train_steps: int,
                        b1_range: tuple[float, float] = (0.95, 0.85)
                        ) -> tuple[Schedule, Schedule]:
  """PyTorch `OneCycleLR` (two phases, linear anneal): lr and beta1.

  Update k uses the value at k. Phase 1 ends at pct_start * total - 1 with
  pct_start = warmup_steps / total (as Xiong et al. set it): lr goes from
  max/div to max while beta1 goes from b1_range[0] to b1_range[1]; phase 2
  ends at total - 1: lr goes to max/(div * final_div), beta1 back.
  """
  max_lr = float(cfg['max_learning_rate'])
  initial = max_lr / float(cfg['div_factor'])
  final = initial / float(cfg['final_div_factor'])
  total = float(num_train_steps)
  end_up = float(cfg['warmup_steps']) - 1.0
  end_down = total - 1.0
  hi_b1, lo_b1 = b1_range

  def interp(step, a_up, b_up, a_down, b_down):
    t = jnp.asarray(step, jnp.float32)
    pct_up = t / max(end_up, 1e-9)
    pct_down = (t - end_up) / max(end_down - end_up, 1e-9)
    # (1 - p) a + p b is exact at both ends in float32, unlike a + (b - a) p.
    up = (1 - pct_up) * a_up + pct_up * b_up
    down = (1 - pct_down) * a_down + pct_down * b_down
    return jnp.where(t <= end_up, up, down)

  return (lambda s: interp(s, initial, max_lr, max_lr, final),
          lambda s: interp(s, hi_b1, lo_b1, lo_b1, hi_b1))


class ScaleByAdamCycledB1State(NamedTuple):
  count: jax.Array
  mu: Any
  nu: Any


def scale_by_adam_cycled_b1(b1_schedule: Schedule, b2: float, eps: float
                            ) -> optax.GradientTransformation:
  """Adam whose beta1 follows a schedule, bias-corrected as PyTorch does.

  PyTorch's Adam uses the current beta1 both in the moment update and in the
  bias correction 1 - beta1**t, which is what OneCycleLR's momentum cycling
  changes.
  """
  def init_fn(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return ScaleByAdamCycledB1State(jnp.zeros([], jnp.int32), zeros,
                                    jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    b1 = b1_schedule(state.count)
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
    t = (state.count + 1).astype(jnp.float32)
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t
    updates = jax.tree.map(
        lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
    return updates, ScaleByAdamCycledB1State(state.count + 1, mu, nu)

  return optax.GradientTransformation(init_fn, update_fn)


def create_optimizer(optimizer_cfg: Mapping[str, Any],
                     schedule_cfg: Mapping[str, Any], num_train_steps: int
                     ) -> tuple[optax.GradientTransformation, Schedule]:
  """Returns (optimizer, lr schedule) for `config.optimizer`/`config.schedule`.

  Weight decay is decoupled, multiplied by the learning rate, and applied to
  every parameter (LRA); PyTorch's AdamW does the same.
  """
  check_keys('optimizer', optimizer_cfg, OPTIMIZER_KEYS)
  schedule = create_learning_rate_schedule(schedule_cfg, num_train_steps)
  cfg = optimizer_cfg
  chain = []
  if cfg['grad_clip_norm'] > 0:
    chain.append(optax.clip_by_global_norm(cfg['grad_clip_norm']))
  if cfg['name'] == 'adam':
    chain.append(optax.scale_by_adam(b1=cfg['b1'], b2=cfg['b2'],
                                     eps=cfg['eps']))
  else:
    if schedule_cfg['name'] != 'one_cycle':
      raise ValueError("config.optimizer.name='adam_cycled_b1' cycles beta1 "
                       "with OneCycleLR; set config.schedule.name='one_cycle'.")
    _, b1_schedule = one_cycle_schedules(schedule_cfg, num_train_steps,
                                         tuple(cfg['b1_range']))
    chain.append(scale_by_adam_cycled_b1(b1_schedule, cfg['b2'], cfg['eps']))
  if cfg['weight_decay'] > 0:
    chain.append(optax.add_decayed_weights(cfg['weight_decay']))
  chain.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*chain), schedule
