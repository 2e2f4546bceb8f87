r"""The GPU benchmark: every attention implementation in one bounded run.

  python -m lra_msmra_tools.benchmark.device --out DIR [--budget_s 440]

(`launch/gpu_benchmark.sh OUT_DIR` runs it on a GPU machine; `launch/README.md`
says how.) It measures, within `--budget_s` seconds in all:

* **Layers**: one attention layer (`StandaloneAttention`, as the encoder
  builds it; D = `--features`, H = `--heads`, an all-real padding mask,
  dropout off), at every length of `--lengths` (1K-16K), in every setting
  of `--settings` (batch:dtype:mode, in priority order; by default
  forward+backward in bfloat16 at batch 4 and 32, then forward in bfloat16,
  then both in float32 at batch 4), for every (mechanism, implementation)
  of `VARIANTS`. `fwd` and `fwd_bwd` are those of
  `lra_msmra_tools.benchmark.attention` (the cotangent depends on the output).
* **Training steps** of the ListOps `:cst` configs of `VARIANTS`
  (`lra_msmra.steps.train_step`, state donated, on a synthetic batch of the
  config's shape: batch 32, 2000 tokens) in each dtype of `--train_dtypes`.

How it runs: one worker process per entry of `VARIANTS` (a mechanism with
all its implementations, or a config), all started at once. Each compiles
all its points first, on a few threads (`--compile_threads`; XLA compiles
without holding Python's lock), so the machine's cores compile in parallel.
When every worker has compiled (or at `--compile_share` of the budget),
the workers time their points one worker at a time, so that only one
program runs on the device at any moment; a worker exits after its turn,
which frees its device memory for the next. Each turn gets a share of the
time left in proportion to the worker's compiled points (a training step
counting as `TRAIN_POINT_WEIGHT` layer points); a worker that finishes
early leaves its time to the next. Parameters, inputs and training states
are made on the device by programs compiled in the first phase too, so
nothing compiles while points are timed.

Per point:

* time: the median of up to `--repeats` calls (at least 3, fewer past
  `--max_point_seconds` of timed calls), each waited for with
  `block_until_ready`, after `--warmup` untimed calls; compile time;
* FLOPs: the matmul FLOPs of the 'xla' implementation of the same layer or
  step, counted from its jaxpr (`lra_msmra.flops`), also for the
  other implementations, whose kernels hide their products from a jaxpr;
* bytes: the layer's compulsory memory traffic
  (`lra_msmra_tools.benchmark.roofline`);
* memory: the buffers XLA assigns to one call, from
  `compiled.memory_analysis()`: arguments + outputs + temporaries - aliased
  (`xla_peak_bytes`; the figure compared in the report). The device
  runtime's `peak_bytes_in_use` after the point is recorded too
  (`device_peak_bytes`): it is the worker process's high-water mark so
  far, so it only bounds the point's peak from above. On the CPU
  `memory_analysis()` under-reports (docs/benchmarks.md).

Points that do not fit are recorded, never crash the run: a point whose
peak, predicted from shorter lengths of the same setting
(`lra_msmra_tools.benchmark.memory.predict_bytes`), or measured by
`memory_analysis()`, is over 90 % of the device's memory limit is not run
('does not fit'), nor are longer lengths of that setting; a compile or call
that runs out of memory is 'out of memory'; a point predicted (from the
previous length) to need more than `--point_timeout_s` is 'skipped', and
one that runs past it is 'timed out' (its worker is stopped). An
implementation that a layer does not have yet, or that refuses the dtype,
is 'not available'; what the budget leaves out is 'not run'.

Outputs in `--out`: `device.json` (every record, the environment, the
device and its peaks; rewritten after every worker's turn),
`device.md` (the report of `lra_msmra_tools.benchmark.device_report`) and
`device.png` (its plot). `python -m lra_msmra_tools.benchmark.device_report`
turns the JSON into the GPU section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

from lra_msmra_tools.benchmark import environment
from lra_msmra_tools.benchmark import memory
from lra_msmra_tools.benchmark import outputs
from lra_msmra_tools.benchmark import specs
from lra_msmra_tools.benchmark import workers

MODULE = 'lra_msmra_tools.benchmark.device'


class Variant(NamedTuple):
  """One worker's work: a layer spec or a ListOps config, and the
  implementations (`attention_kw.implementation`) to run it with.

  Attributes:
    kind: 'layer' (a registry name with knobs, `name:key=value`) or 'train'
      (a config file of configs/listops/, run with option `cst`).
    name: the spec or the config name.
    implementations: values of the layers' `implementation` field.
  """
  kind: str
  name: str
  implementations: tuple[str, ...]


# Every (mechanism, knobs, implementation) this benchmark runs: add an
# implementation here when it lands. One the layer class does not have yet
# is recorded as 'not available'.
VARIANTS: tuple[Variant, ...] = (
    Variant('layer', 'softmax', ('xla', 'cudnn')),
    Variant('layer', 'cst', ('xla', 'pallas')),
    Variant('layer', 'long_short', ('xla', 'pallas')),
    Variant('layer', 'adamra', ('xla', 'pallas')),
    Variant('layer', 'combiner:variant=fixed', ('xla', 'pallas')),
    # The plan of the LRA configs (configs/common/combiner.py).
    Variant('layer', 'combiner:variant=axial,axial_plan=vertical',
            ('xla', 'pallas')),
    Variant('train', 'transformer', ('xla', 'cudnn')),
    Variant('train', 'cst', ('xla', 'pallas')),
    Variant('train', 'cst_l16', ('xla', 'pallas')),
    Variant('train', 'long_short', ('xla', 'pallas')),
    Variant('train', 'adamra', ('xla', 'pallas')),
    Variant('train', 'combiner_fixed', ('xla', 'pallas')),
    Variant('train', 'combiner_axial', ('xla', 'pallas')),
)
# The implementation that is the numerical reference and whose jaxpr the
# FLOPs are counted on.
REFERENCE = 'xla'
# Implementations that run only in some dtypes (cuDNN's fused attention:
# 16-bit floats).
IMPLEMENTATION_DTYPES = {'cudnn': ('bfloat16', 'float16')}
# The ListOps configs' option and task of the training steps.
TRAIN_TASK, TRAIN_OPTIONS = 'listops', 'cst'

DEFAULT_LENGTHS = '1K,2K,4K,8K,16K'
DEFAULT_SETTINGS = ('4:bfloat16:fwd_bwd,32:bfloat16:fwd_bwd,4:bfloat16:fwd,'
                    '4:float32:fwd_bwd,4:float32:fwd')
MODES = ('fwd', 'fwd_bwd')
DTYPES = ('bfloat16', 'float32', 'float16')
# Lines of a worker's stdout that carry an event start with this.
EVENT_MARKER = 'DEVICE_BENCHMARK '
# Share of the device's memory limit a point may be predicted to use.
MEMORY_SHARE = 0.9


class Setting(NamedTuple):
  """Batch, dtype and mode of a group of layer points."""
  batch: int
  dtype: str
  mode: str

  @property
  def label(self) -> str:
    return f'{self.batch}:{self.dtype}:{self.mode}'


def parse_settings(text: str) -> list[Setting]:
  """`4:bfloat16:fwd_bwd,32:bfloat16:fwd_bwd` -> Settings, in that order."""
  result = []
  for token in (t.strip() for t in text.split(',')):
    if not token:
      continue
    parts = token.split(':')
    if len(parts) != 3:
      raise ValueError(f'setting {token!r}: write batch:dtype:mode')
    batch, dtype, mode = parts
    if not batch.isdigit() or int(batch) < 1:
      raise ValueError(f'setting {token!r}: batch must be a positive int')
    if dtype not in DTYPES:
      raise ValueError(f'setting {token!r}: dtype must be one of {DTYPES}')
    if mode not in MODES:
      raise ValueError(f'setting {token!r}: mode must be one of {MODES}')
    setting = Setting(int(batch), dtype, mode)
    if setting in result:
      raise ValueError(f'setting {token!r} given twice')
    result.append(setting)
  if not result:
    raise ValueError('no setting given')
  return result


def _names(text: str) -> list[str]:
  """Spec labels of a comma list (`cst,combiner:variant=fixed`); '' or
  'none' -> []."""
  if text.strip().lower() in ('', 'none'):
    return []
  return [s.label for s in specs.parse_specs(text)]


def select_variants(layers: str, train: str, implementations: str
                    ) -> list[Variant]:
  """The entries of `VARIANTS` that the flags select, in `VARIANTS` order.

  Raises:
    ValueError: a name or implementation that `VARIANTS` does not have.
  """
  chosen = []
  for kind, text in (('layer', layers), ('train', train)):
    known = [v for v in VARIANTS if v.kind == kind]
    labels = ([v.name for v in known] if text == 'all' else _names(text))
    unknown = sorted(set(labels) - {v.name for v in known})
    if unknown:
      raise ValueError(f'{unknown} not in VARIANTS ({kind}); known: '
                       f'{[v.name for v in known]}')
    chosen += [v for v in known if v.name in labels]
  if implementations != 'all':
    wanted = [i.strip() for i in implementations.split(',') if i.strip()]
    known = {i for v in VARIANTS for i in v.implementations}
    if set(wanted) - known:
      raise ValueError(f'implementations {sorted(set(wanted) - known)} are '
                       f'in no variant; known: {sorted(known)}')
    chosen = [v._replace(implementations=tuple(
        i for i in v.implementations if i in wanted)) for v in chosen]
    chosen = [v for v in chosen if v.implementations]
  if not chosen:
    raise ValueError('no variant selected')
  return chosen


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog=f'python -m {MODULE}',
      description='GPU benchmark of every attention implementation: '
                  'layers and training steps, within a time budget.')
  p.add_argument('--out', required=True, help='output folder')
  p.add_argument('--layers', default='all',
                 help="layer specs of VARIANTS to run ('all', 'none' or a "
                      'comma list, e.g. softmax,combiner:variant=fixed)')
  p.add_argument('--train', default='all',
                 help="ListOps configs of VARIANTS to run ('all', 'none' "
                      'or a comma list, e.g. transformer,cst)')
  p.add_argument('--implementations', default='all',
                 help="'all' or a comma list, e.g. xla,cudnn")
  p.add_argument('--lengths', default=DEFAULT_LENGTHS)
  p.add_argument('--settings', default=DEFAULT_SETTINGS,
                 help='layer settings batch:dtype:mode, most important '
                      'first (default: %(default)s)')
  p.add_argument('--features', type=int, default=256,
                 help='model width D (= qkv width)')
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--train_dtypes', default='bfloat16,float32',
                 help='dtypes of the training steps, most important first')
  p.add_argument('--train_length', type=int, default=0,
                 help="tokens per example (0 = the config's, 2000)")
  p.add_argument('--train_batch', type=int, default=0,
                 help="batch of the training steps (0 = the config's, 32)")
  p.add_argument('--repeats', type=int, default=20,
                 help='most timed calls per point (median reported)')
  p.add_argument('--warmup', type=int, default=2,
                 help='untimed calls after compilation')
  p.add_argument('--max_point_seconds', type=float, default=1.0,
                 help='stop repeating after this much timed work (at '
                      'least 3 calls)')
  p.add_argument('--point_timeout_s', type=float, default=60.0,
                 help='stop a point (and its worker) running longer')
  p.add_argument('--budget_s', type=float, default=440.0,
                 help='the whole run, start to written outputs')
  p.add_argument('--compile_share', type=float, default=0.45,
                 help='share of the budget after which no compile starts')
  p.add_argument('--reserve_s', type=float, default=20.0,
                 help='seconds kept at the end to write the outputs')
  p.add_argument('--compile_threads', type=int, default=3,
                 help='compiling threads per worker')
  args = p.parse_args(argv)
  try:
    args.variants = select_variants(args.layers, args.train,
                                    args.implementations)
    args.setting_list = parse_settings(args.settings)
    args.length_list = specs.parse_lengths(args.lengths)
  except ValueError as e:
    p.error(str(e))
  args.train_dtype_list = [d.strip() for d in args.train_dtypes.split(',')
                           if d.strip()]
  bad = sorted(set(args.train_dtype_list) - set(DTYPES))
  if bad or not args.train_dtype_list:
    p.error(f'--train_dtypes: unknown {bad}; valid: {list(DTYPES)}')
  for name in ('features', 'heads', 'repeats', 'compile_threads'):
    if getattr(args, name) < 1:
      p.error(f'--{name} must be >= 1')
  if args.features % args.heads:
    p.error(f'--features={args.features} is not divisible by '
            f'--heads={args.heads}')
  if not 0 < args.compile_share < 1:
    p.error('--compile_share must be between 0 and 1')
  if args.budget_s <= args.reserve_s:
    p.error('--budget_s must exceed --reserve_s')
  return args


# ------------------------------------------------------------------ worker


def _emit(event: str, **fields: Any) -> None:
  sys.stdout.write(EVENT_MARKER + json.dumps(dict(event=event, **fields))
                   + '\n')
  sys.stdout.flush()


class NotAvailable(Exception):
  """An implementation the layer (or the dtype) does not offer."""


def out_of_memory(error: BaseException) -> bool:
  """Whether an exception is the runtime's out-of-memory error."""
  text = str(error)
  return ('RESOURCE_EXHAUSTED' in text or 'Out of memory' in text
          or 'out of memory' in text)


