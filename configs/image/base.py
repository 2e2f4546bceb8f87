r"""Image base config: the official LRA setup (docs/protocol.md §5.4).

Options (comma-separated): runlocal, spt, xiong, cst (see
configs/listops/base.py).

  python -m lra_msmra.main --config configs/image/transformer.py \
      --config.data_dir=/path/to/prepared --workdir DIR

`data_dir` is the folder written by `python -m lra_msmra.data.prepare --tfds
--out /path/to/prepared` (or any TFDS data dir with `cifar10`); with
`data.generate=True` (the `runlocal` option), mock images are split as
TFDS splits them (lra_msmra.data.tfds_io), without TensorFlow.

Pixels (0..255, grayscale exactly as TF's rgb_to_grayscale, P22) are tokens,
row-major, 1024 per image; black pixels count as padding as in LRA (P8,
`model.mask_padding`). LRA evaluates 39 batches of a 5000-image validation
split that only has 19 (P15); we evaluate the whole split.
LRA reports 42.44% for the Transformer (docs/protocol.md §10.1).
"""

import ml_collections

from lra_msmra import config_lib

OPTIONS = config_lib.OPTIONS


def get_config(arg=None) -> ml_collections.ConfigDict:
  opts = config_lib.parse_arg(arg, OPTIONS)
  c = config_lib.default_config()
  c.task = 'image'
  c.data = ml_collections.ConfigDict()
  # Zero-pad the pixel tokens further to this length (0 = none).
  c.data.pad_to_length = 0
  # 'batches': LRA shuffles whole batches of 256 consecutive images (P10);
  # 'examples': reshuffle images every epoch (the xiong and cst options).
  c.data.shuffle = 'batches'
  # True: mock examples in the task's real format instead of data_dir, for
  # plumbing checks only (`runlocal` sets it); results record them as
  # 'mock' and never list them beside published numbers.
  c.data.generate = False
  # Mock data: generated images, split as TFDS splits them, as many
  # as CIFAR-10 has.
  c.data.generator = ml_collections.ConfigDict(dict(
      num_train=50000, num_test=10000, seed=0))

  m = c.model
  m.num_layers, m.emb_dim, m.num_heads, m.qkv_dim, m.mlp_dim = 1, 128, 8, 64, 128
  m.dropout_rate, m.attention_dropout_rate = 0.3, 0.2
  m.pooling = 'CLS'
  m.pos_emb = 'learned'
  m.head_hidden = (128,)

  c.batch_size = c.eval_batch_size = 256
  c.num_train_steps = 35000  # 200 epochs of 45000 // 256 = 175 steps.
  c.eval_every_steps = 175
  c.num_eval_steps = -1
  c.checkpoint_every_steps = 1750
  c.optimizer = config_lib.lra_optimizer(weight_decay=0.0)
  c.schedule = config_lib.factor_schedule(
      5e-4, warmup_steps=175, factors='constant*linear_warmup*cosine_decay')

  if 'xiong' in opts:
    config_lib.apply_xiong(c, learning_rate=1e-4, warmup_steps=175,
                           num_train_steps=35000, batch_size=256,
                           eval_every_steps=175, pos_table_len=1024)
    c.data.shuffle = 'examples'
  if 'cst' in opts:
    config_lib.apply_cst(c, learning_rate=2e-4, warmup_steps=175,
                         num_train_steps=35000, batch_size=256,
                         eval_every_steps=175)
    c.data.shuffle = 'examples'
  if 'runlocal' in opts:
    config_lib.apply_runlocal(c, max_length=None)
    c.data.generator.num_train, c.data.generator.num_test = 2000, 500
  if 'spt' in opts:
    config_lib.apply_spt(c, mask_rate=0.5)
  return c
