"""Schedules and optimizers of the LRA, Xiong et al. and CST protocols."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from lra_msmra import config_lib
from lra_msmra import optim
from tests import helpers


def lr_at(schedule_cfg, steps, total=5000):
  s = optim.create_learning_rate_schedule(schedule_cfg, total)
  return np.array([float(s(t)) for t in steps])


def test_lra_rsqrt_schedule_values_from_protocol():
  # docs/protocol.md §4.2: ListOps lr 0 first, peak 1.581e-3 at 1000, 7.07e-4
  # at 5000.
  v = lr_at(config_lib.factor_schedule(0.05, 1000), [0, 500, 1000, 5000])
  np.testing.assert_allclose(v, [0, 0.05 * 0.5 / np.sqrt(1000), 1.581e-3,
                                 7.07e-4], rtol=1e-3)
  text = lr_at(config_lib.factor_schedule(0.05, 8000), [8000, 20000])
  np.testing.assert_allclose(text, [5.59e-4, 3.54e-4], rtol=2e-3)
  retrieval = lr_at(config_lib.factor_schedule(0.05, 8000), [4999])
  np.testing.assert_allclose(retrieval, [3.49e-4], rtol=2e-3)


def test_lra_cosine_schedule():
  cfg = config_lib.factor_schedule(5e-4, 175,
                                   'constant*linear_warmup*cosine_decay')
  v = lr_at(cfg, [0, 175, 175 + 17500, 34999], total=35000)
  assert v[0] == 0 and abs(v[1] - 5e-4) < 1e-9
  np.testing.assert_allclose(v[2], 5e-4 * 0.5 * (1 + np.cos(np.pi * 0.5)),
                             rtol=1e-5)
  assert v[3] < 1e-7


def test_other_factors():
  cfg = config_lib.factor_schedule(2.0, 100, 'constant*rsqrt_normalized_decay')
  np.testing.assert_allclose(lr_at(cfg, [50, 400]), [2.0, 1.0], rtol=1e-6)
  cfg = config_lib.factor_schedule(1.0, 0, 'constant*decay_every')
  cfg.steps_per_decay = 10
  np.testing.assert_allclose(lr_at(cfg, [9, 10, 25]), [1.0, 0.5, 0.25])
  cfg.factors = 'constant*bogus'
  with pytest.raises(ValueError, match='bogus'):
    lr_at(cfg, [0])


def xiong_cfg(total=100, warmup=20, lr=1e-3):
  c = config_lib.default_config()
  config_lib.apply_xiong(c, learning_rate=lr, warmup_steps=warmup,
                         num_train_steps=total, batch_size=8,
                         eval_every_steps=10, pos_table_len=8)
  return c


def test_one_cycle_matches_pytorch_formula():
  c = xiong_cfg()
  lr, b1 = optim.one_cycle_schedules(c.schedule, 100)
  # PyTorch OneCycleLR: phase 1 ends at pct_start*total - 1 = 19.
  np.testing.assert_allclose(
      [float(lr(0)), float(lr(19)), float(lr(99))],
      [1e-3 / 25, 1e-3, 1e-3 / 25 / 1e4], rtol=1e-5)
  np.testing.assert_allclose(float(lr(9)), 4e-5 + (1e-3 - 4e-5) * 9 / 19,
                             rtol=1e-5)
  np.testing.assert_allclose(float(lr(59)),
                             1e-3 + (4e-9 - 1e-3) * 40 / 80, rtol=1e-5)
  np.testing.assert_allclose([float(b1(0)), float(b1(19)), float(b1(99))],
                             [0.95, 0.85, 0.95], rtol=1e-6)


def test_lra_adam_update_by_hand():
  opt_cfg = config_lib.lra_optimizer(weight_decay=0.1)
  sched = config_lib.factor_schedule(1.0, 0, 'constant')
  tx, _ = optim.create_optimizer(opt_cfg, sched, 10)
  p = {'w': jnp.array([1.0, -2.0])}
  g = {'w': jnp.array([0.5, 0.25])}
  state = tx.init(p)
  upd, state = tx.update(g, state, p)
  m = 0.1 * g['w'] / (1 - 0.9)
  v = 0.02 * g['w'] ** 2 / (1 - 0.98)
  expected = -(m / (jnp.sqrt(v) + 1e-9) + 0.1 * p['w'])
  np.testing.assert_allclose(upd['w'], expected, rtol=1e-6)


def test_cycled_b1_adam_equals_plain_adam_when_b1_is_constant():
  sched = lambda t: jnp.float32(0.9)
  tx = optim.scale_by_adam_cycled_b1(sched, 0.999, 1e-6)
  ref = optax.scale_by_adam(0.9, 0.999, 1e-6)
  p = {'w': jnp.array([1.0, 2.0, 3.0])}
  s, r = tx.init(p), ref.init(p)
  for i in range(3):
    g = {'w': jnp.array([0.1, -0.2, 0.3]) * (i + 1)}
    u, s = tx.update(g, s)
    ur, r = ref.update(g, r)
    np.testing.assert_allclose(u['w'], ur['w'], rtol=1e-5)


def test_clipping_and_key_checks():
  opt_cfg = config_lib.lra_optimizer(weight_decay=0.0, grad_clip_norm=1.0)
  tx, _ = optim.create_optimizer(opt_cfg, config_lib.factor_schedule(1., 0,
                                                                    'constant'),
                                 10)
  assert tx is not None
  bad = config_lib.lra_optimizer(weight_decay=0.0)
  bad.momentum = 0.9
  with pytest.raises(ValueError, match='momentum'):
    optim.create_optimizer(bad, config_lib.factor_schedule(1., 0), 10)
  c = xiong_cfg()
  with pytest.raises(ValueError, match='one_cycle'):
    optim.create_optimizer(c.optimizer, config_lib.factor_schedule(1., 0), 10)


def test_warmup_linear_decay():
  cfg = ml_collections.ConfigDict(dict(name='warmup_linear_decay',
                                       learning_rate=1.0, warmup_steps=10))
  np.testing.assert_allclose(lr_at(cfg, [0, 5, 10, 55, 100], total=100),
                             [0, 0.5, 1.0, 0.5, 0.0], rtol=1e-6)


# Xiong et al. against PyTorch's own AdamW + OneCycleLR, step by step.
XIONG_TOTAL, XIONG_WARMUP, XIONG_LR = 200, 40, 1e-3
XIONG_P0 = {'b': np.array([-0.7, 0.1, 1.1, -2.0], np.float32),
            'w': np.array([[0.5, -1.2], [2.0, -0.3], [0.8, 1.5]], np.float32)}


def xiong_grad(params, k):
  """Gradient at update k: depends on the current parameters (so an error
  compounds) and oscillates with k (so momentum, hence beta1, matters)."""
  centre = {'b': np.float32(0.3), 'w': np.float32(-0.4)}
  return {n: ((p - centre[n]) + np.sin(np.float32(5) * p +
                                       np.float32(0.7 * k))).astype(np.float32)
          for n, p in params.items()}


def torch_xiong_trajectory(torch):
  """Xiong et al.'s training loop: params after each step, and the lr and
  beta1 that each step used."""
  params = {n: torch.nn.Parameter(torch.tensor(v)) for n, v in XIONG_P0.items()}
  opt = torch.optim.AdamW(list(params.values()), lr=XIONG_LR,
                          betas=(0.9, 0.999), eps=1e-6, weight_decay=0)
  sched = torch.optim.lr_scheduler.OneCycleLR(
      opt, max_lr=XIONG_LR, pct_start=XIONG_WARMUP / XIONG_TOTAL,
      anneal_strategy='linear', total_steps=XIONG_TOTAL)
  traj, lrs, b1s = [], [], []
  for k in range(XIONG_TOTAL):
    g = xiong_grad({n: p.detach().numpy() for n, p in params.items()}, k)
    for n, p in params.items():
      p.grad = torch.from_numpy(g[n])
    lrs.append(opt.param_groups[0]['lr'])
    b1s.append(opt.param_groups[0]['betas'][0])
    opt.step()
    sched.step()
    traj.append({n: p.detach().numpy().copy() for n, p in params.items()})
  return traj, np.array(lrs), np.array(b1s)


def optax_trajectory(tx):
  params = {n: jnp.asarray(v) for n, v in XIONG_P0.items()}
  state, update = tx.init(params), jax.jit(tx.update)
  traj = []
  for k in range(XIONG_TOTAL):
    g = xiong_grad({n: np.asarray(p) for n, p in params.items()}, k)
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
    traj.append({n: np.asarray(p) for n, p in params.items()})
  return traj


def max_rel_diff(traj, ref):
  return max(float(np.max(np.abs(t[n] - r[n]) / np.abs(r[n])))
             for t, r in zip(traj, ref, strict=True) for n in r)


def scale_by_adam_textbook_bias_correction(b1_schedule, b2, eps):
  """Adam with a cycled beta1 but the bias correction 1 - prod(beta1_i) of
  the time-varying-beta1 analysis instead of PyTorch's 1 - beta1_t**t."""
  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return jnp.zeros([], jnp.int32), jnp.ones([], jnp.float32), zeros(), zeros()

  def update(g, state, params=None):
    del params
    k, b1_prod, mu, nu = state
    b1 = b1_schedule(k)
    b1_prod = b1_prod * b1
    mu = jax.tree.map(lambda m, x: b1 * m + (1 - b1) * x, mu, g)
    nu = jax.tree.map(lambda v, x: b2 * v + (1 - b2) * x * x, nu, g)
    c2 = 1 - b2 ** (k + 1).astype(jnp.float32)
    u = jax.tree.map(lambda m, v: m / (1 - b1_prod) / (jnp.sqrt(v / c2) + eps),
                     mu, nu)
    return u, (k + 1, b1_prod, mu, nu)
  return optax.GradientTransformation(init, update)