def implementation_kw(cls: type, implementation: str) -> dict[str, Any]:
  """The knob that selects `implementation` in layer class `cls`.

  {} for the reference on a class without the `implementation` field (the
  code before the field existed computes the reference).

  Raises:
    NotAvailable: another implementation on a class without the field, or
      one that the class's `IMPLEMENTATIONS` does not list.
  """
  fields = {f.name for f in dataclasses.fields(cls)}
  if 'implementation' in fields:
    offered = getattr(cls, 'IMPLEMENTATIONS', None)
    if offered is not None and implementation not in offered:
      raise NotAvailable(f'{cls.__name__}.IMPLEMENTATIONS is {offered}')
    return {'implementation': implementation}
  if implementation == REFERENCE:
    return {}
  raise NotAvailable(f'{cls.__name__} has no `implementation` field, so no '
                     f'{implementation!r} implementation')


def check_dtype(implementation: str, dtype: str) -> None:
  """Raises NotAvailable where `implementation` does not run in `dtype`."""
  allowed = IMPLEMENTATION_DTYPES.get(implementation)
  if allowed and dtype not in allowed:
    raise NotAvailable(f'{implementation!r} runs in {", ".join(allowed)} '
                       f'only, not {dtype}')


def _nbytes(tree: Any) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  return int(sum(int(np.prod(l.shape)) * np.dtype(l.dtype).itemsize
                 for l in jax.tree.leaves(tree)))


