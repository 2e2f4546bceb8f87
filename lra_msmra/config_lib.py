"""The one config shape shared by every task, protocol presets and validation.

Config files live in `configs/<task>/` and expose `get_config(arg)`, where
`arg` is a comma-separated list of options after the file name:
`configs/listops/transformer.py:xiong,runlocal`. Options:

* `runlocal`: a tiny model and data for a CPU run of a few minutes.
* `xiong`: the PyTorch protocol of Xiong et al. (Nyströmformer),
  docs/protocol.md §8.
* `cst`: the re-tuned protocol of the CST paper, docs/protocol.md §9.1.
* `spt`: self-pretraining on the task's own inputs (masked tokens), the
  first of the two runs of docs/pretraining.md; the second fine-tunes the
  same config without `spt` from it (`--config.init_from=WORKDIR`).

Without a protocol option a config is the official LRA one (docs/protocol.md
§5).

Shape of a config (batch sizes are global, across all devices and hosts)::

  task, protocol, data_dir, data.*        what to train on
  model.*                                 encoder, attention and head
  seed, batch_size, eval_batch_size,      training loop
  num_train_steps, grad_accum_steps,
  eval_every_steps, num_eval_steps, log_every_steps,
  checkpoint_every_steps, max_checkpoints_to_keep
  optimizer.*, schedule.*                 see lra_msmra.optim
  objective, masking.*, init_from         self-pretraining and fine-tuning
                                          (lra_msmra.objectives)
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Iterable, Mapping

import ml_collections

PROTOCOLS = ('lra', 'xiong', 'cst')
# The six LRA tasks (configs/<task>/); the first five make the LRA average.
TASKS = ('listops', 'text', 'retrieval', 'image', 'pathfinder', 'pathx')
# Mechanism names that stand for a config file of another name.
CONFIG_ALIASES = {'softmax': 'transformer', 'combiner': 'combiner_fixed'}
OPTIONS = ('runlocal', 'spt') + PROTOCOLS[1:]
# The masked objective's default: share of real tokens masked (BERT's),
# in runs of `span` tokens.
MASKING = {'rate': 0.15, 'span': 1}
DTYPES = ('float32', 'bfloat16')


def parse_arg(arg: str | None, allowed: Iterable[str] = OPTIONS) -> set[str]:
  """Splits a config-file argument into options, rejecting unknown ones."""
  allowed = tuple(allowed)
  opts = {a.strip() for a in (arg or '').split(',') if a.strip()}
  unknown = opts - set(allowed)
  if unknown:
    raise ValueError(f'Unknown config option(s) {sorted(unknown)}; valid: '
                     f'{list(allowed)} (comma-separated, e.g. '
                     '"configs/listops/transformer.py:xiong,runlocal").')
  if len(opts & set(PROTOCOLS)) > 1:
    raise ValueError(f'Choose at most one protocol of {PROTOCOLS[1:]}.')
  return opts


def load_sibling(file: str, name: str):
  """Imports `name`.py from the folder of config file `file`.

  Config files are loaded by path, not as a package, so a mechanism config
  reaches its task's `base.py` this way, and the settings its mechanism
  shares across tasks with a relative path such as `'../common/cst'`
  (configs/common/).
  """
  path = os.path.normpath(os.path.join(
      os.path.dirname(os.path.abspath(file)), name + '.py'))
  spec = importlib.util.spec_from_file_location(
      f'lra_msmra_config_{abs(hash(path))}_{os.path.basename(name)}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def attention_kw(knobs: Mapping[str, Any] = ()) -> ml_collections.ConfigDict:
  """`config.model.attention_kw` holding a mechanism's `knobs` plus the key
  every config has, `implementation` (`'xla'`, `lra_msmra.kernels`), so that
  `--config.model.attention_kw.implementation=...` can override it."""
  return ml_collections.ConfigDict(dict(knobs, implementation='xla'))


def default_config() -> ml_collections.ConfigDict:
  """All keys every task config has, with the LRA encoder defaults."""
  c = ml_collections.ConfigDict()
  c.task = ''
  # Which protocol the numbers are comparable with: 'lra', 'xiong' or 'cst'.
  # It also picks the headline test number of results.json: the final
  # checkpoint for 'lra', the best-validation checkpoint otherwise.
  c.protocol = 'lra'
  # Folder of the task's data files (see README, Data). Without it a config
  # must ask for generated or mock data by name: data.generate=True.
  c.data_dir = ''
  # Task-specific input options, validated by the task's data module.
  c.data = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict()
  m = c.model
  m.attention = 'softmax'
  # Passed unchanged to the attention constructor: unknown keys fail.
  # `implementation` is how the layer is computed (lra_msmra.kernels).
  m.attention_kw = attention_kw()
  m.num_layers = 4
  m.emb_dim = 512
  m.num_heads = 8
  m.qkv_dim = 512
  m.mlp_dim = 1024
  m.dropout_rate = 0.1
  m.attention_dropout_rate = 0.1
  # 'CLS', 'MEAN' (unmasked, as LRA), 'MASKED_MEAN', 'SUM' or 'FLATTEN'.
  m.pooling = 'CLS'
  # Zero padded positions of the final output before pooling (Xiong et al.).
  m.zero_padded_outputs = False
  # 'sinusoidal', 'learned' or 'none' (for mechanisms with own positions).
  m.pos_emb = 'sinusoidal'
  m.emb_init_std = 1.0
  m.layer_norm_eps = 1e-6
  # JAX's default GELU is the tanh approximation (LRA); PyTorch's is exact.
  m.gelu_approximate = True
  m.attention_bias = False
  # 'lra' (Xavier kernels) or 'torch' (nn.Linear defaults), see models.py.
  m.init_style = 'lra'
  # Padding mask = (id > 0), for pixels too, as LRA does (P8).
  m.mask_padding = True
  m.causal = False
  # Hidden sizes of the classifier MLP. LRA uses one layer of mlp_dim; the
  # value is set explicitly and does not follow an override of mlp_dim
  # (override both to keep them equal).
  m.head_hidden = (1024,)
  # Retrieval only: 'concat' [u, v] (LRA) or 'nli' [u, v, u*v, u-v].
  m.dual_interaction = 'concat'
  # Activation dtype; parameters and softmax stay float32.
  m.dtype = 'float32'

  c.seed = 0
  c.batch_size = 32
  c.eval_batch_size = 32
  c.num_train_steps = 5000
  # Split each step's batch into this many micro-batches (same gradients).
  c.grad_accum_steps = 1
  c.eval_every_steps = 50
  # Validation batches per evaluation; -1 = the whole split.
  c.num_eval_steps = -1
  c.log_every_steps = 50
  c.checkpoint_every_steps = 1000
  c.max_checkpoints_to_keep = 2

  c.optimizer = lra_optimizer(weight_decay=0.1)
  c.schedule = factor_schedule(0.05, 1000)

  # What the run trains for (lra_msmra.objectives): 'classify' (the labels),
  # or self-pretraining on the task's inputs, 'masked' or 'causal'.
  c.objective = 'classify'
  # The masked objective: share of real tokens masked, in runs of `span`.
  c.masking = ml_collections.ConfigDict(MASKING)
  # Workdir of a finished run whose encoder this run starts from (its
  # latest checkpoint); the classifier head and optimizer state are new.
  c.init_from = ''
  return c


def apply_spt(c: ml_collections.ConfigDict, *,
              mask_rate: float = MASKING['rate']) -> None:
  """The `spt` option: self-pretraining with the masked objective on the
  task's own training inputs (Amos et al., docs/pretraining.md), for as
  many steps and with the same optimizer and schedule as the task's
  training. Fine-tuning is the same config without `spt`, with
  `--config.init_from=` this run's workdir.

  Args:
    c: config to modify in place (after `apply_runlocal`).
    mask_rate: share of real tokens masked: 0.15 for text-like tasks (BERT),
      0.5 for pixels (Amos et al.'s LRA image setting).
  """
  c.objective = 'masked'
  c.masking.rate = mask_rate


def lra_optimizer(weight_decay: float, grad_clip_norm: float = 0.0
                  ) -> ml_collections.ConfigDict:
  """Adam(0.9, 0.98, 1e-9) with LR-scaled decoupled weight decay.

  See docs/protocol.md §4.1.
  """
  return ml_collections.ConfigDict(dict(
      name='adam', b1=0.9, b2=0.98, eps=1e-9, weight_decay=weight_decay,
      grad_clip_norm=grad_clip_norm))


def factor_schedule(base_learning_rate: float, warmup_steps: int,
                    factors: str = 'constant*linear_warmup*rsqrt_decay'
                    ) -> ml_collections.ConfigDict:
  """LRA factor schedule (docs/protocol.md §4.2).

  steps_per_cycle -1 stands for num_train_steps.
  """
  return ml_collections.ConfigDict(dict(
      name='factors', factors=factors, base_learning_rate=base_learning_rate,
      warmup_steps=warmup_steps, steps_per_cycle=-1, decay_factor=0.5,
      steps_per_decay=20000))


def apply_xiong(c: ml_collections.ConfigDict, *, learning_rate: float,
                warmup_steps: int, num_train_steps: int, batch_size: int,
                eval_every_steps: int, pos_table_len: int) -> None:
  """Model, optimizer and schedule of Xiong et al. (docs/protocol.md §8).

  Args:
    c: config to modify in place.
    learning_rate: OneCycle max learning rate.
    warmup_steps: steps of the rising phase.
    num_train_steps: total steps.
    batch_size: global batch size.
    eval_every_steps: evaluation period.
    pos_table_len: inputs are zero-padded to this length (the power of two
      the PyTorch code uses for its position table).
  """
  c.protocol = 'xiong'
  m = c.model
  m.num_layers, m.emb_dim, m.qkv_dim, m.num_heads, m.mlp_dim = 2, 64, 64, 2, 128
  m.dropout_rate = m.attention_dropout_rate = 0.1
  m.pooling = 'MEAN'
  m.zero_padded_outputs = True
  m.pos_emb = 'learned'
  m.emb_init_std = 0.02
  m.layer_norm_eps = 1e-5
  m.gelu_approximate = False
  m.attention_bias = True
  m.init_style = 'torch'
  m.head_hidden = (128,)
  m.dual_interaction = 'nli'
  c.data.pad_to_length = pos_table_len
  c.batch_size = c.eval_batch_size = batch_size
  c.num_train_steps = num_train_steps
  c.eval_every_steps = eval_every_steps
  c.optimizer = ml_collections.ConfigDict(dict(
      name='adam_cycled_b1', b1_range=(0.95, 0.85), b2=0.999, eps=1e-6,
      weight_decay=0.0, grad_clip_norm=0.0))
  c.schedule = ml_collections.ConfigDict(dict(
      name='one_cycle', max_learning_rate=learning_rate,
      warmup_steps=warmup_steps, div_factor=25.0, final_div_factor=1e4))


def apply_cst(c: ml_collections.ConfigDict, *, learning_rate: float,
              warmup_steps: int, num_train_steps: int, batch_size: int,
              eval_every_steps: int) -> None:
  """The CST paper's protocol (docs/protocol.md §9.1, CST Table 6).

  2 pre-LN layers, D = 256, FFN 1024, 4 heads, dropout 0.1, mean pooling
  over real tokens, FC(1024)-ReLU-FC head, AdamW with linear warmup and linear
  decay, no weight decay; the best-validation checkpoint is reported.
  """
  c.protocol = 'cst'
  m = c.model
  m.num_layers, m.emb_dim, m.qkv_dim, m.num_heads, m.mlp_dim = 2, 256, 256, 4, 1024
  m.dropout_rate = m.attention_dropout_rate = 0.1
  m.pooling = 'MASKED_MEAN'
  m.pos_emb = 'learned'
  m.emb_init_std = 0.02
  m.head_hidden = (1024,)
  m.dual_interaction = 'nli'
  c.batch_size = c.eval_batch_size = batch_size
  c.num_train_steps = num_train_steps
  c.eval_every_steps = eval_every_steps
  c.optimizer = ml_collections.ConfigDict(dict(
      name='adam', b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
      grad_clip_norm=0.0))
  c.schedule = ml_collections.ConfigDict(dict(
      name='warmup_linear_decay', learning_rate=learning_rate,
      warmup_steps=warmup_steps))


def apply_runlocal(c: ml_collections.ConfigDict, *,
                   max_length: int | None) -> None:
  """Shrinks a config to a CPU run of a few minutes (the `runlocal` option).

  Keeps the protocol's optimizer and schedule family but shortens training;
  the task's base config sets its small generated or mock data.

  Args:
    c: config to modify in place.
    max_length: new `data.max_length` for text-like tasks (None: keep the
      task's length, e.g. images, and use a lighter model and batch).
  """
  # Generated (ListOps) or mock (other tasks) data, see the task's base.py.
  c.data.generate = True
  if max_length is not None:
    c.data.max_length = max_length
    if c.data.get('pad_to_length'):
      # Keep padding to a power of two as the Xiong et al. data does.
      c.data.pad_to_length = 1 << (max_length - 1).bit_length()
  m = c.model
  m.num_layers, m.emb_dim, m.num_heads, m.qkv_dim, m.mlp_dim = 2, 64, 4, 64, 128
  m.head_hidden = (128,)
  c.batch_size = c.eval_batch_size = 32
  c.num_train_steps = 1000
  c.eval_every_steps = 250
  c.log_every_steps = 50
  c.checkpoint_every_steps = 250
  if max_length is None:
    # Pixel tasks keep their 1024 tokens: a lighter model and batch keep a
    # CPU step well under a second.
    m.num_layers, m.num_heads = 1, 2
    c.batch_size, c.eval_batch_size = 8, 32
    c.num_train_steps = 300
    c.eval_every_steps = c.checkpoint_every_steps = 100
  s = c.schedule
  s.warmup_steps = 200 if max_length is not None else 50
  if s.name == 'one_cycle':
    s.max_learning_rate = 1e-3
  elif s.name == 'warmup_linear_decay':
    s.learning_rate = 1e-3


_POSITIVE_INTS = ('batch_size', 'eval_batch_size', 'num_train_steps',
                  'grad_accum_steps', 'eval_every_steps', 'log_every_steps',
                  'checkpoint_every_steps', 'max_checkpoints_to_keep')


def is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check(config: ml_collections.ConfigDict) -> None:
  """Checks the shape of a config and its top-level values.

  The keys of the config and of `config.model` must be exactly those of
  `default_config()` (a key that would be ignored is an error), and the
  top-level values (task, protocol, data folder, loop sizes, seed) must be
  valid. The sections have owners that check them: `lra_msmra.models`
  (config.model and the attention's knobs), `lra_msmra.optim`
  (config.optimizer and config.schedule) and the task's data module
  (config.data); `lra_msmra.validation.validate` runs all of them. This
  module imports nothing from the package.

  Raises:
    ValueError: naming the config key and the fix.
  """
  expected = set(default_config().keys())
  keys = set(config.keys())
  if keys != expected:
    raise ValueError(f'Config keys differ from the shared shape: unknown '
                     f'{sorted(keys - expected)}, missing '
                     f'{sorted(expected - keys)} (see lra_msmra/config_lib.py).')
  model_keys = set(default_config().model.keys())
  if set(config.model.keys()) != model_keys:
    raise ValueError(
        f'config.model keys: unknown {sorted(set(config.model.keys()) - model_keys)}'
        f', missing {sorted(model_keys - set(config.model.keys()))}.')
  if config.task not in TASKS:
    raise ValueError(f'config.task={config.task!r}; valid: {list(TASKS)}.')
  if config.protocol not in PROTOCOLS:
    raise ValueError(f'config.protocol={config.protocol!r}; valid: {PROTOCOLS}.')
  if not isinstance(config.data_dir, str):
    raise ValueError(f'config.data_dir={config.data_dir!r} must be a string '
                     "(a folder, or '' with data.generate=True).")
  for key in _POSITIVE_INTS:
    value = config[key]
    if not is_int(value) or value < 1:
      raise ValueError(f'config.{key}={value!r} must be a positive integer.')
  if not is_int(config.seed) or config.seed < 0:
    raise ValueError(f'config.seed={config.seed!r} must be a non-negative '
                     'integer (it seeds the data order and the model).')
  if not is_int(config.num_eval_steps) or (
      config.num_eval_steps < 1 and config.num_eval_steps != -1):
    raise ValueError(f'config.num_eval_steps={config.num_eval_steps!r} must '
                     'be a positive integer or -1 (whole split).')
  if config.batch_size % config.grad_accum_steps:
    raise ValueError(
        f'config.batch_size={config.batch_size} is not divisible by '
        f'config.grad_accum_steps={config.grad_accum_steps}; pick a divisor.')
