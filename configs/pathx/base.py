r"""Path-X base config: the official LRA setup (docs/protocol.md §5.6).

Options: runlocal and spt only (neither Xiong et al. nor the CST paper
define Path-X).

  python -m lra_msmra.main --config configs/pathx/transformer.py \
      --config.data_dir=/path/to/prepared --workdir DIR

`data_dir` is the folder written by `python -m lra_msmra.data.prepare`: from
the release (`--lra_release`) or by our seeded implementation of the
Pathfinder generator with LRA's settings (`--generate_pathfinder`, 200,000
images per set, recorded as generated data); or the release folder holding
pathfinder32/ ... pathfinder256/. With `data.generate=True` (the `runlocal`
option), `data.generator.num_examples` images of the configured set are
generated into the workdir instead (docs/protocol.md §7.3).

16384 tokens per image; every model of the LRA paper FAILs (chance level).
Full softmax attention at this length needs a large accelerator.
"""

import ml_collections

from lra_msmra import config_lib

OPTIONS = ('runlocal', 'spt')


def get_config(arg=None) -> ml_collections.ConfigDict:
  opts = config_lib.parse_arg(arg, OPTIONS)
  c = config_lib.default_config()
  c.task = 'pathx'
  c.data = ml_collections.ConfigDict()
  c.data.resolution = 128
  c.data.difficulty = 'hard'
  # Zero-pad the pixel tokens further to this length (0 = none).
  c.data.pad_to_length = 0
  # 'batches': LRA shuffles whole batches (buffer of 2048 batches, P10);
  # 'examples': reshuffle images every epoch.
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
    # 16384 tokens per image do not fit a CPU run: runlocal uses 32x32
    # images (generated, or the pathfinder32 folder of data_dir), of
    # curv_baseline as Pathfinder's runlocal job.
    c.data.resolution = 32
    c.data.difficulty = 'easy'
    c.data.generator.num_examples = 3000
  if 'spt' in opts:
    config_lib.apply_spt(c, mask_rate=0.5)
  return c