def xla_peak_bytes(compiled: Any) -> Optional[int]:
  """Arguments + outputs + temporaries - aliased bytes of a compiled call
  (`memory_analysis()`), or None where the backend does not report it."""
  try:
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes
               + m.temp_size_in_bytes - m.alias_size_in_bytes)
  except Exception:  # pylint: disable=broad-except
    return None


def _xla_flops(compiled: Any) -> Optional[float]:
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost['flops']) if cost and 'flops' in cost else None
  except Exception:  # pylint: disable=broad-except
    return None


@dataclasses.dataclass
class Point:
  """One measurement of a worker.

  Attributes:
    record: the fields that name it (and, later, its results).
    chain: points of one chain differ in length only; a chain is compiled
      and timed from short to long, and stops at its first failure.
    length: the length, for predictions along the chain.
    lower: () -> (lowered program, extra record fields); raises
      NotAvailable.
    make_call: (run_init, compiled) -> a function that runs one call;
      `run_init(key)` runs the compiled program `key` of `_Inits` (the
      point's parameters, inputs or state, made on the device).
  """
  record: dict[str, Any]
  chain: tuple[Any, ...]
  length: int
  lower: Callable[[], tuple[Any, dict[str, Any]]]
  make_call: Callable[[Callable[[Any], Any], Any], Callable[[], Any]]
  compiled: Any = None


def point_key(rec: dict[str, Any]) -> str:
  """A record's identity, e.g. 'layer|cst|xla|4:bfloat16:fwd_bwd|1024'."""
  if rec['kind'] == 'layer':
    return '|'.join(str(rec[k]) for k in ('kind', 'variant', 'implementation',
                                          'setting', 'length'))
  return '|'.join(str(rec[k]) for k in ('kind', 'variant', 'implementation',
                                        'dtype'))


class _Inits:
  """The programs that make points' parameters, inputs or states, each
  traced once per key and compiled on the compile pool (e.g. one
  parameter init per length), so that timing compiles nothing."""

  def __init__(self, pool: concurrent.futures.Executor):
    self._pool = pool
    self._lowered: dict[Any, Any] = {}
    self._futures: dict[Any, concurrent.futures.Future] = {}

  def trace(self, key: Any, make: Callable[[], Any]) -> Any:
    """The traced init of `key` (made by `make()` once); compiles it in the
    background. Returns its `out_info` (the state's shapes)."""
    if key not in self._lowered:
      traced = make()
      self._lowered[key] = traced
      lowered = traced.lower()
      self._futures[key] = self._pool.submit(lowered.compile)
    return self._lowered[key].out_info

  def run(self, key: Any) -> Any:
    """Runs the compiled program of `key` (its argument: a PRNG key)."""
    import jax  # pylint: disable=g-import-not-at-top
    return self._futures[key].result()(jax.random.PRNGKey(0))


