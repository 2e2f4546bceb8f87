r"""Path-X (Pathfinder 128x128, hard) base config: official LRA (PROTOCOL §5.6).

Options: runlocal only (neither Xiong et al. nor the CST paper define Path-X).

  python -m lra_msmra.main --config configs/pathx/transformer.py \
      --config.data_dir=/path/to/lra_release --workdir DIR

16384 tokens per image; every model of the LRA paper FAILs (chance level).
Full softmax attention at this length needs a large accelerator.
"""

import ml_collections

from lra_msmra import config_lib

OPTIONS = ('runlocal',)


def get_config(arg=None) -> ml_collections.ConfigDict:
  opts = config_lib.parse_arg(arg, OPTIONS)
  c = config_lib.default_config()
  c.task = 'pathx'
  c.data = ml_collections.ConfigDict()
  c.data.resolution = 128
  c.data.difficulty = 'hard'

  m = c.model
  m.num_layers, m.emb_dim, m.num_heads, m.qkv_dim, m.mlp_dim = 1, 32, 2, 16, 32
  m.dropout_rate = m.attention_dropout_rate = 0.1
  m.pooling = 'MEAN'
  m.pos_emb = 'learned'
  m.head_hidden = (32,)

  c.batch_size = c.eval_batch_size = 64
  c.num_train_steps = 500000
  c.eval_every_steps = 2500
  c.num_eval_steps = -1
  c.checkpoint_every_steps = 2500
  c.optimizer = config_lib.lra_optimizer(weight_decay=0.0, grad_clip_norm=1.0)
  c.schedule = config_lib.factor_schedule(
      1e-3, warmup_steps=2500, factors='constant*linear_warmup*cosine_decay')

  if 'runlocal' in opts:
    config_lib.apply_runlocal(c, max_length=None)
  return c
