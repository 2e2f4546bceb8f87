r"""Retrieval base config: the official LRA setup (docs/protocol.md §5.3).

Options (comma-separated): runlocal, spt, xiong, cst (see
configs/listops/base.py).

  python -m lra_msmra.main --config configs/retrieval/transformer.py \
      --config.data_dir=/path/to/prepared --workdir DIR

`data_dir` is the folder written by `python -m lra_msmra.data.prepare` or the
release's `tsv_data` folder; with `data.generate=True` (the `runlocal`
option), tiny mock TSVs in the official format are generated.

The dual encoder of docs/protocol.md §3.2 (fixes P1): one shared encoder per
document, LRA head = position-0 pooling (no CLS token, P2), [u, v], MLP
512-256-2; the `xiong` head = mean pooling, [u, v, u*v, u-v], MLP 128-2. LRA
trains 5000 steps with 8000 warmup steps, so the LR never peaks (P3); kept for
fidelity. LRA reports 57.46% for the Transformer (docs/protocol.md §10.1).
"""

import ml_collections

from lra_msmra import config_lib

OPTIONS = config_lib.OPTIONS


def get_config(arg=None) -> ml_collections.ConfigDict:
  opts = config_lib.parse_arg(arg, OPTIONS)
  c = config_lib.default_config()
  c.task = 'retrieval'
  c.data = ml_collections.ConfigDict()
  c.data.max_length = 4000
  # Zero-pad each document further to this length (0 = max_length).
  c.data.pad_to_length = 0
  # 'examples': reshuffle every epoch (LRA shuffles examples here too);
  # 'batches': LRA's image-pipeline order (P10).
  c.data.shuffle = 'examples'
  # True: mock examples in the task's real format instead of data_dir, for
  # plumbing checks only (`runlocal` sets it); results record them as
  # 'mock' and never list them beside published numbers.
  c.data.generate = False
  # Mock data: generated pairs in the official TSV
  # format, written to <workdir>/data/retrieval.
  c.data.generator = ml_collections.ConfigDict(dict(
      num_train=147086, num_valid=18090, num_test=17437, seed=0))

  m = c.model
  m.num_layers, m.emb_dim, m.num_heads, m.qkv_dim, m.mlp_dim = 4, 128, 4, 128, 512
  m.dropout_rate = m.attention_dropout_rate = 0.1
  m.pooling = 'CLS'
  m.pos_emb = 'sinusoidal'
  m.head_hidden = (512, 256)
  m.dual_interaction = 'concat'

  c.batch_size = c.eval_batch_size = 32
  c.num_train_steps = 5000
  c.eval_every_steps = 100
  c.num_eval_steps = -1
  c.checkpoint_every_steps = 1000
  c.optimizer = config_lib.lra_optimizer(weight_decay=0.1)
  c.schedule = config_lib.factor_schedule(0.05, warmup_steps=8000)

  if 'xiong' in opts:
    config_lib.apply_xiong(c, learning_rate=1e-4, warmup_steps=800,
                           num_train_steps=30000, batch_size=32,
                           eval_every_steps=300, pos_table_len=4096)
  if 'cst' in opts:
    config_lib.apply_cst(c, learning_rate=5e-5, warmup_steps=800,
                         num_train_steps=30000, batch_size=32,
                         eval_every_steps=300)
  if 'runlocal' in opts:
    config_lib.apply_runlocal(c, max_length=256)
    # Mock pairs are learned within a hundred steps: at 300 steps every
    # config of docs/runlocal.md validated at 100% from its first
    # validation (step 100) on. Two validations keep the check; more steps
    # would only lengthen a job meant to take minutes (softmax: 5:23 at
    # 300 steps).
    c.num_train_steps = 200
    c.eval_every_steps = c.checkpoint_every_steps = 100
    c.data.generator = ml_collections.ConfigDict(dict(
        num_train=2000, num_valid=200, num_test=200, seed=0))
    m.head_hidden = (128,) if 'xiong' in opts else (128, 64)
  if 'spt' in opts:
    config_lib.apply_spt(c)
  return c