def _layer_points(payload: dict[str, Any], inits: _Inits) -> list[Point]:
  """The points of a layer worker, most important first."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax.core import FrozenDict  # pylint: disable=g-import-not-at-top
  from lra_msmra.attention import Mechanism  # pylint: disable=g-import-not-at-top
  from lra_msmra.attention import standalone  # pylint: disable=g-import-not-at-top
  from lra_msmra_tools.benchmark import attention as attention_bench  # pylint: disable=g-import-not-at-top
  from lra_msmra import flops as flops_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra_tools.benchmark import roofline  # pylint: disable=g-import-not-at-top

  spec = specs.parse_specs(payload['name'])[0]
  cls = Mechanism(spec.name, spec.kw).layer_class
  features, heads = payload['features'], payload['heads']
  counted: dict[tuple[int, int, str], int] = {}

  def layer(implementation: str, dtype: str, length: int):
    kw = dict(spec.kw, **implementation_kw(cls, implementation))
    return standalone.StandaloneAttention(
        mechanism=spec.name, kw=FrozenDict(kw), num_heads=heads,
        qkv_features=features, dtype=jnp.dtype(dtype), max_len=length)

  def params_key(implementation: str, length: int):
    return ('params', implementation, length)

  def params_info(implementation: str, length: int):
    # Parameters are float32 whatever the layer's dtype, and their shapes
    # do not depend on the batch (one row here): one init per length, in
    # a dtype the implementation accepts.
    dtype = IMPLEMENTATION_DTYPES.get(implementation, ('float32',))[0]

    def make():
      module = layer(implementation, dtype, length)

      def init(key):
        return module.init(key, jnp.zeros((1, length, features), dtype),
                           padding_mask=jnp.ones((1, length), bool))
      return jax.jit(init).trace(jax.random.PRNGKey(0))
    info = inits.trace(params_key(implementation, length), make)
    return {'params': info['params']}

  def traced(implementation: str, setting: Setting, length: int):
    module = layer(implementation, setting.dtype, length)
    shape = (setting.batch, length, features)
    x = jax.ShapeDtypeStruct(shape, jnp.dtype(setting.dtype))
    mask = jax.ShapeDtypeStruct(shape[:2], jnp.bool_)
    params = params_info(implementation, length)
    fn, args = attention_bench._jax_call(  # pylint: disable=protected-access
        setting.mode, lambda p, x, m: module.apply(p, x, padding_mask=m),
        params, x, mask, x)
    return jax.jit(fn).trace(*args), params

  def flops(setting: Setting, length: int, implementation: str, trace):
    key = (setting.batch, length, setting.mode)
    if key not in counted:
      if implementation != REFERENCE:
        trace = traced(REFERENCE, setting, length)[0]
      counted[key] = flops_lib.jaxpr_flops(trace.jaxpr, set())
    return counted[key]

  def lower(implementation: str, setting: Setting, length: int):
    check_dtype(implementation, setting.dtype)
    implementation_kw(cls, implementation)
    try:
      trace, params = traced(implementation, setting, length)
    except (ValueError, TypeError, NotImplementedError) as e:
      if implementation == REFERENCE:
        raise
      raise NotAvailable(f'{type(e).__name__}: {e}') from e
    param_nbytes = _nbytes(params)
    moved = roofline.layer_bytes(
        batch=setting.batch, length=length, features=features,
        qkv_features=features, param_nbytes=param_nbytes,
        act_bytes=jnp.dtype(setting.dtype).itemsize, mode=setting.mode)
    extra = {'flops': flops(setting, length, implementation, trace),
             'flops_from': REFERENCE, 'bytes': moved['bytes'],
             'bytes_parts': moved['parts'], 'param_bytes': param_nbytes}
    inputs_key(setting, length)
    return trace.lower(), extra

  def inputs_key(setting: Setting, length: int):
    """The key of the program that makes x, the mask and the cotangent."""
    key = ('inputs', setting.batch, length, setting.dtype)
    shape = (setting.batch, length, features)

    def inputs(rng):
      kx, kg = jax.random.split(rng)
      return (jax.random.normal(kx, shape, jnp.float32).astype(setting.dtype),
              jnp.ones(shape[:2], bool),
              jax.random.normal(kg, shape, jnp.float32).astype(setting.dtype))
    inits.trace(key, lambda: jax.jit(inputs).trace(jax.random.PRNGKey(0)))
    return key

  def make_call(implementation: str, setting: Setting, length: int):
    def call(run_init, compiled):
      variables = run_init(params_key(implementation, length))
      x, mask, g = run_init(inputs_key(setting, length))
      args = ({'params': variables['params']}, x, mask)
      if setting.mode == 'fwd_bwd':
        args += (g,)
      return lambda: compiled(*args)
    return call

  points = []
  for setting in payload['settings']:
    setting = Setting(*setting)
    for implementation in payload['implementations']:
      for length in payload['lengths']:
        rec = {'kind': 'layer', 'variant': spec.label,
               'mechanism': spec.name, 'kw': dict(spec.kw),
               'implementation': implementation, 'setting': setting.label,
               'batch': setting.batch, 'dtype': setting.dtype,
               'mode': setting.mode, 'length': length,
               'features': features, 'heads': heads}
        points.append(Point(
            rec, (implementation, setting), length,
            lambda i=implementation, s=setting, n=length: lower(i, s, n),
            make_call(implementation, setting, length)))
  return points


def _train_points(payload: dict[str, Any], inits: _Inits) -> list[Point]:
  """The points of a training-step worker: one per (implementation, dtype)."""
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from lra_msmra import config_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra import models  # pylint: disable=g-import-not-at-top
  from lra_msmra import steps  # pylint: disable=g-import-not-at-top
  from lra_msmra import validation  # pylint: disable=g-import-not-at-top
  from lra_msmra import flops as flops_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra_tools.benchmark import train_step  # pylint: disable=g-import-not-at-top

  name = payload['name']
  path = train_step.config_path(train_step.CONFIG_ROOT, TRAIN_TASK, name)
  counted: dict[str, int] = {}
  # (implementation, dtype) -> (batch size, model spec), set by `lower`.
  shapes: dict[tuple[str, str], Any] = {}

  def config_of(implementation: str, dtype: str):
    module = config_lib.load_sibling(path, os.path.basename(path)[:-3])
    config = module.get_config(TRAIN_OPTIONS)
    if payload['train_length']:
      config.data.max_length = payload['train_length']
      if 'pad_to_length' in config.data:
        config.data.pad_to_length = 0
    if payload['train_batch']:
      config.batch_size = payload['train_batch']
    config.model.dtype = dtype
    cls = models.attention_mechanism(config.model).layer_class
    config.model.attention_kw.update(implementation_kw(cls, implementation))
    return config

  def traced(implementation: str, dtype: str):
    config = config_of(implementation, dtype)
    spec, state = validation.trace(config)
    model, tx, schedule = steps.build(config, spec)
    shape = (config.batch_size, spec['max_len'])
    batch = {'inputs': jax.ShapeDtypeStruct(shape, jnp.int32),
             'targets': jax.ShapeDtypeStruct(shape[:1], jnp.int32)}
    if spec['dual']:
      batch['inputs2'] = batch['inputs']
    step = functools.partial(steps.train_step, model=model, tx=tx,
                             schedule=schedule,
                             grad_accum_steps=config.grad_accum_steps)
    trace = jax.jit(step, donate_argnums=0).trace(state, batch)
    return trace, config, spec, model, tx

  def lower(implementation: str, dtype: str):
    check_dtype(implementation, dtype)
    try:
      trace, config, spec, model, tx = traced(implementation, dtype)
    except (ValueError, TypeError, NotImplementedError) as e:
      if implementation == REFERENCE:
        raise
      raise NotAvailable(f'{type(e).__name__}: {e}') from e
    if dtype not in counted:
      reference = (trace if implementation == REFERENCE
                   else traced(REFERENCE, dtype)[0])
      counted[dtype] = flops_lib.jaxpr_flops(reference.jaxpr, set())
    init = functools.partial(steps.create_train_state, model=model, tx=tx,
                             batch=steps.example_batch(spec))
    state = inits.trace((implementation, dtype),
                        lambda: jax.jit(init).trace(jax.random.PRNGKey(0)))
    extra = {'flops': counted[dtype], 'flops_from': REFERENCE,
             'batch': config.batch_size, 'length': spec['max_len'],
             'attention': config.model.attention,
             'attention_kw': config.model.attention_kw.to_dict(),
             'num_params': models.count_params(state.params),
             'model_length': spec['max_len'] + int(
                 config.model.pooling == 'CLS' and not spec['dual'])}
    shapes[(implementation, dtype)] = (config.batch_size, spec)
    return trace.lower(), extra

  def make_call(implementation: str, dtype: str):
    def call(run_init, compiled):
      state = run_init((implementation, dtype))
      batch_size, spec = shapes[(implementation, dtype)]
      rng = np.random.default_rng(0)
      shape = (batch_size, spec['max_len'])
      batch = {'inputs': rng.integers(1, spec['vocab_size'], shape,
                                      dtype=np.int32),
               'targets': rng.integers(0, spec['num_classes'], shape[:1],
                                       dtype=np.int32)}
      if spec['dual']:
        batch['inputs2'] = rng.integers(1, spec['vocab_size'], shape,
                                        dtype=np.int32)
      batch = jax.device_put(batch)
      holder = {'state': state}

      def step():
        holder['state'], metrics = compiled(holder['state'], batch)
        return metrics
      return step
    return call

  points = []
  for dtype in payload['train_dtypes']:
    for implementation in payload['implementations']:
      rec = {'kind': 'train', 'variant': name, 'config':
             f'configs/{TRAIN_TASK}/{os.path.basename(path)}:{TRAIN_OPTIONS}',
             'implementation': implementation, 'dtype': dtype}
      points.append(Point(
          rec, (implementation, dtype), 0,
          lambda i=implementation, d=dtype: lower(i, d),
          make_call(implementation, dtype)))
  return points


class _Chains:
  """Per-chain state: the (length, bytes) and (length, seconds) seen, and
  what the rest of a stopped chain is recorded as."""

  def __init__(self):
    self.memory: dict[Any, list[tuple[int, float]]] = (
        collections.defaultdict(list))
    self.times: dict[Any, list[tuple[int, float]]] = (
        collections.defaultdict(list))
    self.stopped: dict[Any, tuple[str, str]] = {}

  def stop(self, point: Point, rec: dict[str, Any]) -> None:
    """Stops `point`'s chain after its record `rec`: the longer lengths
    are 'not available' or 'does not fit' as it was, else 'not run'."""
    if point.chain in self.stopped or not point.length:
      return
    status = rec['status']
    if status == 'not available':
      self.stopped[point.chain] = (status, rec['reason'])
    else:
      self.stopped[point.chain] = (
          status if status == 'does not fit' else 'not run',
          f'N={point.length} was {status}')

  def skip(self, point: Point) -> bool:
    """Records `point` as its stopped chain says; False if not stopped."""
    if point.chain not in self.stopped:
      return False
    status, reason = self.stopped[point.chain]
    point.record.update(status=status, reason=reason)
    _emit('record', record=point.record)
    return True


def predict_seconds(history: Sequence[tuple[int, float]], length: int
                    ) -> Optional[float]:
  """A call's time at `length` from shorter lengths of its chain: a power
  law through the last two (exponent clipped to [1, 2.5]; 2 from one)."""
  points = sorted((n, t) for n, t in history if t and n < length)
  if not points:
    return None
  exponent = memory.growth_exponent(points) or 2.0
  n1, t1 = points[-1]
  return t1 * (length / n1) ** exponent


NO_TIME_TO_COMPILE = 'no time left to compile (--compile_share of the budget)'


def _compile(lowered: Any) -> tuple[Any, float]:
  """(compiled program, seconds the compile took) of a lowered one."""
  t0 = time.perf_counter()
  compiled = lowered.compile()
  return compiled, time.perf_counter() - t0


def _compile_phase(points: list[Point], pool, chains: _Chains, *,
                   threads: int, deadline: float, grace: float,
                   budget: Optional[float]) -> int:
  """Lowers every point (in this thread) and compiles it on `pool`.

  Each chain goes from short to long, one point in flight at a time; at
  most `threads` chains are in flight, the most important first (the
  order of `points`), so that what the deadline cuts is the least
  important. No compile starts after `deadline`; one still running
  `grace` seconds after it is left behind ('not run'). Records what does
  not get compiled; returns the number of compiles left behind.
  """
  by_chain: dict[Any, collections.deque] = {}
  for p in points:
    by_chain.setdefault(p.chain, collections.deque()).append(p)
  order = list(by_chain)  # Chains not yet exhausted, most important first.
  active: dict[concurrent.futures.Future, Point] = {}

  def finish(p: Point, status: str, reason: str) -> None:
    p.record.update(status=status, reason=reason)
    chains.stop(p, p.record)
    _emit('record', record=p.record)

  def submit_next(chain: Any) -> bool:
    """Submits the chain's next point to compile; False if none is left."""
    todo = by_chain[chain]
    while todo:
      p = todo.popleft()
      if time.time() > deadline:
        p.record.update(status='not run', reason=NO_TIME_TO_COMPILE)
        _emit('record', record=p.record)
        continue
      if chains.skip(p):
        continue
      predicted = memory.predict_bytes(chains.memory[chain], p.length)
      too_big = memory.over_budget(predicted, budget)
      if too_big:
        p.record['predicted_peak_bytes'] = predicted
        finish(p, 'does not fit', too_big)
        continue
      try:
        lowered, extra = p.lower()
      except NotAvailable as e:
        finish(p, 'not available', str(e))
        continue
      except Exception as e:  # pylint: disable=broad-except
        finish(p, 'out of memory' if out_of_memory(e) else 'failed',
               f'lowering: {type(e).__name__}: {str(e)[:1500]}')
        continue
      p.record.update(extra)
      active[pool.submit(_compile, lowered)] = p
      return True
    return False

  def fill() -> None:
    running = {p.chain for p in active.values()}
    for chain in list(order):
      if len(active) >= threads:
        return
      if chain not in running and not submit_next(chain):
        order.remove(chain)

  fill()
  while active:
    done, _ = concurrent.futures.wait(
        active, timeout=max(0.0, deadline + grace - time.time()),
        return_when=concurrent.futures.FIRST_COMPLETED)
    if not done:
      for p in active.values():
        p.record.update(status='not run', reason='its compile had not '
                        f'ended {grace:.0f} s after the compile deadline')
        _emit('record', record=p.record)
      for todo in by_chain.values():
        for p in todo:
          p.record.update(status='not run', reason=NO_TIME_TO_COMPILE)
          _emit('record', record=p.record)
      return len(active)
    for future in done:
      p = active.pop(future)
      try:
        p.compiled, p.record['compile_s'] = future.result()
      except Exception as e:  # pylint: disable=broad-except
        finish(p, 'out of memory' if out_of_memory(e) else 'failed',
               f'compile: {type(e).__name__}: {str(e)[:1500]}')
      else:
        peak = xla_peak_bytes(p.compiled)
        p.record.update(xla_peak_bytes=peak,
                        xla_flops=_xla_flops(p.compiled))
        if peak and p.length:
          chains.memory[p.chain].append((p.length, peak))
        if budget and peak and peak > budget:
          p.compiled = None
          finish(p, 'does not fit', f'XLA assigns {peak / memory.GIB:.1f} '
                 f'GiB > budget {budget / memory.GIB:.1f} GiB')
    fill()
  return 0


