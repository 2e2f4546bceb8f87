"""Tiny configs shared by the trainer tests."""

import os

from lra_msmra import config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(relpath, arg=None):
  path = os.path.join(ROOT, relpath)
  module = config_lib.load_sibling(path, os.path.basename(path)[:-3])
  return module.get_config(arg)


def tiny_listops_config(**overrides):
  """ListOps runlocal shrunk to seconds: tiny data and model."""
  c = load_config('configs/listops/transformer.py', 'runlocal')
  c.data.max_length = 32
  c.data.generate.update(num_train=64, num_valid=16, num_test=16,
                         min_length=5, max_length=32, max_depth=4, max_args=4)
  m = c.model
  m.num_layers, m.emb_dim, m.num_heads, m.qkv_dim, m.mlp_dim = 1, 16, 2, 16, 16
  m.head_hidden = (16,)
  c.batch_size = c.eval_batch_size = 8
  c.num_train_steps = 4
  c.eval_every_steps = 2
  c.log_every_steps = 2
  c.checkpoint_every_steps = 2
  c.schedule.warmup_steps = 2
  for key, value in overrides.items():
    target = c
    *path, last = key.split('.')
    for p in path:
      target = target[p]
    target[last] = value
  return c
