"""Checks a config before anything runs: `validate(config)`.

The config's shape, presets and loaders are `lra_msmra.config_lib`, which
imports nothing from the package; the checks here need the packages that
own the values (attention mechanisms, optimizers, the task's data module
and the model), so they live above all of them.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import ml_collections

from lra_msmra import attention as attention_lib
from lra_msmra import config_lib
from lra_msmra import data as data_lib
from lra_msmra import models
from lra_msmra import optim

_MODEL_CHOICES = {
    'pooling': ('CLS', 'MEAN', 'MASKED_MEAN', 'SUM', 'FLATTEN'),
    'pos_emb': ('sinusoidal', 'learned', 'none'),
    'init_style': ('lra', 'torch'),
    'dual_interaction': ('concat', 'nli'),
    'dtype': config_lib.DTYPES,
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
  expected = set(config_lib.default_config().keys())
  keys = set(config.keys())
  if keys != expected:
    raise ValueError(f'Config keys differ from the shared shape: unknown '
                     f'{sorted(keys - expected)}, missing '
                     f'{sorted(expected - keys)} (see lra_msmra/config_lib.py).')
  model_keys = set(config_lib.default_config().model.keys())
  if set(config.model.keys()) != model_keys:
    raise ValueError(
        f'config.model keys: unknown {sorted(set(config.model.keys()) - model_keys)}'
        f', missing {sorted(model_keys - set(config.model.keys()))}.')
  tasks, protocols = config_lib.TASKS, config_lib.PROTOCOLS
  if config.task not in tasks:
    raise ValueError(f'config.task={config.task!r}; valid: {list(tasks)}.')
  if config.protocol not in protocols:
    raise ValueError(f'config.protocol={config.protocol!r}; valid: {protocols}.')
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
    raise _unsupported(m, attention_lib.get_attention(m.attention), e) from e
  except (ValueError, TypeError) as e:
    raise ValueError(
        f'The model of config.model (attention={m.attention!r}, '
        f'attention_kw={dict(m.attention_kw)}) does not build for task '
        f"{config.task!r} at input length {spec['max_len']}: {e} Fix the "
        'knob it names in config.model.attention_kw or config.model, or the '
        'input length in config.data.') from e