def _time_phase(points: list[Point], inits: _Inits, chains: _Chains, *,
                until: float, payload: dict[str, Any]) -> None:
  """Times the compiled points one after another, until `until`."""
  import jax  # pylint: disable=g-import-not-at-top

  device = jax.devices()[0]
  limit = payload['point_timeout_s']
  calls = payload['warmup'] + min(3, payload['repeats'])
  for p in points:
    if p.compiled is None:
      continue
    rec = p.record
    if time.time() > until:
      rec.update(status='not run', reason='time budget: its turn ended')
      _emit('record', record=rec)
      continue
    if chains.skip(p):
      continue
    predicted = predict_seconds(chains.times[p.chain], p.length)
    if predicted and predicted * calls > limit:
      rec.update(status='skipped', predicted_call_s=predicted,
                 reason=f'predicted {predicted:.1f} s per call, '
                        f'{calls} calls > the {limit:.0f} s limit')
      chains.stop(p, rec)
      _emit('record', record=rec)
      continue
    _emit('start', key=point_key(rec))
    try:
      call = p.make_call(inits.run, p.compiled)
      timing = workers.time_calls(
          call, jax.block_until_ready, warmup=payload['warmup'],
          repeats=payload['repeats'],
          max_seconds=payload['max_point_seconds'])
      del call
    except Exception as e:  # pylint: disable=broad-except
      rec.update(status='out of memory' if out_of_memory(e) else 'failed',
                 reason=f'run: {type(e).__name__}: {str(e)[:1500]}')
      chains.stop(p, rec)
    else:
      rec.update(status='ok', **timing)
      rec['spread'] = (max(timing['times_s']) - min(timing['times_s'])
                       ) / timing['time_s']
      if p.length:
        chains.times[p.chain].append((p.length, timing['time_s']))
      if rec['kind'] == 'train':
        rec['steps_per_s'] = 1.0 / timing['time_s']
    stats = device.memory_stats() or {}
    if 'peak_bytes_in_use' in stats:
      rec['device_peak_bytes'] = int(stats['peak_bytes_in_use'])
    p.compiled = None  # Frees the program's constants.
    _emit('record', record=rec)


