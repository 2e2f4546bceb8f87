"""The one config shape shared by every task, protocol presets and validation.

Config files live in `configs/<task>/` and expose `get_config(arg)`, where
`arg` is a comma-separated list of options after the file name:
`configs/listops/transformer.py:xiong,runlocal`. Options:

* `runlocal`: a tiny model and data for a CPU run of a few minutes.
* `xiong`: the PyTorch protocol of Xiong et al. (Nyströmformer),
  docs/protocol.md §8.
* `cst`: the re-tuned protocol of the CST paper, docs/protocol.md §9.1.

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
OPTIONS = ('runlocal',) + PROTOCOLS[1:]
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
  m.attention_kw = ml_collections.ConfigDict()
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
  return c


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


_MODEL_CHOICES = {
    'pooling': ('CLS', 'MEAN', 'MASKED_MEAN', 'SUM', 'FLATTEN'),
    'pos_emb': ('sinusoidal', 'learned', 'none'),
    'init_style': ('lra', 'torch'),
    'dual_interaction': ('concat', 'nli'),
    'dtype': DTYPES,
}
_POSITIVE_INTS = ('batch_size', 'eval_batch_size', 'num_train_steps',
                  'grad_accum_steps', 'eval_every_steps', 'log_every_steps',
                  'checkpoint_every_steps', 'max_checkpoints_to_keep')
_MODEL_POSITIVE_INTS = ('num_layers', 'emb_dim', 'num_heads', 'qkv_dim',
                        'mlp_dim')
_MODEL_BOOLS = ('zero_padded_outputs', 'gelu_approximate', 'attention_bias',
                'mask_padding', 'causal')
# Optimizer and schedule values: (key, lowest allowed, lowest is allowed).
_POSITIVE, _NON_NEGATIVE = (0.0, False), (0.0, True)
_NUMBER_BOUNDS = {
    'eps': _POSITIVE, 'weight_decay': _NON_NEGATIVE,
    'grad_clip_norm': _NON_NEGATIVE, 'base_learning_rate': _POSITIVE,
    'max_learning_rate': _POSITIVE, 'learning_rate': _POSITIVE,
    'warmup_steps': _NON_NEGATIVE, 'decay_factor': _POSITIVE,
    'steps_per_decay': (1.0, True), 'div_factor': _POSITIVE,
    'final_div_factor': _POSITIVE,
}


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks keys, types, values and combinations before anything runs.

  Besides the checks on single values, it asks the task's data module for the
  model's input spec (which validates `config.data`) and traces a one-layer
  copy of the model at the task's input length with `jax.eval_shape` (no
  computation, no memory), so a mechanism that rejects a knob, the causal
  mode or the length fails here rather than after the data is loaded.

  Raises:
    ValueError: naming the config key and the fix.
  """
  from lra_msmra import attention as attention_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra import data as data_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra import optim  # pylint: disable=g-import-not-at-top

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
    if not _is_int(value) or value < 1:
      raise ValueError(f'config.{key}={value!r} must be a positive integer.')
  if not _is_int(config.seed) or config.seed < 0:
    raise ValueError(f'config.seed={config.seed!r} must be a non-negative '
                     'integer (it seeds the data order and the model).')
  if not _is_int(config.num_eval_steps) or (
      config.num_eval_steps < 1 and config.num_eval_steps != -1):
    raise ValueError(f'config.num_eval_steps={config.num_eval_steps!r} must '
                     'be a positive integer or -1 (whole split).')
  if config.batch_size % config.grad_accum_steps:
    raise ValueError(
        f'config.batch_size={config.batch_size} is not divisible by '
        f'config.grad_accum_steps={config.grad_accum_steps}; pick a divisor.')
  _validate_model(config.model, attention_lib)
  _validate_optimizer(config, optim)

  # The task module checks config.data and gives the input spec.
  spec = data_lib.get_model_spec(config)
  if not _is_int(spec['max_len']) or spec['max_len'] < 1:
    raise ValueError(
        f'config.data of task {config.task!r} gives an input length of '
        f"{spec['max_len']!r}; set config.data.max_length (or the task's "
        'length key) to a positive integer.')
  _trace_model(config, spec)


