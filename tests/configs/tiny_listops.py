"""ListOps shrunk to seconds, for tests that run the command line."""

from lra_msmra import config_lib

base = config_lib.load_sibling(
    __file__, '../../configs/listops/transformer')


def get_config(arg=None):
  c = base.get_config('runlocal')
  c.data.max_length = 32
  c.data.generator.update(num_train=64, num_valid=16, num_test=16,
                         min_length=5, max_length=32, max_depth=4, max_args=4)
  m = c.model
  m.num_layers, m.emb_dim, m.num_heads, m.qkv_dim, m.mlp_dim = 1, 16, 2, 16, 16
  m.head_hidden = (16,)
  c.batch_size = c.eval_batch_size = 8
  c.num_train_steps = int(arg) if arg else 4
  c.eval_every_steps = 2
  c.log_every_steps = 2
  c.checkpoint_every_steps = 2
  c.schedule.warmup_steps = 2
  return c