def _device_budget() -> tuple[Optional[float], dict[str, Any]]:
  """(bytes a point may use, what the device reports) of this process."""
  import jax  # pylint: disable=g-import-not-at-top
  stats = jax.devices()[0].memory_stats() or {}
  limit = stats.get('bytes_limit')
  return (MEMORY_SHARE * limit if limit else None,
          {k: int(v) for k, v in stats.items()
           if k in ('bytes_limit', 'bytes_in_use', 'peak_bytes_in_use',
                    'bytes_reserved')})


def worker_main(payload: dict[str, Any]) -> None:
  """A worker: compiles its points, says 'ready', then on the driver's
  word ({'time_until': epoch seconds} on stdin) times them and exits."""
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top

  started = time.time()
  budget, stats = _device_budget()
  pool = concurrent.futures.ThreadPoolExecutor(payload['compile_threads'])
  inits = _Inits(pool)
  chains = _Chains()
  make = _layer_points if payload['kind'] == 'layer' else _train_points
  try:
    points = make(payload, inits)
  except Exception as e:  # pylint: disable=broad-except
    _emit('fatal', reason=f'{type(e).__name__}: {str(e)[:1500]}')
    return
  _emit('plan', records=[p.record for p in points])
  left_behind = _compile_phase(
      points, pool, chains, threads=payload['compile_threads'],
      deadline=payload['compile_deadline'],
      grace=payload['compile_grace_s'], budget=budget)
  info = dict(environment.jax_device_info(), jax_version=jax.__version__,
              jaxlib_version=jaxlib.__version__)
  _emit('ready', device=info, memory_at_start=stats,
        memory_at_ready=_device_budget()[1],
        compile_phase_s=time.time() - started,
        compiled=sum(p.compiled is not None for p in points),
        compiles_left_behind=left_behind)
  line = sys.stdin.readline()
  if line:  # Else the driver has gone.
    _time_phase(points, inits, chains,
                until=json.loads(line)['time_until'], payload=payload)
    _emit('done')
  sys.stdout.flush()
  # Compiles left behind on the pool must not hold the process (the driver
  # waits for it to exit).
  os._exit(0)  # pylint: disable=protected-access


