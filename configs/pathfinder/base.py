r"""Pathfinder (32x32, hard) base config: official LRA (docs/protocol.md §5.5).

Options (comma-separated): runlocal, spt, xiong, cst (see
configs/listops/base.py).

  python -m lra_msmra.main --config configs/pathfinder/transformer.py \
      --config.data_dir=/path/to/prepared --workdir DIR

`data_dir` is the folder written by `python -m lra_msmra.data.prepare`: from
the release (`--lra_release`) or by our seeded implementation of the
Pathfinder generator with LRA's settings (`--generate_pathfinder`, 200,000
images per set, recorded as generated data); or the release folder holding
pathfinder32/ ... pathfinder256/. With `data.generate=True` (the `runlocal`
option), `data.generator.num_examples` images of the configured set are
generated into the workdir instead (docs/protocol.md §7.3).

`data.difficulty` picks curv_baseline ('easy'), curv_contour_length_9
('intermediate', used by the Combiner paper) or curv_contour_length_14
('hard', LRA's "Path"). MEAN pooling is unmasked as in LRA (P9).
LRA reports 71.40% for the Transformer (docs/protocol.md §10.1).
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
  # Zero-pad the pixel tokens further to this length (0 = none).
  c.data.pad_to_length = 0
  # 'batches': LRA shuffles whole batches (buffer of 2048 batches, P10);
  # 'examples': reshuffle images every epoch (the xiong and cst options).
  c.data.shuffle = 'batches'
  # True: write the images with our seeded implementation of the
  # Pathfinder generator (LRA's settings for this resolution and
  # difficulty) into <workdir>/data/pathfinder instead of reading data_dir.
  # Results record the data as 'generated'.
  c.data.generate = False
  # Images of the generated set (the release has 200,000 per difficulty).
  c.data.generator = ml_collections.ConfigDict(dict(num_examples=200_000,
                                                    seed=0))

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
    c.data.shuffle = 'examples'
  if 'cst' in opts:
    config_lib.apply_cst(c, learning_rate=1e-4, warmup_steps=312,
                         num_train_steps=62400, batch_size=256,
                         eval_every_steps=312)
    c.data.shuffle = 'examples'
  if 'runlocal' in opts:
    config_lib.apply_runlocal(c, max_length=None)
    # Generated curv_baseline images, the easiest set. A job this size
    # checks the pipeline; it does not learn Pathfinder beyond chance
    # (docs/runlocal.md, "Pathfinder and Path-X on generated images").
    c.data.difficulty = 'easy'
    c.data.generator.num_examples = 3000
  if 'spt' in opts:
    config_lib.apply_spt(c, mask_rate=0.5)
  return c
