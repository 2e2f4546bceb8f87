r"""Pathfinder (32x32, hard) base config: official LRA (PROTOCOL §5.5).

Options (comma-separated): runlocal, xiong, cst (see configs/listops/base.py).

  python -m lra_msmra.main --config configs/pathfinder/transformer.py \
      --config.data_dir=/path/to/lra_release --workdir DIR

`data.difficulty` picks curv_baseline ('easy'), curv_contour_length_9
('intermediate', used by the Combiner paper) or curv_contour_length_14
('hard', LRA's "Path"). MEAN pooling is unmasked as in LRA (P9).
LRA reports 71.40% for the Transformer (PROTOCOL §10.1).
"""

import ml_collections

from lra_msmra import config_lib

OPTIONS = config_lib.OPTIONS


def get_config(arg=None) -> ml_collections.ConfigDict:
  opts = config_lib.parse_arg(arg, OPTIONS)
  c = config_lib.default_config()
  c.task = 'pathfinder'
  c.data = ml_collections.ConfigDict()
  c.data.resolution = 32
  c.data.difficulty = 'hard'

  m = c.model
  m.num_layers, m.emb_dim, m.num_heads, m.qkv_dim, m.mlp_dim = 4, 32, 4, 16, 32
  m.dropout_rate, m.attention_dropout_rate = 0.2, 0.1
  m.pooling = 'MEAN'
  m.pos_emb = 'sinusoidal'
  m.head_hidden = (32,)

  c.batch_size = c.eval_batch_size = 512
  c.num_train_steps = 62400  # 200 epochs of 160000 // 512 = 312 steps.
  c.eval_every_steps = 312
  c.num_eval_steps = -1
  c.checkpoint_every_steps = 3120
  c.optimizer = config_lib.lra_optimizer(weight_decay=0.0)
  c.schedule = config_lib.factor_schedule(
      1e-3, warmup_steps=312, factors='constant*linear_warmup*cosine_decay')

  if 'xiong' in opts:
    config_lib.apply_xiong(c, learning_rate=1e-4, warmup_steps=312,
                           num_train_steps=62400, batch_size=256,
                           eval_every_steps=312, pos_table_len=1024)
  if 'cst' in opts:
    config_lib.apply_cst(c, learning_rate=1e-4, warmup_steps=312,
                         num_train_steps=62400, batch_size=256,
                         eval_every_steps=312)
  if 'runlocal' in opts:
    config_lib.apply_runlocal(c, max_length=None)
  return c