# ------------------------------------------------------------------ driver


@dataclasses.dataclass
class _Worker:
  variant: Variant
  proc: subprocess.Popen
  records: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
  stderr: list[str] = dataclasses.field(default_factory=list)
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  state: str = 'compiling'  # compiling, ready, timing, done, stopped

  @property
  def label(self) -> str:
    return f'{self.variant.kind} {self.variant.name}'


def _payload(args: argparse.Namespace, variant: Variant,
             compile_deadline: float) -> dict[str, Any]:
  return {'kind': variant.kind, 'name': variant.name,
          'implementations': list(variant.implementations),
          'settings': [list(s) for s in args.setting_list],
          'lengths': args.length_list, 'features': args.features,
          'heads': args.heads, 'train_dtypes': args.train_dtype_list,
          'train_length': args.train_length, 'train_batch': args.train_batch,
          'repeats': args.repeats, 'warmup': args.warmup,
          'max_point_seconds': args.max_point_seconds,
          'point_timeout_s': args.point_timeout_s,
          'compile_threads': args.compile_threads,
          'compile_deadline': compile_deadline,
          'compile_grace_s': _compile_grace(args) / 2}


def _start(variant: Variant, payload: dict[str, Any],
           events: queue.Queue, index: int) -> _Worker:
  # Several processes share the device: none may take most of its memory
  # at start (JAX's default on GPUs).
  env = dict(os.environ)
  env.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  proc = subprocess.Popen(
      [sys.executable, '-m', MODULE, '--worker', json.dumps(payload)],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, bufsize=1, env=env)
  worker = _Worker(variant, proc)

  def read_stdout():
    for line in proc.stdout:
      if line.startswith(EVENT_MARKER):
        events.put((index, json.loads(line[len(EVENT_MARKER):])))
    events.put((index, {'event': 'exit'}))

  def read_stderr():
    for line in proc.stderr:
      worker.stderr.append(line)
      del worker.stderr[:-60]

  for target in (read_stdout, read_stderr):
    threading.Thread(target=target, daemon=True).start()
  return worker


def _handle(worker: _Worker, event: dict[str, Any]) -> None:
  kind = event['event']
  if kind == 'plan':
    for rec in event['records']:
      worker.records[point_key(rec)] = dict(rec, status='pending')
  elif kind == 'record':
    worker.records[point_key(event['record'])] = event['record']
  elif kind == 'ready':
    worker.state = 'ready'
    worker.info = {k: v for k, v in event.items() if k != 'event'}
  elif kind == 'fatal':
    worker.state = 'stopped'
    worker.info['fatal'] = event['reason']
  elif kind == 'done':
    worker.state = 'done'
  elif kind == 'exit' and worker.state not in ('done', 'stopped'):
    worker.state = 'stopped'


def _settle(worker: _Worker, status: str, reason: str) -> None:
  """Marks the worker's points that have no result yet."""
  for key, rec in worker.records.items():
    if rec.get('status') == 'pending':
      worker.records[key] = dict(rec, status=status, reason=reason)


def _stop(worker: _Worker) -> None:
  if worker.proc.poll() is None:
    worker.proc.kill()
  try:
    worker.proc.wait(timeout=30)
  except subprocess.TimeoutExpired:
    pass


def _compile_grace(args: argparse.Namespace) -> float:
  """Seconds past the compile deadline after which the driver stops a
  worker that has not finished compiling; a worker leaves its own
  compiles behind after half of it."""
  return max(30.0, 0.1 * args.budget_s)


# A training step takes about as long to time as this many layer points.
TRAIN_POINT_WEIGHT = 3


def _weight(worker: _Worker) -> int:
  """A worker's claim on the timing phase: its compiled points."""
  points = max(1, worker.info.get('compiled', 0))
  return points * (TRAIN_POINT_WEIGHT if worker.variant.kind == 'train'
                   else 1)


def _kill(worker: _Worker, status: str, reason: str) -> None:
  """Stops a worker and records its unfinished points as `status`."""
  _stop(worker)
  worker.state = 'stopped'
  worker.info['killed'] = reason
  _settle(worker, status, reason)


def _tail(worker: _Worker) -> str:
  return ''.join(worker.stderr)[-1500:].strip()


