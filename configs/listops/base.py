r"""ListOps base config: the official LRA setup (docs/protocol.md §5.1).

Options after the file name (comma-separated):
  runlocal  short generated expressions and a small model: a few minutes on
            a 2-core CPU, no data needed.
  spt       self-pretraining on the task's own inputs (masked tokens);
            fine-tune afterwards with the same config without `spt` and
            --config.init_from=PRETRAINING_WORKDIR (docs/pretraining.md).
  xiong     the PyTorch protocol of Xiong et al. (docs/protocol.md §8).
  cst       the CST paper's re-tuned protocol (docs/protocol.md §9.1).

Official run (one host, any number of devices; batch sizes are global):

  python -m lra_msmra.main --config configs/listops/transformer.py \
      --config.data_dir=/path/to/lra_release/listops-1000 --workdir DIR

LRA reports 36.37% test accuracy for the Transformer (docs/protocol.md §10.1).
"""

import ml_collections

from lra_msmra import config_lib


OPTIONS = config_lib.OPTIONS


def get_config(arg=None) -> ml_collections.ConfigDict:
  opts = config_lib.parse_arg(arg, OPTIONS)
  c = config_lib.default_config()
  c.task = 'listops'
  c.data = ml_collections.ConfigDict()
  # File prefix of the TSVs: {task_name}_{train,val,test}.tsv.
  c.data.task_name = 'basic'
  c.data.max_length = 2000
  # Zero-pad inputs further to this length (0 = max_length).
  c.data.pad_to_length = 0
  # True: write the data with our seeded implementation of the LRA
  # generator (settings below: the official ones) instead of reading
  # data_dir. Results record the data as 'generated'.
  c.data.generate = False
  c.data.generator = ml_collections.ConfigDict(dict(
      num_train=96000, num_valid=2000, num_test=2000, min_length=500,
      max_length=2000, max_depth=10, max_args=10, seed=0))

  m = c.model
  m.num_layers, m.emb_dim, m.num_heads, m.qkv_dim, m.mlp_dim = 4, 512, 8, 512, 1024
  m.dropout_rate = m.attention_dropout_rate = 0.1
  m.pooling = 'CLS'
  m.pos_emb = 'sinusoidal'
  m.head_hidden = (1024,)

  c.batch_size = c.eval_batch_size = 32
  c.num_train_steps = 5000
  c.eval_every_steps = 50
  c.num_eval_steps = -1
  c.checkpoint_every_steps = 1000
  c.optimizer = config_lib.lra_optimizer(weight_decay=0.1)
  c.schedule = config_lib.factor_schedule(0.05, warmup_steps=1000)

  if 'xiong' in opts:
    config_lib.apply_xiong(c, learning_rate=1e-4, warmup_steps=1000,
                           num_train_steps=5000, batch_size=32,
                           eval_every_steps=50, pos_table_len=2048)
  if 'cst' in opts:
    config_lib.apply_cst(c, learning_rate=1e-5, warmup_steps=1000,
                         num_train_steps=20000, batch_size=32,
                         eval_every_steps=200)

  if 'runlocal' in opts:
    config_lib.apply_runlocal(c, max_length=100)
    # Short expressions (under 100 tokens, depth <= 4) so that a small model
    # learns beyond the majority class within minutes on a CPU.
    c.data.generator = ml_collections.ConfigDict(dict(
        num_train=6000, num_valid=500, num_test=500, min_length=20,
        max_length=100, max_depth=4, max_args=5, seed=0))
    c.num_train_steps = 1500
  if 'spt' in opts:
    config_lib.apply_spt(c)
  return c