def _validate_model(m: ml_collections.ConfigDict, attention_lib: Any) -> None:
  """Values of config.model and the attention's construction-time checks."""
  for key, choices in _MODEL_CHOICES.items():
    if m[key] not in choices:
      raise ValueError(f'config.model.{key}={m[key]!r}; valid: {choices}.')
  for key in _MODEL_POSITIVE_INTS:
    if not _is_int(m[key]) or m[key] < 1:
      raise ValueError(f'config.model.{key}={m[key]!r} must be a positive '
                       'integer.')
  for key in _MODEL_BOOLS:
    if not isinstance(m[key], bool):
      raise ValueError(f'config.model.{key}={m[key]!r} must be True or '
                       'False.')
  if m.qkv_dim % m.num_heads:
    raise ValueError(f'config.model.qkv_dim={m.qkv_dim} is not divisible by '
                     f'config.model.num_heads={m.num_heads}; use a multiple '
                     'of num_heads.')
  for key in ('dropout_rate', 'attention_dropout_rate'):
    if not _is_number(m[key]) or not 0.0 <= m[key] < 1.0:
      raise ValueError(f'config.model.{key}={m[key]!r} must be a number in '
                       '[0, 1).')
  for key in ('emb_init_std', 'layer_norm_eps'):
    if not _is_number(m[key]) or m[key] <= 0:
      raise ValueError(f'config.model.{key}={m[key]!r} must be a positive '
                       'number.')
  hidden = m.head_hidden
  if not isinstance(hidden, (tuple, list)) or not all(
      _is_int(h) and h >= 1 for h in hidden):
    raise ValueError(f'config.model.head_hidden={hidden!r} must be a tuple '
                     'of positive integers (hidden sizes of the classifier '
                     'MLP; () for a linear head).')
  if m.causal and m.pooling == 'CLS':
    raise ValueError(
        "config.model.causal=True with config.model.pooling='CLS': position 0 "
        '(the CLS token, or the first token of each Retrieval document) sees '
        'only itself under causal attention, so the classifier would read no '
        "input. Use pooling='MEAN', 'MASKED_MEAN' or 'SUM' with causal "
        'models.')
  if not isinstance(m.attention_kw, (ml_collections.ConfigDict, dict)):
    raise ValueError(f'config.model.attention_kw={m.attention_kw!r} must be '
                     'a ConfigDict of the mechanism\'s knobs.')
  cls = attention_lib.get_attention(m.attention)
  kw = dict(m.attention_kw)
  try:
    cls(num_heads=m.num_heads, qkv_features=m.qkv_dim, causal=m.causal, **kw)
  except TypeError as e:
    raise ValueError(
        f'config.model.attention_kw={kw} does not fit '
        f'{cls.__name__}: {e}. Remove the unknown key (see the knobs in '
        f'the docstring of lra_msmra.attention.{cls.__module__.split(".")[-1]}'
        ').') from None
  except NotImplementedError as e:
    raise _unsupported(m, cls, e) from None
  except ValueError as e:
    raise ValueError(f'config.model.attention_kw of {m.attention!r} '
                     f'({cls.__name__}): {e}') from None


def _unsupported(m: ml_collections.ConfigDict, cls: type,
                 error: Exception) -> ValueError:
  if m.causal:
    return ValueError(
        f'config.model.causal=True: {cls.__name__} ({m.attention!r}) refuses '
        f'it with these knobs: {error} Set config.model.causal=False or pick '
        'a mechanism with a causal form.')
  return ValueError(f'config.model.attention_kw of {m.attention!r} '
                    f'({cls.__name__}): {error}')


def _validate_optimizer(config: ml_collections.ConfigDict, optim: Any) -> None:
  """Keys and values of config.optimizer and config.schedule."""
  optim.check_keys('optimizer', config.optimizer, optim.OPTIMIZER_KEYS)
  optim.check_keys('schedule', config.schedule, optim.SCHEDULE_KEYS)
  for section in ('optimizer', 'schedule'):
    for key, value in config[section].items():
      if key not in _NUMBER_BOUNDS:
        continue
      low, inclusive = _NUMBER_BOUNDS[key]
      if not _is_number(value) or value < low or (
          value == low and not inclusive):
        bound = f'>= {low:g}' if inclusive else f'> {low:g}'
        raise ValueError(f'config.{section}.{key}={value!r} must be a number '
                         f'{bound}.')
  betas = []
  if 'b1' in config.optimizer:
    betas.append(('b1', config.optimizer.b1))
  if 'b1_range' in config.optimizer:
    betas += [('b1_range', b) for b in tuple(config.optimizer.b1_range)]
    if len(tuple(config.optimizer.b1_range)) != 2:
      raise ValueError(f'config.optimizer.b1_range='
                       f'{config.optimizer.b1_range!r} must be a pair '
                       '(start, middle) of the OneCycle beta1 cycle.')
  betas.append(('b2', config.optimizer.b2))
  for key, value in betas:
    if not _is_number(value) or not 0.0 <= value < 1.0:
      raise ValueError(f'config.optimizer.{key}={value!r} must be in [0, 1).')
  cycle = config.schedule.get('steps_per_cycle')
  if cycle is not None and (not _is_int(cycle) or (cycle < 1 and cycle != -1)):
    raise ValueError(f'config.schedule.steps_per_cycle={cycle!r} must be a '
                     'positive integer or -1 (= num_train_steps).')
  # Builds the optimizer (no parameters): unknown schedule factors and
  # optimizer/schedule pairs that do not go together fail here.
  optim.create_optimizer(config.optimizer, config.schedule,
                         config.num_train_steps)


def _trace_model(config: ml_collections.ConfigDict,
                 spec: Mapping[str, Any]) -> None:
  """Traces a one-layer copy of the model at the task's input length.

  Every layer is built from the same fields, so one layer exercises every
  check the mechanism makes at call time (lengths, causal mode, knobs);
  `jax.eval_shape` allocates and computes nothing.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from lra_msmra import models  # pylint: disable=g-import-not-at-top

  model_cfg = config.model.to_dict()
  model_cfg['num_layers'] = 1
  model = models.create_model(model_cfg, **spec)
  batch = {'inputs': jax.ShapeDtypeStruct((1, spec['max_len']), 'int32')}
  if spec['dual']:
    batch['inputs2'] = batch['inputs']

  def init(b):
    rngs = {'params': jax.random.PRNGKey(0), 'dropout': jax.random.PRNGKey(1)}
    return model.init(rngs, b, deterministic=False)

  m = config.model
  try:
    jax.eval_shape(init, batch)
  except NotImplementedError as e:
    from lra_msmra import attention as attention_lib  # pylint: disable=g-import-not-at-top
    raise _unsupported(m, attention_lib.get_attention(m.attention), e) from e
  except (ValueError, TypeError) as e:
    raise ValueError(
        f'The model of config.model (attention={m.attention!r}, '
        f'attention_kw={dict(m.attention_kw)}) does not build for task '
        f"{config.task!r} at input length {spec['max_len']}: {e} Fix the "
        'knob it names in config.model.attention_kw or config.model, or the '
        'input length in config.data.') from e