def run(args: argparse.Namespace, argv: Sequence[str],
        write: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
  """Runs every worker (see the module docstring); `write(report)` is
  called after the compile phase and after every worker's turn."""
  start = time.time()
  compile_deadline = start + args.compile_share * args.budget_s
  time_deadline = start + args.budget_s - args.reserve_s
  events: queue.Queue = queue.Queue()
  pool = [_start(v, _payload(args, v, compile_deadline), events, i)
          for i, v in enumerate(args.variants)]
  workers.log(f'{len(pool)} workers started; compile deadline in '
              f'{compile_deadline - start:.0f} s, outputs at '
              f'{time_deadline - start:.0f} s')
  report = {'command': environment.command_line(argv, MODULE),
            'environment': environment.environment(
                ('jax', 'jaxlib', 'flax', 'numpy', 'jax-cuda12-plugin',
                 'jax-cuda13-plugin')),
            'settings': _settings(args), 'workers': [], 'records': []}

  def snapshot(phase: str) -> dict[str, Any]:
    report['records'] = [r for w in pool for r in w.records.values()]
    report['workers'] = [dict(w.info, name=w.variant.name,
                              kind=w.variant.kind, state=w.state,
                              **({'stderr_tail': _tail(w)} if w.state ==
                                 'stopped' else {})) for w in pool]
    device = next((w.info['device'] for w in pool if 'device' in w.info),
                  None)
    report['device'] = device
    report['phases'] = dict(report.get('phases', {}),
                            **{phase: time.time() - start})
    write(report)
    return report

  def pump(timeout: float) -> None:
    try:
      index, event = events.get(timeout=timeout)
    except queue.Empty:
      return
    w = pool[index]
    before = w.state
    _handle(w, event)
    if event['event'] == 'ready':
      workers.log(f'{w.label}: {w.info["compiled"]} points compiled in '
                  f'{w.info["compile_phase_s"]:.0f} s')
    elif w.state == 'stopped' and before != 'stopped':
      workers.log(f'{w.label}: stopped while compiling: '
                  f'{w.info.get("fatal") or _tail(w)[-300:]}')

  try:
    # Compile phase: until every worker is ready (or gone), with a grace
    # period past the deadline for compiles already running.
    grace = compile_deadline + _compile_grace(args)
    while any(w.state == 'compiling' for w in pool):
      pump(0.5)
      if time.time() > grace:
        for w in pool:
          if w.state == 'compiling':
            _kill(w, 'not run', 'still compiling at the end of the compile '
                  'phase')
        break
    for w in pool:
      if w.state == 'stopped' and 'killed' not in w.info:
        _settle(w, 'failed', w.info.get('fatal')
                or f'its worker exited while compiling: {_tail(w)}')
    workers.log(f'compile phase: {time.time() - start:.0f} s; '
                + ', '.join(f'{w.label}: {w.state}' for w in pool))
    snapshot('compile')

    # Timing phase: one worker at a time, each a share of what is left.
    for i, w in enumerate(pool):
      if w.state != 'ready':
        continue
      weights = [_weight(x) for x in pool[i:] if x.state == 'ready']
      until = time.time() + (time_deadline - time.time()) * (
          weights[0] / sum(weights))
      w.proc.stdin.write(json.dumps({'time_until': until}) + '\n')
      w.proc.stdin.flush()
      w.state = 'timing'
      in_flight: Optional[tuple[str, float]] = None
      while w.state == 'timing':
        try:
          index, event = events.get(timeout=0.5)
        except queue.Empty:
          index, event = None, None
        if event is not None:
          if event['event'] == 'start':
            in_flight = (event['key'], time.time())
          elif event['event'] == 'record':
            in_flight = None
          _handle(pool[index], event)
        now = time.time()
        if in_flight and now - in_flight[1] > args.point_timeout_s:
          w.records[in_flight[0]].update(
              status='timed out',
              reason=f'ran past the {args.point_timeout_s:.0f} s limit')
          _kill(w, 'not run', 'its worker was stopped after a time-out')
        elif now > until + args.point_timeout_s + 10:
          _kill(w, 'not run', 'time budget: its turn ended')
      if w.state == 'stopped' and 'killed' not in w.info:
        _settle(w, 'failed', f'its worker exited: {_tail(w)}')
      _stop(w)
      done = [r for r in w.records.values() if r.get('status') == 'ok']
      workers.log(f'{w.label}: {len(done)} of {len(w.records)} points '
                  f'measured ({time.time() - start:.0f} s)')
      snapshot(f'timed {w.label}')
    for w in pool:
      _stop(w)
      _settle(w, 'not run', 'its worker did not get a turn')
    return snapshot('end')
  except BaseException:
    # Stopped (a signal, an error): the workers go, and the report
    # keeps what was measured.
    while not events.empty():
      index, event = events.get_nowait()
      _handle(pool[index], event)
    for w in pool:
      if w.state != 'done':
        _kill(w, 'not run', 'the benchmark was stopped')
    snapshot('stopped')
    raise


def _settings(args: argparse.Namespace) -> dict[str, Any]:
  return {'variants': [list(v) for v in args.variants],
          'settings': [s.label for s in args.setting_list],
          'lengths': args.length_list, 'features': args.features,
          'heads': args.heads, 'train_task': TRAIN_TASK,
          'train_options': TRAIN_OPTIONS,
          'train_dtypes': args.train_dtype_list,
          'train_length': args.train_length,
          'train_batch': args.train_batch, 'repeats': args.repeats,
          'warmup': args.warmup, 'max_point_seconds': args.max_point_seconds,
          'point_timeout_s': args.point_timeout_s,
          'budget_s': args.budget_s, 'compile_share': args.compile_share,
          'compile_threads': args.compile_threads,
          'memory_share': MEMORY_SHARE, 'reference': REFERENCE}


def main(argv: Sequence[str]) -> None:
  payload = workers.worker_payload(argv)
  if payload is not None:
    worker_main(payload)
    return
  from lra_msmra_tools.benchmark import device_report  # pylint: disable=g-import-not-at-top
  args = parse_args(argv[1:])
  os.makedirs(args.out, exist_ok=True)
  json_path = os.path.join(args.out, 'device.json')
  last: dict[str, Any] = {}

  def write(report):
    last['report'] = device_report.derive(report)
    outputs.write_json(json_path, last['report'])

  def terminate(signum, frame):
    del frame
    raise SystemExit(f'stopped by signal {signum}')

  # A SIGTERM (e.g. from `timeout`) still leaves the report of what was
  # measured: the JSON is rewritten after every worker's turn.
  signal.signal(signal.SIGTERM, terminate)
  try:
    write(run(args, argv, write))
  finally:
    if 'report' in last:
      device_report.write_outputs(last['report'], args.out)
      counts = collections.Counter(r['status']
                                   for r in last['report']['records'])
      workers.log(f'Wrote device.json, device.md and device.png to '
                  f'{args.out}: ' + ', '.join(
                      f'{n} {s}' for s, n in counts.most_common()))


if __name__ == '__main__':
  main(sys.argv)