def test_xiong_optimizer_follows_pytorch_adamw_one_cycle():
  torch = pytest.importorskip('torch')
  # The repo's Xiong et al. protocol, shortened to 200 steps (40 rising) at
  # lr 1e-3 so that a step matters.
  c = helpers.load_config('configs/listops/transformer.py', 'xiong')
  c.schedule.max_learning_rate = XIONG_LR
  c.schedule.warmup_steps = XIONG_WARMUP
  # Xiong et al.'s arguments (above) and OneCycleLR's defaults (div_factor
  # 25, final_div_factor 1e4, beta1 from max_momentum 0.95 to base_momentum
  # 0.85 and back), as the config states them.
  assert (c.optimizer.name, tuple(c.optimizer.b1_range), c.optimizer.b2,
          c.optimizer.eps, c.optimizer.weight_decay,
          c.optimizer.grad_clip_norm) == ('adam_cycled_b1', (0.95, 0.85),
                                          0.999, 1e-6, 0.0, 0.0)
  assert (c.schedule.name, c.schedule.div_factor,
          c.schedule.final_div_factor) == ('one_cycle', 25.0, 1e4)
  tx, lr_schedule = optim.create_optimizer(c.optimizer, c.schedule,
                                           XIONG_TOTAL)
  _, b1_schedule = optim.one_cycle_schedules(c.schedule, XIONG_TOTAL,
                                             tuple(c.optimizer.b1_range))

  ref, torch_lr, torch_b1 = torch_xiong_trajectory(torch)
  # Torch really cycles beta1: 0.95 at the first step, 0.85 at the peak.
  assert torch_b1[0] == 0.95 and torch_b1[XIONG_WARMUP - 1] == 0.85

  # Update k (0-based) uses the schedules at k: torch's values before its
  # k-th opt.step(). Ours are float32 (torch's Python floats): lr within 1e-6
  # of the peak lr (the float32 phase fraction is good to ~1 ulp, 1.2e-7;
  # relative to the lr itself that is up to ~1e-5 in the last steps, where
  # the lr nears zero), beta1 within 1e-6.
  steps = jnp.arange(XIONG_TOTAL)
  np.testing.assert_allclose(
      np.asarray(jax.vmap(lr_schedule)(steps)) / XIONG_LR,
      torch_lr / XIONG_LR, rtol=0, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.vmap(b1_schedule)(steps)),
                             torch_b1, rtol=0, atol=1e-6)

  # Parameters after every step. Both sides run in float32 with the same
  # arithmetic up to the order of operations, so they differ by rounding
  # (about 12 float32 epsilons, 1.4e-6, measured over these 200 steps);
  # 1e-5 (84 epsilons) leaves room for it and is 100x below the smallest
  # deviation of the wrong optimizers below. |params| stays above 0.09.
  rtol = 1e-5
  ours = optax_trajectory(tx)
  for k, (t, r) in enumerate(zip(ours, ref, strict=True)):
    for n in r:
      np.testing.assert_allclose(t[n], r[n], rtol=rtol, atol=0,
                                 err_msg=f'{n} after update {k}')

  # The comparison sees beta1's cycle, its use in the bias correction and
  # the step index: each of these wrong optimizers leaves the trajectory by
  # more than 10x the tolerance (measured: 4e-3, 2.7e-3, 1.6e-3).
  wrong = {
      'constant beta1 0.9 (optax.adamw)': optax.adamw(
          lr_schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0),
      'bias correction 1 - prod(beta1)': optax.chain(
          scale_by_adam_textbook_bias_correction(b1_schedule, 0.999, 1e-6),
          optax.scale_by_learning_rate(lr_schedule)),
      'schedules one step early': optax.chain(
          optim.scale_by_adam_cycled_b1(lambda k: b1_schedule(k + 1), 0.999,
                                        1e-6),
          optax.scale_by_learning_rate(lambda k: lr_schedule(k + 1))),
  }
  for name, wrong_tx in wrong.items():
    assert max_rel_diff(optax_trajectory(wrong_tx), ref) > 10 * rtol, name
