"""The LRA encoder, its classifier heads and the Retrieval dual encoder.

One encoder serves every task and every attention mechanism (docs/protocol.md
§3): token embedding, optional CLS token, position embedding, pre-LN blocks,
final LayerNorm. The attention of every block comes from one
`lra_msmra.attention.Mechanism` (`attention_mechanism`: the registry name,
`attention_kw` and the model's attention fields), so unknown knobs fail at
construction.

Model-level parameters of a mechanism (shared by all layers) come from the
same object (`Mechanism.shared_inputs`): the encoder creates them once as
`attention_shared` and passes their output to every layer. Mechanisms that
carry their own positional information set `pos_emb='none'` in their
configs.

Two initialisation styles are available:

* `'lra'` (docs/protocol.md §3.1): embeddings N(0, emb_init_std), Xavier-uniform
  attention and MLP kernels, MLP biases N(0, 1e-6), default Flax head.
* `'torch'` (Xiong et al., docs/protocol.md §8.2): PyTorch `nn.Linear` defaults,
  U(+-1/sqrt(fan_in)) for kernels and biases, embeddings N(0, emb_init_std).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
from flax.core import FrozenDict
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lra_msmra import attention as attention_lib
from lra_msmra import config_lib
from lra_msmra import objectives

Array = jax.Array

POOLINGS = ('CLS', 'MEAN', 'MASKED_MEAN', 'SUM', 'FLATTEN')
POS_EMBS = ('sinusoidal', 'learned', 'none')
INITS = ('lra', 'torch')
DUAL_INTERACTIONS = ('concat', 'nli')
_CHOICES = {'pooling': POOLINGS, 'pos_emb': POS_EMBS, 'init_style': INITS,
            'dual_interaction': DUAL_INTERACTIONS,
            'dtype': config_lib.DTYPES}
_POSITIVE_INTS = ('num_layers', 'emb_dim', 'num_heads', 'qkv_dim', 'mlp_dim')
_BOOLS = ('zero_padded_outputs', 'gelu_approximate', 'attention_bias',
          'mask_padding', 'causal')


def _torch_uniform(key, shape, dtype=jnp.float32, fan_in=None):
  fan_in = fan_in if fan_in is not None else int(np.prod(shape[:-1]))
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def _initializers(init: str):
  """Returns (kernel_init, bias_init_for(fan_in)) for an init style."""
  if init == 'lra':
    return (nn.initializers.xavier_uniform(),
            lambda fan_in: nn.initializers.normal(stddev=1e-6))
  if init == 'torch':
    return (nn.initializers.variance_scaling(1 / 3, 'fan_in', 'uniform'),
            lambda fan_in: (lambda k, s, d=jnp.float32:
                            _torch_uniform(k, s, d, fan_in)))
  raise ValueError(f'Unknown init {init!r}; valid: {INITS}.')


def sinusoidal_table(length: int, features: int) -> np.ndarray:
  """Interleaved sin/cos table of shape [length, features] (LRA layout).

  PE[p, 2i] = sin(p * w_i), PE[p, 2i + 1] = cos(p * w_i),
  w_i = exp(-2i ln(10000) / features).
  """
  table = np.zeros((length, features), dtype=np.float32)
  position = np.arange(length)[:, None]
  div = np.exp(np.arange(0, features, 2) * -(np.log(10000.0) / features))
  table[:, 0::2] = np.sin(position * div)
  table[:, 1::2] = np.cos(position * div)[:, : features // 2]
  return table


class MlpBlock(nn.Module):
  """Dense -> GELU -> Dropout -> Dense -> Dropout."""
  mlp_dim: int
  dropout_rate: float
  gelu_approximate: bool
  init_style: str
  dtype: Any

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    kernel_init, bias_for = _initializers(self.init_style)
    features = x.shape[-1]
    x = nn.Dense(self.mlp_dim, kernel_init=kernel_init,
                 bias_init=bias_for(features), dtype=self.dtype,
                 name='dense_in')(x)
    x = nn.gelu(x, approximate=self.gelu_approximate)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = nn.Dense(features, kernel_init=kernel_init,
                 bias_init=bias_for(self.mlp_dim), dtype=self.dtype,
                 name='dense_out')(x)
    return nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)


class EncoderBlock(nn.Module):
  """Pre-LN block: x + Drop(Attn(LN(x))), then x + MLP(LN(x)).

  Attributes:
    mechanism: the attention's settings (`attention_mechanism`); the block
      adds only the initialisers of `init_style`.
  """
  mechanism: attention_lib.Mechanism
  mlp_dim: int
  dropout_rate: float
  layer_norm_eps: float
  gelu_approximate: bool
  init_style: str
  dtype: Any

  @nn.compact
  def __call__(self, x: Array, *, padding_mask: Array, deterministic: bool,
               **shared: Any) -> Array:
    """`shared`: the output of `Mechanism.shared_inputs`, for the layer."""
    kernel_init, bias_for = _initializers(self.init_style)
    init_kw = {}
    if self.init_style == 'torch':
      init_kw = dict(kernel_init=kernel_init, bias_init=bias_for(x.shape[-1]))
    layer = self.mechanism.layer(name='attention', **init_kw)
    h = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype,
                     name='ln_attention')(x)
    h = layer(h, padding_mask=padding_mask, deterministic=deterministic,
              **shared)
    x = x + nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    h = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype,
                     name='ln_mlp')(x)
    h = MlpBlock(self.mlp_dim, self.dropout_rate, self.gelu_approximate,
                 self.init_style, self.dtype, name='mlp')(
                     h, deterministic=deterministic)
    return x + h


class Encoder(nn.Module):
  """Token ids `[batch, length]` -> encodings `[batch, length(+1), emb_dim]`.

  Attributes:
    vocab_size: size of the token table; id 0 is padding.
    max_len: longest input length (without CLS).
    use_cls: prepend a learned CLS vector (zeros init); its mask entry copies
      the first token's mask, as in LRA.
    mask_padding: padding mask is `ids > 0` (LRA, also for pixels: P8); if
      False every position is real.
  """
  vocab_size: int
  max_len: int
  num_layers: int
  emb_dim: int
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  attention: str = 'softmax'
  attention_kw: Mapping[str, Any] = FrozenDict()
  use_cls: bool = False
  pos_emb: str = 'sinusoidal'
  emb_init_std: float = 1.0
  layer_norm_eps: float = 1e-6
  gelu_approximate: bool = True
  attention_bias: bool = False
  init_style: str = 'lra'
  mask_padding: bool = True
  causal: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, ids: Array, *, deterministic: bool
               ) -> tuple[Array, Array]:
    """Returns (encodings, padding_mask), both with the CLS position if any."""
    if ids.ndim != 2:
      raise ValueError(f'Encoder expects ids [batch, length], got {ids.shape}.')
    if ids.shape[1] > self.max_len:
      raise ValueError(
          f'Input length {ids.shape[1]} exceeds the model\'s max_len '
          f'{self.max_len}, which comes from the task data '
          '(config.data.max_length or config.data.pad_to_length).')
    padding_mask = ids > 0 if self.mask_padding else jnp.ones(ids.shape, bool)
    x = nn.Embed(self.vocab_size, self.emb_dim,
                 embedding_init=nn.initializers.normal(self.emb_init_std),
                 name='embed')(ids).astype(self.dtype)
    if self.use_cls:
      cls = self.param('cls', nn.initializers.zeros, (1, 1, self.emb_dim))
      cls = jnp.broadcast_to(cls, (x.shape[0], 1, self.emb_dim))
      x = jnp.concatenate([cls.astype(self.dtype), x], axis=1)
      padding_mask = jnp.concatenate([padding_mask[:, :1], padding_mask], 1)
    length = x.shape[1]
    table_len = self.max_len + int(self.use_cls)
    if self.pos_emb == 'sinusoidal':
      x = x + sinusoidal_table(table_len, self.emb_dim)[None, :length]
    elif self.pos_emb == 'learned':
      table = self.param('pos_embedding', nn.initializers.normal(0.02),
                         (1, table_len, self.emb_dim))
      x = x + table[:, :length].astype(self.dtype)
    elif self.pos_emb != 'none':
      raise ValueError(f'Unknown pos_emb {self.pos_emb!r}; valid: {POS_EMBS}.')
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)

    mechanism = attention_mechanism(
        {key: getattr(self, key) for key in ATTENTION_KEYS})
    shared = mechanism.shared_inputs(features=self.emb_dim, max_len=table_len)
    for i in range(self.num_layers):
      x = EncoderBlock(
          mechanism=mechanism, mlp_dim=self.mlp_dim,
          dropout_rate=self.dropout_rate, layer_norm_eps=self.layer_norm_eps,
          gelu_approximate=self.gelu_approximate, init_style=self.init_style,
          dtype=self.dtype, name=f'block_{i}')(
              x, padding_mask=padding_mask, deterministic=deterministic,
              **shared)
    x = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype,
                     name='encoder_norm')(x)
    return x, padding_mask


def pool(x: Array, padding_mask: Array, mode: str, zero_padded: bool) -> Array:
  """Pools `[batch, length, features]` to `[batch, pooled_features]`.

  Args:
    x: encodings.
    padding_mask: bool `[batch, length]`, True = real token.
    mode: 'CLS' (position 0), 'MEAN' (over all positions, padding included:
      LRA and Xiong, P9), 'MASKED_MEAN' (over real tokens), 'SUM', 'FLATTEN'.
    zero_padded: zero padded positions first (Xiong et al. multiply the final
      output by the mask).
  """
  if zero_padded:
    x = x * padding_mask[..., None].astype(x.dtype)
  if mode == 'CLS':
    return x[:, 0]
  if mode == 'MEAN':
    return jnp.mean(x, axis=1)
  if mode == 'MASKED_MEAN':
    m = padding_mask[..., None].astype(x.dtype)
    return jnp.sum(x * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
  if mode == 'SUM':
    return jnp.sum(x, axis=1)
  if mode == 'FLATTEN':
    return x.reshape(x.shape[0], -1)
  raise ValueError(f'Unknown pooling {mode!r}; valid: {POOLINGS}.')


class ClassifierHead(nn.Module):
  """Dense(h) -> ReLU for each hidden size, then Dense(num_classes)."""
  hidden: Sequence[int]
  num_classes: int
  init_style: str

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kw = {}
    if self.init_style == 'torch':
      kernel_init, bias_for = _initializers('torch')
    for i, h in enumerate(self.hidden):
      if self.init_style == 'torch':
        kw = dict(kernel_init=kernel_init, bias_init=bias_for(x.shape[-1]))
      x = nn.relu(nn.Dense(h, name=f'hidden_{i}', **kw)(x))
    if self.init_style == 'torch':
      kw = dict(kernel_init=kernel_init, bias_init=bias_for(x.shape[-1]))
    return nn.Dense(self.num_classes, name='logits', **kw)(x)


def _encoder_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
  names = ('num_layers', 'emb_dim', 'num_heads', 'qkv_dim', 'mlp_dim',
           'dropout_rate', 'attention_dropout_rate', 'attention', 'pos_emb',
           'emb_init_std', 'layer_norm_eps', 'gelu_approximate',
           'attention_bias', 'init_style', 'mask_padding', 'causal')
  fields = {n: cfg[n] for n in names}
  fields['attention_kw'] = FrozenDict(cfg['attention_kw'])
  fields['dtype'] = jnp.dtype(cfg['dtype'])
  return fields


class Classifier(nn.Module):
  """Single-input classifier: encoder, pooling, head (docs/protocol.md §3.1)."""
  encoder: Encoder
  pooling: str
  zero_padded_outputs: bool
  head_hidden: Sequence[int]
  num_classes: int

  @nn.compact
  def __call__(self, batch: Mapping[str, Array], *, deterministic: bool
               ) -> Array:
    x, padding_mask = self.encoder(batch['inputs'], deterministic=deterministic)
    pooled = pool(x, padding_mask, self.pooling, self.zero_padded_outputs)
    return ClassifierHead(self.head_hidden, self.num_classes,
                          self.encoder.init_style, name='head')(
                              pooled.astype(jnp.float32))


class DualEncoderClassifier(nn.Module):
  """Retrieval: one shared encoder per document, pooled, combined, MLP head.

  `interaction='concat'` gives `[u, v]` (LRA), `'nli'` gives
  `[u, v, u*v, u-v]` (Xiong et al.). The encoder has no CLS token, so LRA's
  'CLS' pooling takes the first byte of each document (docs/protocol.md
  §3.2, P2).
  """
  encoder: Encoder
  pooling: str
  zero_padded_outputs: bool
  head_hidden: Sequence[int]
  num_classes: int
  interaction: str

  @nn.compact
  def __call__(self, batch: Mapping[str, Array], *, deterministic: bool
               ) -> Array:
    pooled = []
    for key in ('inputs', 'inputs2'):
      x, padding_mask = self.encoder(batch[key], deterministic=deterministic)
      pooled.append(pool(x, padding_mask, self.pooling,
                         self.zero_padded_outputs).astype(jnp.float32))
    u, v = pooled
    if self.interaction == 'concat':
      features = jnp.concatenate([u, v], axis=-1)
    elif self.interaction == 'nli':
      features = jnp.concatenate([u, v, u * v, u - v], axis=-1)
    else:
      raise ValueError(f'Unknown interaction {self.interaction!r}; valid: '
                       f'{DUAL_INTERACTIONS}.')
    return ClassifierHead(self.head_hidden, self.num_classes,
                          self.encoder.init_style, name='head')(features)


class TokenPredictor(nn.Module):
  """Self-pretraining: the encoder predicts the task's own tokens
  (`lra_msmra.objectives`), through a linear head over the token table.

  Called like the classifiers, with a batch; returns (logits `[rows,
  length, vocab_size]`, targets `[rows, length]`, token weights `[rows,
  length]`), where Retrieval's two documents are rows of their own and an
  evaluation batch's example weights multiply its token weights. The
  masked objective draws its masks from the `'masking'` RNG stream.
  """
  encoder: Encoder
  objective: str
  vocab_size: int
  mask_rate: float
  mask_span: int
  dual: bool

  @nn.compact
  def __call__(self, batch: Mapping[str, Array], *, deterministic: bool
               ) -> tuple[Array, Array, Array]:
    ids = batch['inputs']
    example_weights = batch.get('weights')
    if example_weights is None:
      example_weights = jnp.ones(ids.shape[:1], jnp.float32)
    if self.dual:
      ids = jnp.concatenate([ids, batch['inputs2']], axis=0)
      example_weights = jnp.concatenate([example_weights] * 2, axis=0)
    real = ids > 0 if self.encoder.mask_padding else jnp.ones(ids.shape, bool)
    if self.objective == 'masked':
      inputs, targets, weights = objectives.masked_inputs(
          self.make_rng('masking'), ids, real, rate=self.mask_rate,
          span=self.mask_span, mask_id=self.vocab_size)
    else:
      inputs, targets, weights = objectives.causal_targets(ids, real)
    x, _ = self.encoder(inputs, deterministic=deterministic)
    if self.encoder.use_cls:
      x = x[:, 1:]
    logits = nn.Dense(self.vocab_size, name='token_head')(
        x.astype(jnp.float32))
    return logits, targets, weights * example_weights[:, None]


# The keys of config.model (also fields of `Encoder`) that set its attention.
ATTENTION_KEYS = ('attention', 'attention_kw', 'num_heads', 'qkv_dim',
                  'attention_dropout_rate', 'causal', 'dtype',
                  'attention_bias')


def attention_mechanism(m: Mapping[str, Any]) -> attention_lib.Mechanism:
  """The attention of `config.model`: one object for all layers and the
  model-level shared module.

  Args:
    m: `config.model`, or any mapping of `ATTENTION_KEYS` (the encoder
      passes its fields of those names).

  Raises:
    ValueError: `m['attention']` is not registered.
  """
  return attention_lib.Mechanism(
      m['attention'], m['attention_kw'],
      dict(num_heads=m['num_heads'], qkv_features=m['qkv_dim'],
           dropout_rate=m['attention_dropout_rate'], causal=m['causal'],
           dtype=jnp.dtype(m['dtype']), use_bias=m['attention_bias']))


def check_config(m: Mapping[str, Any]) -> None:
  """Checks `config.model`: its values and the attention's knobs.

  The attention (`attention_mechanism`) builds one layer, which checks its
  `implementation` and runs its `check_knobs` hook (see
  `lra_msmra.attention.base.Attention`). What depends on the input length
  is checked when the model is traced (`lra_msmra.validation`).

  Raises:
    ValueError: naming the key of config.model and the fix.
  """
  for key, choices in _CHOICES.items():
    if m[key] not in choices:
      raise ValueError(f'config.model.{key}={m[key]!r}; valid: {choices}.')
  for key in _POSITIVE_INTS:
    if not config_lib.is_int(m[key]) or m[key] < 1:
      raise ValueError(f'config.model.{key}={m[key]!r} must be a positive '
                       'integer.')
  for key in _BOOLS:
    if not isinstance(m[key], bool):
      raise ValueError(f'config.model.{key}={m[key]!r} must be True or '
                       'False.')
  if m['qkv_dim'] % m['num_heads']:
    raise ValueError(f"config.model.qkv_dim={m['qkv_dim']} is not divisible "
                     f"by config.model.num_heads={m['num_heads']}; use a "
                     'multiple of num_heads.')
  for key in ('dropout_rate', 'attention_dropout_rate'):
    if not config_lib.is_number(m[key]) or not 0.0 <= m[key] < 1.0:
      raise ValueError(f'config.model.{key}={m[key]!r} must be a number in '
                       '[0, 1).')
  for key in ('emb_init_std', 'layer_norm_eps'):
    if not config_lib.is_number(m[key]) or m[key] <= 0:
      raise ValueError(f'config.model.{key}={m[key]!r} must be a positive '
                       'number.')
  hidden = m['head_hidden']
  if not isinstance(hidden, (tuple, list)) or not all(
      config_lib.is_int(h) and h >= 1 for h in hidden):
    raise ValueError(f'config.model.head_hidden={hidden!r} must be a tuple '
                     'of positive integers (hidden sizes of the classifier '
                     'MLP; () for a linear head).')
  if m['causal'] and m['pooling'] == 'CLS':
    raise ValueError(
        "config.model.causal=True with config.model.pooling='CLS': position 0 "
        '(the CLS token, or the first token of each Retrieval document) sees '
        'only itself under causal attention, so the classifier would read no '
        "input. Use pooling='MEAN', 'MASKED_MEAN' or 'SUM' with causal "
        'models.')
  if not isinstance(m['attention_kw'], (ml_collections.ConfigDict, dict)):
    raise ValueError(f"config.model.attention_kw={m['attention_kw']!r} must "
                     "be a ConfigDict of the mechanism's knobs.")
  mechanism = attention_mechanism(m)
  cls = mechanism.layer_class
  kw = dict(m['attention_kw'])
  try:
    mechanism.check()
  except TypeError as e:
    raise ValueError(
        f'config.model.attention_kw={kw} does not fit '
        f'{cls.__name__}: {e}. Remove the unknown key (see the knobs in '
        f'the docstring of lra_msmra.attention.{cls.__module__.split(".")[-1]}'
        ').') from None
  except NotImplementedError as e:
    raise unsupported(m, e) from None
  except ValueError as e:
    raise ValueError(f"config.model.attention_kw of {m['attention']!r} "
                     f'({cls.__name__}): {e}') from None


def check_objective(m: Mapping[str, Any], objective: str) -> None:
  """Checks that `config.model` can be trained with `config.objective`:
  the causal objective needs the mechanism's causal form.

  Raises:
    ValueError: naming the mechanism and the masked objective.
  """
  if objective != 'causal' or m['causal']:
    return
  causal = dict(m, causal=True, pooling='MEAN')  # No classifier is built.
  try:
    check_config(causal)
  except (ValueError, NotImplementedError) as e:
    raise causal_refused(m, e) from None


def causal_refused(m: Mapping[str, Any], error: Exception) -> ValueError:
  """The error for a causal objective the mechanism has no form for."""
  return ValueError(
      f"config.objective='causal': the {m['attention']!r} attention with "
      f'these knobs has no causal form ({error}). Pretrain it with '
      "config.objective='masked' instead.")


def unsupported(m: Mapping[str, Any], error: Exception) -> ValueError:
  """The error for a combination the mechanism has no form for."""
  cls = attention_mechanism(m).layer_class
  if m['causal']:
    return ValueError(
        f"config.model.causal=True: {cls.__name__} ({m['attention']!r}) "
        f'refuses it with these knobs: {error} Set config.model.causal=False '
        'or pick a mechanism with a causal form.')
  return ValueError(f"config.model.attention_kw of {m['attention']!r} "
                    f'({cls.__name__}): {error}')


def create_model(model_config: Mapping[str, Any], *, vocab_size: int,
                 num_classes: int, max_len: int, dual: bool,
                 objective: str = 'classify',
                 masking: Optional[Mapping[str, Any]] = None) -> nn.Module:
  """Builds the model described by `config.model` for a task.

  Args:
    model_config: `config.model` (see `lra_msmra.config_lib`).
    vocab_size: token table size from the task data.
    num_classes: number of labels.
    max_len: input length of the task (without CLS).
    dual: build the Retrieval dual encoder.
    objective: `config.objective`: 'classify' builds the classifier,
      'masked' and 'causal' a `TokenPredictor` over the same encoder (with
      one token more, the mask, for 'masked'; causal attention for
      'causal').
    masking: `config.masking` (rate, span), for 'masked'.
  """
  cfg = model_config
  use_cls = cfg['pooling'] == 'CLS' and not dual
  fields = _encoder_fields(cfg)
  if objective == 'causal':
    fields['causal'] = True
  encoder = Encoder(vocab_size=objectives.embedding_rows(objective,
                                                         vocab_size),
                    max_len=max_len, use_cls=use_cls, **fields)
  if objective != 'classify':
    masking = masking or config_lib.MASKING
    return TokenPredictor(encoder=encoder, objective=objective,
                          vocab_size=vocab_size, mask_rate=masking['rate'],
                          mask_span=masking['span'], dual=dual)
  head_hidden = tuple(cfg['head_hidden'])
  if dual:
    return DualEncoderClassifier(
        encoder=encoder, pooling=cfg['pooling'],
        zero_padded_outputs=cfg['zero_padded_outputs'],
        head_hidden=head_hidden, num_classes=num_classes,
        interaction=cfg['dual_interaction'])
  return Classifier(encoder=encoder, pooling=cfg['pooling'],
                    zero_padded_outputs=cfg['zero_padded_outputs'],
                    head_hidden=head_hidden, num_classes=num_classes)


def count_params(params: Any) -> int:
  """Total number of scalars in a parameter tree."""
  return int(sum(np.prod(p.shape) for p in jax.tree_util.tree_leaves(params)))
