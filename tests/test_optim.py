"""Schedules and optimizers of the LRA, Xiong et al. and CST protocols."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from lra_msmra import config_lib
from lra_msmra import optim


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
