r"""Attention benchmark: time, memory and FLOPs of one layer over lengths.

  python -m lra_msmra_tools.benchmark.attention \
      --mechanisms softmax,cst,long_short,adamra,combiner \
      --lengths 1024,2048,4096,8192,16384 --out /tmp/bench_attention

Each mechanism is built by registry name with its class defaults (the LRA
default settings); `name:key=value,key=value` sets knobs, e.g.
`combiner:variant=fixed`, `cst:slice_length=16`,
`adamra:compression_rates=(1/2,1/8)`. The knob `causal=true` is not the
mechanism's: it builds the layer's causal form (`StandaloneAttention.causal`;
default bidirectional). The layer is the one the encoder
builds (`lra_msmra.attention.standalone.StandaloneAttention`, with the
mechanism's shared module), with `--features` model width = qkv width,
`--heads` heads, a `[batch, length, features]` input of random normals and an
all-True padding mask (passed explicitly, as the encoder does).

Modes: `fwd` is the jitted forward pass; `fwd_bwd` is the forward pass and
its VJP with a random cotangent, returning the output and the gradients of
the parameters and of the input. The cotangent is made to depend on the
output (as a loss's gradient does), so the backward pass cannot start
before the forward pass ends. Dropout is off (deterministic).

Per point (mechanism, length, mode) a separate worker process records the
median time, the compile time, the net peak memory and the analytic matmul
FLOPs (`lra_msmra.flops`), plus XLA's own FLOP estimate and
temporary-buffer size where the backend reports them; how time is measured
is in `lra_msmra_tools.benchmark.workers`, how memory is measured and how points
that would not fit are skipped in `lra_msmra_tools.benchmark.memory`. Ratios to
`--baseline` (default softmax) use figures of the same run.

PyTorch (optional, `--torch auto|on|off`): with PyTorch importable, every
point is also run with the straightforward PyTorch version of the same
computation (`lra_msmra_tools.benchmark.torch_reference`) on the same weights, and
a check at `--torch_check_length` compares the two outputs. Without PyTorch
the comparison is skipped and the report says so. `--torch_threads`
sets PyTorch's thread count (default: PyTorch's own, one per core).

Official Transformer-LS (optional, `--official_ls PATH`): PATH is a checkout
of NVIDIA/transformer-ls. Every `long_short` spec is then also run with the
official class `AttentionLS` (`lra/attention_transformer_ls.py`, imported by
path in the PyTorch workers; `lra_msmra_tools.benchmark.official_ls`), built with
the same shapes and knobs and holding our layer's weights. Before timing, its
output is checked against ours at `--torch_check_length` on a partly padded
batch, with the LayerNorm parameters drawn at random so that every weight
matters; real rows must agree within `--official_ls_tolerance` (padded
rows are reported apart: the official code returns the output bias there).
A mismatch is logged as an error, the official points of that spec are not
timed, and the command exits with status 1 after writing the report. The
official points are timed like the port's (same repeats, median, threads),
right after ours at each length and mode; the report gives official/ours
time ratios and the checkout's commit.

Official Combiner (optional, `--official_combiner PATH`): PATH is a checkout
of google-research/google-research. Every causal `combiner` spec whose
configuration one of the official Flax layers computes (fixed, logsparse,
axial rowmajor, mixture with `mixture_mode=joint_softmax`; the table is in
`lra_msmra_tools.benchmark.official_combiner`) is also run with that layer,
loaded by path in the JAX workers and holding our layer's weights. It is
checked against ours like the official Transformer-LS layer (trailing
padding: the official code has none, and causal rows before the padding do
not see it; `--official_combiner_tolerance`), then timed as a JAX point
like ours (compile time, FLOPs and memory too). Other specs are recorded as
unsupported, with the reason.

Host memory: XLA:CPU faults in its per-call temporary buffer page by page;
docs/benchmarks.md ("Page faults") says how glibc's huge page tunable in
the command's environment, which every worker inherits, changes that.
Each record keeps its worker's minor page faults per call.

Outputs in `--out`: `attention.json` (every record, the environment and the
command), `attention.md` (tables) and `attention_time.png`,
`attention_memory.png` (log-log plots).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

from lra_msmra_tools import reporting
from lra_msmra_tools.benchmark import environment
from lra_msmra_tools.benchmark import memory
from lra_msmra_tools.benchmark import official_combiner
from lra_msmra_tools.benchmark import official_ls
from lra_msmra_tools.benchmark import outputs
from lra_msmra_tools.benchmark import specs
from lra_msmra_tools.benchmark import workers

MODULE = 'lra_msmra_tools.benchmark.attention'
MODES = ('fwd', 'fwd_bwd')
MODE_NAMES = {'fwd': 'forward', 'fwd_bwd': 'forward+backward'}
DEFAULT_MECHANISMS = 'softmax,cst,long_short,adamra,combiner'
DEFAULT_LENGTHS = '1024,2048,4096,8192,16384'


class _Official(NamedTuple):
  """Official code the benchmark can time beside one of our mechanisms.

  Attributes:
    option: the option naming its checkout (`--option PATH`, and
      `--option_tolerance`); also its key in the report's settings.
    module: `official_ls` or `official_combiner` (`describe_checkout`,
      `CheckoutError`, `DEFAULT_TOLERANCE`, `compare`).
    what: how messages name it.
    title: the report section's title.
    framework: 'PyTorch' (needs torch, timed in the PyTorch workers) or
      'JAX' (timed as a JAX point).
    example: a spec to suggest when `--mechanisms` lacks the mechanism.
    runs: what the report says about how it is run.
    padded_rows: what it outputs at padded query rows (ours: zeros).
  """
  option: str
  module: Any
  what: str
  title: str
  framework: str
  example: str
  runs: str
  padded_rows: str


# Our mechanism -> the official code compared with it.
OFFICIAL = {
    'long_short': _Official(
        'official_ls', official_ls, 'official AttentionLS',
        'Official Transformer-LS', 'PyTorch',
        'long_short:window_size=8,num_landmarks=32',
        'run in PyTorch on our `long_short` weights (bidirectional, float32, '
        'dropout off)', 'the official code the output bias'),
    'combiner': _Official(
        'official_combiner', official_combiner, 'official Combiner',
        'Official Combiner', 'JAX', 'combiner:variant=axial,causal=true',
        'run in JAX on our causal `combiner` weights (float32, dropout off), '
        'each spec with the official module that computes its configuration '
        '(the table below)',
        'the official code, which has no padding, reads the padded tokens '
        'as ordinary ones'),
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog=f'python -m {MODULE}',
      description='Time, memory and FLOPs of attention layers over lengths.')
  p.add_argument('--mechanisms', default=DEFAULT_MECHANISMS,
                 help='comma-separated names, each optionally name:key=value'
                      ',key=value (default: %(default)s)')
  p.add_argument('--lengths', default=DEFAULT_LENGTHS,
                 help='comma-separated sequence lengths (default: '
                      '%(default)s)')
  p.add_argument('--out', required=True, help='output folder')
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--features', type=int, default=256,
                 help='model width D (= qkv width)')
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--dtype', default='float32',
                 choices=('float32', 'bfloat16'))
  p.add_argument('--modes', default=','.join(MODES),
                 help='comma-separated subset of fwd,fwd_bwd')
  workers.add_measurement_flags(p)
  p.add_argument('--torch', default='auto', choices=('auto', 'on', 'off'),
                 help='PyTorch comparison: auto = if importable')
  p.add_argument('--torch_check_length', type=int, default=256,
                 help='length of the JAX-vs-PyTorch output checks')
  p.add_argument('--torch_threads', type=int, default=0,
                 help='PyTorch threads (0 = PyTorch default)')
  p.add_argument('--official_ls', default=None, metavar='PATH',
                 help='checkout of NVIDIA/transformer-ls: also time its '
                      'AttentionLS on our long_short weights')
  p.add_argument('--official_ls_tolerance', type=float,
                 default=official_ls.DEFAULT_TOLERANCE,
                 help='largest |ours - official| accepted on real rows '
                      '(default: %(default)g)')
  p.add_argument('--official_combiner', default=None, metavar='PATH',
                 help='checkout of google-research/google-research: also '
                      'time its Combiner layers on our causal combiner '
                      'weights')
  p.add_argument('--official_combiner_tolerance', type=float,
                 default=official_combiner.DEFAULT_TOLERANCE,
                 help='largest |ours - official| accepted on real rows '
                      '(default: %(default)g)')
  p.add_argument('--baseline', default='softmax',
                 help='mechanism label the ratios refer to')
  p.add_argument('--growth_from', type=int, default=4096,
                 help='length the growth table divides by')
  args = p.parse_args(argv)
  args.specs, args.length_list = specs.parse_flags(p, args.mechanisms,
                                                  args.lengths)
  args.mode_list = [m.strip() for m in args.modes.split(',') if m.strip()]
  bad = sorted(set(args.mode_list) - set(MODES))
  if bad or not args.mode_list:
    p.error(f'--modes: unknown {bad}; valid: {list(MODES)}')
  for name in ('batch', 'features', 'heads', 'repeats'):
    if getattr(args, name) < 1:
      p.error(f'--{name} must be >= 1')
  if args.torch_threads < 0:
    p.error('--torch_threads must be >= 0 (0 = PyTorch default)')
  if args.features % args.heads:
    p.error(f'--features={args.features} is not divisible by '
            f'--heads={args.heads}')
  from lra_msmra import attention as attention_lib  # pylint: disable=g-import-not-at-top
  for spec in args.specs:
    if spec.name not in attention_lib.REGISTRY:
      p.error(f'unknown mechanism {spec.name!r}; registered: '
              f'{sorted(attention_lib.REGISTRY)}')
    if not isinstance(spec.kw.get('causal', False), bool):
      p.error(f'{spec.label}: causal must be true or false')
  # Our mechanism -> what the report records of its official code.
  args.official = {name: _official_setup(args, name)
                   for name, official in OFFICIAL.items()
                   if getattr(args, official.option) is not None}
  return args


def _official_setup(args: argparse.Namespace, name: str) -> dict[str, Any]:
  """Checks the official option of mechanism `name` and describes its
  checkout; exits in one line."""
  official = OFFICIAL[name]
  option = official.option
  try:
    described = official.module.describe_checkout(getattr(args, option))
  except official.module.CheckoutError as e:
    raise SystemExit(f'error: {e}') from None
  if not any(s.name == name for s in args.specs):
    raise SystemExit(
        f'error: --{option} compares the {official.what} with `{name}`, '
        f'which --mechanisms does not list; add {name} (with its knobs, '
        f'e.g. {official.example}).')
  if official.framework == 'PyTorch' and not _torch_available():
    raise SystemExit(
        f'error: --{option} runs the official PyTorch code, but torch is '
        'not installed; install a CPU build (pip install torch --index-url '
        f'https://download.pytorch.org/whl/cpu) or leave out --{option}.')
  tolerance = getattr(args, f'{option}_tolerance')
  if tolerance <= 0:
    raise SystemExit(f'error: --{option}_tolerance must be > 0.')
  return dict(described, tolerance=tolerance)


# ------------------------------------------------------------------ worker


def _split_causal(kw: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
  """A spec's knobs without `causal`, and `causal` (False if absent).

  `causal` is not a mechanism knob: it selects the layer's causal form
  (`StandaloneAttention.causal`).
  """
  kw = dict(kw)
  return kw, bool(kw.pop('causal', False))


def _port_knobs(kw: Mapping[str, Any]) -> dict[str, Any]:
  """The knobs handed to PyTorch code, which has no causal form:
  `causal=false` (the default) is dropped, `causal=true` kept, so that the
  code refuses it by name."""
  mechanism_kw, causal = _split_causal(kw)
  return dict(kw) if causal else mechanism_kw


def _setup(payload: Mapping[str, Any], length: int):
  """Layer, parameters and inputs of a point (in a worker process)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax.core import FrozenDict  # pylint: disable=g-import-not-at-top
  from lra_msmra.attention import standalone  # pylint: disable=g-import-not-at-top

  dtype = jnp.dtype(payload['dtype'])
  kw, causal = _split_causal(payload['kw'])
  layer = standalone.StandaloneAttention(
      mechanism=payload['name'], kw=FrozenDict(kw), causal=causal,
      num_heads=payload['heads'], qkv_features=payload['features'],
      dtype=dtype, max_len=max(length, payload['length']))
  kx, kp, kg = jax.random.split(jax.random.PRNGKey(0), 3)
  shape = (payload['batch'], length, payload['features'])
  x = jax.random.normal(kx, shape, jnp.float32).astype(dtype)
  g = jax.random.normal(kg, shape, jnp.float32).astype(dtype)
  mask = jnp.ones(shape[:2], bool)
  # Under jit the forward pass inside init is dead code and is removed.
  variables = jax.jit(layer.init)(kp, x, padding_mask=mask)
  params = {'params': variables['params']}
  return layer, params, x, mask, g


def jax_point(payload: Mapping[str, Any]) -> tuple[Callable[..., Any],
                                                    tuple[Any, ...]]:
  """The function a JAX point times and its arguments.

  `payload` holds the point's `name`, `kw`, `batch`, `length`, `features`,
  `heads`, `dtype` and `mode` (`fwd`: the layer's output; `fwd_bwd`: its
  output and the gradients of its parameters and input for a random
  cotangent).
  """
  layer, params, x, mask, g = _setup(payload, payload['length'])
  return _jax_call(payload['mode'],
                   lambda p, x, mask: layer.apply(p, x, padding_mask=mask),
                   params, x, mask, g)


def _jax_call(mode: str, forward: Callable[..., Any], params, x, mask, g
              ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
  """The function a JAX point times (`mode` fwd or fwd_bwd) and its
  arguments, for `forward(params, x, mask)`."""
  import jax  # pylint: disable=g-import-not-at-top

  def forward_backward(params, x, mask, g):
    y, pullback = jax.vjp(lambda p, x: forward(p, x, mask), params, x)
    # In training the cotangent comes from the loss, after the whole forward
    # pass. A cotangent that is just an input would let XLA start the
    # backward pass early and hold its buffers through the forward pass, so
    # it is ordered after the output (XLA's CPU backend drops this
    # barrier; the CPU is not a speed target).
    y, g = jax.lax.optimization_barrier((y, g))
    return y, pullback(g)

  if mode == 'fwd':
    return forward, (params, x, mask)
  return forward_backward, (params, x, mask, g)


def _jax_worker(payload: Mapping[str, Any]) -> dict[str, Any]:
  return _time_jax(payload, *jax_point(payload))


def _time_jax(payload: Mapping[str, Any], fn: Callable[..., Any],
              args: tuple[Any, ...]) -> dict[str, Any]:
  """Compiles `fn(*args)`, counts its FLOPs and times it (a JAX point)."""
  import jax  # pylint: disable=g-import-not-at-top
  from lra_msmra import flops as flops_lib  # pylint: disable=g-import-not-at-top

  counted = flops_lib.matmul_flops(fn, *args)
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  xla_flops = xla_temp = None
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flops = float(cost['flops']) if cost and 'flops' in cost else None
  except Exception:  # pylint: disable=broad-except
    pass  # Not every backend reports a cost model.
  try:
    xla_temp = int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:  # pylint: disable=broad-except
    pass
  with memory.PeakMemory(jax.devices()[0]) as meter:
    timing = workers.time_calls(
        lambda: compiled(*args), jax.block_until_ready,
        warmup=payload['warmup'], repeats=payload['repeats'],
        max_seconds=payload['max_repeat_seconds'])
  result = {'compile_s': compile_s, 'flops': counted['flops'],
            'flops_notes': counted['notes'], 'xla_flops': xla_flops,
            'xla_temp_bytes': xla_temp, 'memory': meter.result(),
            'process_peak_bytes': memory.process_peak_bytes(),
            'device': environment.jax_device_info(),
            **timing}
  result['net_peak_bytes'] = result['memory']['net_peak_bytes']
  return result


def _check_mask(shape: tuple[int, int]):
  """The checks' padding: the last batch row padded over its final quarter."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  length = shape[1]
  mask = np.ones(shape, bool)
  mask[-1, max(1, length - length // 4):] = False
  return mask


def _torch_threads(payload: Mapping[str, Any]) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  if payload.get('torch_threads'):
    torch.set_num_threads(payload['torch_threads'])


def _time_torch(payload: Mapping[str, Any], fn: Callable[..., Any],
                tensors: list[Any], x, g) -> dict[str, Any]:
  """Times `fn(x, all-real mask)` (fwd) or it and `backward(g)` (fwd_bwd).

  `tensors` are the parameters whose gradients forward+backward computes
  (with the input's).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  tx = torch.from_numpy(np.array(x))
  tmask = torch.ones(tx.shape[:2], dtype=torch.bool)
  tg = torch.from_numpy(np.array(g))
  if payload['mode'] == 'fwd':
    def call():
      with torch.no_grad():
        return fn(tx, tmask)
  else:
    for t in tensors:
      t.requires_grad_(True)
    tx.requires_grad_(True)

    def call():
      for t in tensors + [tx]:
        t.grad = None
      y = fn(tx, tmask)
      y.backward(tg)
      return y
  with memory.PeakMemory() as meter:
    timing = workers.time_calls(call, lambda _: None,
                                warmup=payload['warmup'],
                                repeats=payload['repeats'],
                                max_seconds=payload['max_repeat_seconds'])
  result = {'memory': meter.result(),
            'process_peak_bytes': memory.process_peak_bytes(),
            'torch_threads': torch.get_num_threads(),
            'torch_version': torch.__version__,
            **timing}
  result['net_peak_bytes'] = result['memory']['net_peak_bytes']
  return result


def _torch_setup(payload: Mapping[str, Any], what: str):
  """The start of both PyTorch workers: (length, `_setup`'s layer, params,
  x, mask, g) at the check length or the timed length; float32 only."""
  if payload['dtype'] != 'float32':
    raise NotImplementedError(f'The {what} runs in float32 only.')
  _torch_threads(payload)
  length = (payload['check_length'] if payload['mode'] == 'check'
            else payload['length'])
  return length, _setup(payload, length)


def _check_outputs(layer, params, x, mask, other_fn):
  """(mask, ours, theirs) on a partly padded batch, which checks the masking
  as well: our JAX layer and `other_fn(x, mask)` (numpy in and out)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  np_mask = _check_mask(mask.shape)
  y_jax = np.array(layer.apply(params, x, padding_mask=np_mask))
  return np_mask, y_jax, np.asarray(other_fn(np.array(x), np_mask))


def _numpy_call(torch_fn: Callable[..., Any]) -> Callable[..., Any]:
  """A PyTorch callable `torch_fn(x, mask)` as one on numpy arrays."""
  import torch  # pylint: disable=g-import-not-at-top

  def call(x, mask):
    with torch.no_grad():
      return torch_fn(torch.from_numpy(x), torch.from_numpy(mask)).numpy()
  return call


def _torch_worker(payload: Mapping[str, Any]) -> dict[str, Any]:
  """Our PyTorch port (`torch_reference`): its check or one timed point."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from lra_msmra_tools.benchmark import torch_reference  # pylint: disable=g-import-not-at-top

  mode = payload['mode']
  length, (layer, params, x, mask, g) = _torch_setup(payload,
                                                     'PyTorch comparison')
  np_params = jax.device_get(params['params'])
  fn, tensors = torch_reference.build(payload['name'],
                                      _port_knobs(payload['kw']), np_params)
  if mode == 'check':
    np_mask, y_jax, y_torch = _check_outputs(layer, params, x, mask,
                                             _numpy_call(fn))
    diff = float(np.max(np.abs(y_jax - y_torch)))
    scale = float(np.max(np.abs(y_jax)))
    return {'check_length': length, 'max_abs_diff': diff,
            'max_abs_output': scale, 'relative_diff': diff / max(scale, 1e-30)}
  del layer, params, mask
  return _time_torch(payload, fn, tensors, x, g)


def _randomize_norms(params):
  """LayerNorm scales and all biases drawn at random (they start at 1 and 0).

  At their initial values a mistake in mapping them (e.g. swapping LN_L and
  LN_G, or flattening heads in the wrong order) would not change the output;
  drawn, every parameter of the layer matters in the check.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  leaves, tree = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(jax.random.PRNGKey(1), max(len(leaves), 1))
  new = []
  for (path, leaf), key in zip(leaves, keys):
    name = getattr(path[-1], 'key', '')
    if name in ('scale', 'bias'):
      leaf = leaf + 0.5 * jax.random.normal(key, leaf.shape, jnp.float32)
    new.append(leaf)
  return jax.tree_util.tree_unflatten(tree, new)


def _official_ls_worker(payload: Mapping[str, Any]) -> dict[str, Any]:
  """The official `AttentionLS` on our weights: its check or a timed point."""
  import jax  # pylint: disable=g-import-not-at-top

  kw = _port_knobs(payload['kw'])
  official_ls.check_knobs(kw)
  mode = payload['mode']
  length, (layer, params, x, mask, g) = _torch_setup(payload,
                                                     'official comparison')
  if mode == 'check':
    params = _randomize_norms(params)
  module = official_ls.build(
      payload['official_ls'], kw, jax.device_get(params['params']),
      heads=payload['heads'], features=payload['features'], length=length)
  if mode == 'check':
    np_mask, y_ours, y_official = _check_outputs(layer, params, x, mask,
                                                 _numpy_call(module))
    return {'check_length': length,
            **official_ls.compare(y_ours, y_official, np_mask,
                                  payload['tolerance'])}
  del layer, params, mask
  return _time_torch(payload, module, list(module.parameters()), x, g)


def _official_combiner_worker(payload: Mapping[str, Any]) -> dict[str, Any]:
  """The official Combiner layer on our weights: its check or a timed point.

  The check pads the last batch row over its final quarter, which the
  official code (no padding) reads as ordinary tokens: in the causal form
  no real row sees them, so real rows must agree.
  """
  import jax  # pylint: disable=g-import-not-at-top

  if payload['dtype'] != 'float32':
    raise NotImplementedError('The official comparison runs in float32 only.')
  mode = payload['mode']
  length = (payload['check_length'] if mode == 'check'
            else payload['length'])
  # Refuses knobs and lengths before anything is built.
  name, _ = official_combiner.official_config(payload['kw'], length)
  layer, params, x, mask, g = _setup(payload, length)
  if mode == 'check':
    params = _randomize_norms(params)
  module, variables = official_combiner.build(
      payload['official_combiner'], payload['kw'],
      jax.device_get(params['params']), heads=payload['heads'],
      features=payload['features'], length=length)
  if mode == 'check':
    np_mask, y_ours, y_official = _check_outputs(
        layer, params, x, mask, lambda x, _: module.apply(variables, x))
    return {'check_length': length, 'official_class': name,
            **official_combiner.compare(y_ours, y_official, np_mask,
                                        payload['tolerance'])}
  del layer, params
  # The official modules take no padding mask (the points' mask is all
  # real anyway).
  result = _time_jax(payload, *_jax_call(
      mode, lambda p, x, _: module.apply(p, x), variables, x, mask, g))
  return dict(result, official_class=name)


def _official_worker(payload: Mapping[str, Any]) -> dict[str, Any]:
  """The official code compared with the point's mechanism."""
  return {'long_short': _official_ls_worker,
          'combiner': _official_combiner_worker}[payload['name']](payload)


def worker_main(payload: Mapping[str, Any]) -> None:
  """Runs one point and prints its result line."""
  worker = {'jax': _jax_worker, 'torch': _torch_worker,
            'official': _official_worker}[payload['backend']]
  try:
    result = worker(payload)
  except NotImplementedError as e:
    result = {'status': 'unsupported', 'reason': str(e)}
  workers.emit_result(result)


# ------------------------------------------------------------ orchestration


def _torch_available() -> bool:
  return importlib.util.find_spec('torch') is not None


def _payload(args, spec: specs.Spec, backend: str, mode: str, length: int
             ) -> dict[str, Any]:
  payload = {'backend': backend, 'mode': mode, 'name': spec.name,
             'kw': dict(spec.kw), 'length': length, 'batch': args.batch,
             'features': args.features, 'heads': args.heads,
             'dtype': args.dtype, 'repeats': args.repeats,
             'warmup': args.warmup,
             'max_repeat_seconds': args.max_repeat_seconds,
             'check_length': args.torch_check_length,
             'torch_threads': args.torch_threads}
  if backend == 'official':
    option = OFFICIAL[spec.name].option
    payload.update({option: getattr(args, option),
                    'tolerance': getattr(args, f'{option}_tolerance')})
  return payload


def _official_check(args, spec: specs.Spec, budget) -> dict[str, Any]:
  """Runs the official output check of `spec` and logs it (loudly if bad)."""
  check = workers.run_worker(
      MODULE, _payload(args, spec, 'official', 'check', 0),
      memory_budget_bytes=budget, timeout_s=args.timeout_s)
  if check.get('status') == 'ok' and not check['passed']:
    check['status'] = 'mismatch'
    check['reason'] = (
        f'max |ours - official| on real rows {check["max_abs_diff"]:.3e} > '
        f'tolerance {check["tolerance"]:.1e} at N={check["check_length"]}')
  if check['status'] in ('ok', 'unsupported'):
    workers.log(f'[{spec.label}] official check: {check["status"]} '
                f'{check.get("max_abs_diff", check.get("reason", ""))}')
  else:
    workers.log(f'ERROR: [{spec.label}] {OFFICIAL[spec.name].what} check '
                f'{check["status"]}: {check.get("reason", "")}; its points '
                'are not timed and the command will exit with status 1.')
  return check


def _add_ratios(records: list[dict[str, Any]]) -> None:
  """Official time over ours (JAX) and over our port, on official records."""
  idx = _index(records)
  for rec in records:
    if rec['backend'] != 'official' or rec['status'] != 'ok':
      continue
    for other, field in (('jax', 'official_over_jax'),
                         ('torch', 'official_over_port')):
      rec[field] = _div(rec['time_s'], workers.ok_value(
          idx.get((rec['mechanism'], other, rec['mode'], rec['length'])),
          'time_s'))


def _capitalized(text: str) -> str:
  return text[:1].upper() + text[1:]


def _check_name(backend: str, name: str) -> str:
  """How the points not timed after a failed or unsupported check name it."""
  if backend == 'official':
    return _capitalized(OFFICIAL[name].what)
  return 'PyTorch'


def run(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
  """Measures every point and returns the report data."""
  env = environment.environment()
  available = env['memory_available_bytes']
  budget = memory.memory_budget(args.memory_budget_gb, available)
  torch_note = None
  backends = ['jax']
  if args.torch == 'off':
    torch_note = 'PyTorch comparison turned off (--torch off).'
  elif _torch_available():
    backends.append('torch')
  elif args.torch == 'on':
    raise SystemExit('--torch on, but PyTorch is not installed; install it '
                     '(pip install torch) or use --torch auto/off.')
  else:
    torch_note = ('PyTorch comparison skipped: torch is not installed '
                  '(pip install torch to enable it).')
  if torch_note:
    workers.log(torch_note)
  if args.official:
    backends.append('official')
  for name, info in args.official.items():
    official = OFFICIAL[name]
    commit = info['commit'] or info['commit_note']
    workers.log(f'{_capitalized(official.what)} from '
                f'{getattr(args, official.option)} ({commit}).')

  records, checks, official_checks = [], {}, {}
  for spec in args.specs:
    spec_backends = [b for b in backends
                     if b != 'official' or spec.name in args.official]
    if 'torch' in spec_backends:
      check = workers.run_worker(
          MODULE, _payload(args, spec, 'torch', 'check', 0),
          memory_budget_bytes=budget, timeout_s=args.timeout_s)
      checks[spec.label] = check
      workers.log(f'[{spec.label}] torch check: {check.get("status")} '
                  f'{check.get("max_abs_diff", check.get("reason", ""))}')
    if 'official' in spec_backends:
      official_checks[spec.label] = _official_check(args, spec, budget)
    history: dict[tuple[str, str], list[tuple[int, float]]] = {}
    # Device memory once a point measured it (GPU/TPU), else host memory.
    budgets: dict[tuple[str, str], Optional[float]] = {}
    blocked: dict[str, str] = {}
    for length in args.length_list:
      # Per mode, the backends run one after the other, so the points whose
      # times are compared are measured close together.
      for mode in args.mode_list:
        for backend in spec_backends:
          rec = {'mechanism': spec.label, 'name': spec.name,
                 'kw': dict(spec.kw), 'backend': backend, 'mode': mode,
                 'length': length}
          check = {'torch': checks, 'official': official_checks}.get(
              backend, {}).get(spec.label)
          key = (backend, mode)
          # The JAX point of this length and mode runs first: its growth
          # guides the PyTorch prediction when PyTorch has a single shorter
          # point.
          hint = memory.growth_exponent(history.get(('jax', mode), []))
          predicted = memory.predict_bytes(history.get(key, []), length,
                                           hint if backend != 'jax'
                                           else None)
          if check and check['status'] != 'ok':
            rec.update(status='unsupported' if check['status'] ==
                       'unsupported' else 'skipped',
                       reason=f'{_check_name(backend, spec.name)} check '
                              f'{check["status"]}: '
                              f'{check.get("reason", "")}')
          elif key in blocked:
            rec.update(status='skipped', reason=blocked[key])
          elif memory.over_budget(predicted, budgets.get(key, budget)):
            rec.update(status='skipped', predicted_peak_bytes=predicted,
                       reason=memory.over_budget(
                           predicted, budgets.get(key, budget)))
          else:
            result = workers.run_worker(
                MODULE, _payload(args, spec, backend, mode, length),
                memory_budget_bytes=budget, timeout_s=args.timeout_s)
            rec.update(result)
            if predicted:
              rec['predicted_peak_bytes'] = predicted
          if rec['status'] == 'ok':
            history.setdefault(key, []).append(
                (length, memory.measured_bytes(rec)))
            budgets[key] = memory.prediction_budget(
                rec, args.memory_budget_gb, budget)
          elif key not in blocked:
            blocked[key] = memory.not_run_reason(length, rec)
          records.append(rec)
          workers.log(_describe(rec))
  _add_ratios(records)
  end_load = list(os.getloadavg())
  return {
      'command': environment.command_line(argv, MODULE),
      'environment': env, 'load_average_end': end_load,
      'settings': {
          'mechanisms': [s.label for s in args.specs],
          'lengths': args.length_list, 'modes': args.mode_list,
          'batch': args.batch, 'features': args.features,
          'heads': args.heads, 'head_dim': args.features // args.heads,
          'dtype': args.dtype, 'repeats': args.repeats,
          'warmup': args.warmup, 'baseline': args.baseline,
          'memory_budget_bytes': budget, 'backends': backends,
          'torch_note': torch_note, 'torch_threads': args.torch_threads,
          **{official.option: args.official.get(name)
             for name, official in OFFICIAL.items()}},
      'torch_checks': checks,
      'official_checks': official_checks,
      'records': records,
  }


def failed_official_checks(report: Mapping[str, Any],
                           name: Optional[str] = None) -> list[str]:
  """`label: reason` of every official check that failed or mismatched
  (of mechanism `name` only, if given)."""
  failed = []
  for label, c in report.get('official_checks', {}).items():
    if name is not None and specs.parse_specs(label)[0].name != name:
      continue
    if c.get('status') not in ('ok', 'unsupported'):
      reason = ' '.join(str(c.get('reason', '')).split())
      failed.append(f'{label}: {c["status"]}: {reason[-400:]}')
  return failed


def _describe(rec: Mapping[str, Any]) -> str:
  head = (f'[{rec["mechanism"]}] {rec["backend"]} {rec["mode"]} '
          f'N={rec["length"]}: ')
  if rec['status'] != 'ok':
    return head + f'{rec["status"]} ({rec.get("reason", "")})'
  faults = rec.get('faults_per_call')
  return head + (f'{outputs.fmt_time(rec["time_s"])}, net peak '
                 f'{reporting.fmt_bytes(rec["net_peak_bytes"])}' +
                 ('' if faults is None else
                  f', {faults:,.0f} page faults per call'))


# ------------------------------------------------------------------ report


def _index(records):
  return {(r['mechanism'], r['backend'], r['mode'], r['length']): r
          for r in records}


def _div(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return None if a is None or b is None or b == 0 else a / b


def _cell_missing(rec: Optional[Mapping[str, Any]]) -> str:
  if rec is None:
    return '—'
  return {'skipped': 'skipped', 'failed': 'failed',
          'unsupported': 'n/a'}.get(rec.get('status'), '—')


def _length_table(idx, mechs, lengths, backend: str, mode: str,
                  field: str, cell: Callable[[str, str, int, float], str]
                  ) -> str:
  """A row per mechanism, a column per length, of one measured field.

  `cell(mode, mechanism, length, value)` formats a measured point's
  `field`; points without it show why (`_cell_missing`).
  """
  rows = []
  for m in mechs:
    row = [f'`{m}`']
    for n in lengths:
      rec = idx.get((m, backend, mode, n))
      value = workers.ok_value(rec, field)
      row.append(_cell_missing(rec) if value is None
                 else cell(mode, m, n, value))
    rows.append(row)
  return reporting.markdown_table(['mechanism'] + [str(n) for n in lengths],
                                  rows)


def markdown(report: Mapping[str, Any]) -> str:
  s = report['settings']
  env = report['environment']
  idx = _index(report['records'])
  mechs, lengths, base = s['mechanisms'], s['lengths'], s['baseline']
  has_base = base in mechs
  device = next((r['device'] for r in report['records']
                 if r.get('status') == 'ok' and r.get('device')), {})
  lines = [
      '# Attention benchmark', '',
      f'Command: `{report["command"]}`', '',
      f'- Date (UTC): {env["date_utc"]}',
      f'- Device: {device.get("device_kind", "?")} '
      f'({device.get("backend", "?")}); CPU: {env["cpu"]}, '
      f'{env.get("cores", str(env["cpu_count"]) + " CPU cores")}',
      f'- Shapes: batch {s["batch"]}, width {s["features"]}, '
      f'{s["heads"]} heads of {s["head_dim"]}, dtype {s["dtype"]}; '
      'all-real padding mask; dropout off',
      '- Versions: ' + ', '.join(f'{k} {v}' for k, v in
                                   env['versions'].items() if v),
      '- Load average (1, 5, 15 min) at start: '
      + ', '.join(f'{x:.2f}' for x in env['load_average'])
      + '; at end: ' + ', '.join(f'{x:.2f}' for x in
                                  report['load_average_end']),
      f'- Memory budget for skipping: '
      f'{reporting.fmt_bytes(s["memory_budget_bytes"])}',
      f'- Time: median of up to {s["repeats"]} calls after compilation and '
      f'{s["warmup"]} warm-up call(s). Memory: net peak (resident '
      'high-water mark during the calls minus resident size before them, '
      'one process per point; device peak on GPU/TPU).', '']
  if not has_base:
    lines += [f'Baseline `{base}` was not measured: no ratios.', '']
  def base_value(mode, n, field):
    return workers.ok_value(idx.get((base, 'jax', mode, n)), field)

  def time_cell(mode, m, n, t):
    speedup = _div(base_value(mode, n, 'time_s'), t)
    return outputs.fmt_time(t) + (
        f' ({outputs.fmt_ratio(speedup, 1)})' if speedup and m != base else '')

  def memory_cell(mode, m, n, b):
    frac = _div(b, base_value(mode, n, 'net_peak_bytes'))
    return reporting.fmt_bytes(b) + (
        f' ({frac:.3f} of `{base}`)' if frac is not None and m != base
        else '')

  def flops_cell(mode, m, n, f):
    t = workers.ok_value(idx.get((m, 'jax', mode, n)), 'time_s')
    return f'{outputs.fmt_flops(f)}, {f / t / 1e9:.1f} GFLOP/s'

  for title, field, cell in (
      (f'time (speed-up over `{base}` in this run)', 'time_s', time_cell),
      ('net peak memory', 'net_peak_bytes', memory_cell),
      ('matmul FLOPs and achieved rate', 'flops', flops_cell)):
    for mode in s['modes']:
      lines += [f'## {MODE_NAMES[mode].capitalize()} {title}', '',
                _length_table(idx, mechs, lengths, 'jax', mode, field, cell),
                '']
  longer = [n for n in lengths if n > s.get('growth_from', 4096)]
  ref = report.get('growth_from', 4096)
  if ref in lengths and longer:
    for mode in s['modes']:
      rows = []
      for m in mechs:
        t0 = workers.ok_value(idx.get((m, 'jax', mode, ref)), 'time_s')
        rows.append([f'`{m}`'] + [
            outputs.fmt_ratio(_div(workers.ok_value(
                idx.get((m, 'jax', mode, n)), 'time_s'), t0), 1)
            for n in longer])
      lines += [f'## {MODE_NAMES[mode].capitalize()} time growth from '
                f'N={ref}', '',
                reporting.markdown_table(['mechanism'] + [
                    f'{n} / {ref}' for n in longer], rows), '']
  rows = []
  for m in mechs:
    for mode in s['modes']:
      rows.append([f'`{m}`', mode] + [
          outputs.fmt_time(workers.ok_value(idx.get((m, 'jax', mode, n)),
                                            'compile_s'))
          for n in lengths])
  lines += ['## Compile time', '',
            reporting.markdown_table(['mechanism', 'mode'] + [
                str(n) for n in lengths], rows), '']
  lines += _torch_section(report, idx, mechs, lengths)
  lines += _official_section(report, idx, mechs, lengths)
  problems = [r for r in report['records'] if r['status'] != 'ok']
  if problems:
    lines += ['## Points not measured', '']
    lines += [f'- `{r["mechanism"]}` {r["backend"]} {r["mode"]} '
              f'N={r["length"]}: {r["status"]}: {r.get("reason", "")}'
              for r in problems]
    lines.append('')
  return '\n'.join(lines)


def _torch_section(report, idx, mechs, lengths) -> list[str]:
  s = report['settings']
  lines = ['## PyTorch comparison (our port, `torch_reference`)', '']
  if 'torch' not in s['backends']:
    return lines + [s['torch_note'] or 'Not run.', '']
  rows = []
  for m in mechs:
    c = report['torch_checks'].get(m, {})
    if c.get('status') == 'ok':
      rows.append([f'`{m}`', c['check_length'], f'{c["max_abs_diff"]:.2e}',
                   f'{c["relative_diff"]:.2e}'])
    else:
      rows.append([f'`{m}`', '—', c.get('status', '—'),
                   c.get('reason', '')[:120]])
  version = next((r.get('torch_version') for r in report['records']
                  if r.get('torch_version')), '?')
  threads = next((r.get('torch_threads') for r in report['records']
                  if r.get('torch_threads')), '?')
  lines += [f'Our straightforward PyTorch port of each mechanism. PyTorch '
            f'{version}, {threads} threads. Output check on the '
            'same weights (last batch row padded over its final quarter):',
            '', reporting.markdown_table(
                ['mechanism', 'length', 'max abs(JAX − PyTorch)',
                 'relative'], rows), '']
  def torch_cell(mode, m, n, tt):
    tj = workers.ok_value(idx.get((m, 'jax', mode, n)), 'time_s')
    return f'{outputs.fmt_time(tt)} (JAX {outputs.fmt_ratio(_div(tt, tj), 2)})'

  for mode in s['modes']:
    lines += [f'### Our PyTorch port: {MODE_NAMES[mode]} time (JAX speed-up '
              'over the port: > 1× means JAX is faster)', '',
              _length_table(idx, mechs, lengths, 'torch', mode, 'time_s',
                            torch_cell), '']
  return lines


def _official_section(report, idx, mechs, lengths) -> list[str]:
  """The official code's columns: checkout, check, times, ratios."""
  lines = []
  for name, official in OFFICIAL.items():
    info = report['settings'].get(official.option)
    if info:
      labels = [m for m in mechs if m in report['official_checks']
                and specs.parse_specs(m)[0].name == name]
      lines += _official_lines(report, idx, labels, lengths, official, info)
  return lines


def _official_lines(report, idx, labels, lengths, official: _Official,
                    info: Mapping[str, Any]) -> list[str]:
  """The report section of one official code, for its specs `labels`."""
  s = report['settings']
  commit = (f'commit `{info["commit"]}`' if info['commit']
            else info['commit_note'])
  if info.get('file_modified'):
    commit += ', with local changes to its files'
  lines = [f'## {official.title} (`{official.option}`)', '',
           f'`{info["class"]}` from `{info["file"]}` of {info["repository"]} '
           f'({commit}; file sha256 `{info["file_sha256"][:16]}…`), '
           f'{official.runs}.', '']
  checks = [report['official_checks'][m] for m in labels]
  layers = any('official_class' in c for c in checks)
  rows = []
  for m, c in zip(labels, checks):
    layer = [f'`{c["official_class"]}`' if 'official_class' in c
             else '—'] if layers else []
    if 'max_abs_diff' in c:
      padded = c['max_abs_diff_padded_rows']
      rows.append([f'`{m}`'] + layer + [
          c['check_length'], f'{c["max_abs_diff"]:.2e}',
          f'{c["relative_diff"]:.2e}',
          '—' if padded is None else f'{padded:.2e}',
          f'{c["tolerance"]:.0e}', c['status']])
    else:
      rows.append([f'`{m}`'] + layer + [
          '—', '—', '—', '—', '—',
          f'{c.get("status", "—")}: {c.get("reason", "")[:160]}'])
  lines += ['Output check on the same weights, LayerNorm scales and biases '
            'drawn at random, last batch row padded over its final quarter '
            '(padded rows reported apart: ours outputs zeros there, '
            f'{official.padded_rows}):', '',
            reporting.markdown_table(
                ['mechanism'] + (['official layer'] if layers else [])
                + ['length', 'max abs(ours − official), real rows',
                   'relative', 'padded rows', 'tolerance', 'status'], rows),
            '']

  def official_cell(mode, m, n, t):
    rec = idx.get((m, 'official', mode, n), {})
    ratios = [f'{name} {outputs.fmt_ratio(rec.get(field), 2)}'
              for name, field in (('/ ours', 'official_over_jax'),
                                  ('/ port', 'official_over_port'))
              if rec.get(field) is not None]
    return outputs.fmt_time(t) + (f' ({", ".join(ratios)})' if ratios else '')

  def memory_cell(mode, m, n, b):
    ours = workers.ok_value(idx.get((m, 'jax', mode, n)), 'net_peak_bytes')
    ratio = _div(b, ours)
    return reporting.fmt_bytes(b) + (
        '' if ratio is None else f' (/ ours {outputs.fmt_ratio(ratio, 2)})')

  # The port is named only where it was timed beside the official code.
  port = any(rec.get('official_over_port') is not None
             for (m, backend, _, _), rec in idx.items()
             if backend == 'official' and m in labels)
  versus = 'ours (JAX) and / our PyTorch port' if port else 'ours'
  for mode in s['modes']:
    lines += [f'### {official.title}: {MODE_NAMES[mode]} time (official '
              f'time / {versus}: > 1× means the official code is slower)',
              '', _length_table(idx, labels, lengths, 'official', mode,
                                'time_s', official_cell), '']

  def faults_cell(mode, m, n, f):
    ours = workers.ok_value(idx.get((m, 'jax', mode, n)), 'faults_per_call')
    return (f'{f:,.0f}' + ('' if ours is None else f' (ours {ours:,.0f})'))

  if any(r.get('faults_per_call') is not None for r in idx.values()):
    for mode in s['modes']:
      lines += [f'### {official.title}: {MODE_NAMES[mode]} minor page faults '
                'per call (official, and ours)', '',
                _length_table(idx, labels, lengths, 'official', mode,
                              'faults_per_call', faults_cell), '']
  for mode in s['modes']:
    lines += [f'### {official.title}: {MODE_NAMES[mode]} net peak memory '
              '(official / ours: > 1× means the official code holds more)',
              '', _length_table(idx, labels, lengths, 'official', mode,
                                'net_peak_bytes', memory_cell), '']
  return lines


_BACKEND_LABELS = {'jax': '', 'torch': ' (our PyTorch port)',
                   'official': ' (official)'}
_BACKEND_STYLES = {'jax': '-', 'torch': '--', 'official': ':'}
_STYLE_NAMES = {'-': 'solid', '--': 'dashed', ':': 'dotted'}
_BACKEND_NAMES = {'jax': 'JAX', 'torch': 'our PyTorch port',
                  'official': 'official code'}


def style_key(panels: Sequence[Mapping[str, Any]]) -> str:
  """' (solid: JAX, dashed: ...)' for the backends with a line drawn in
  `panels` ('' when only one is drawn: the labels say it)."""
  drawn = [b for b in _BACKEND_STYLES
           if any(s['backend'] == b and any(y is not None
                                            for _, y in s['points'])
                  for p in panels for s in p['series'])]
  if len(drawn) < 2:
    return ''
  return ' (' + ', '.join(f'{_STYLE_NAMES[_BACKEND_STYLES[b]]}: '
                          f'{_BACKEND_NAMES[b]}' for b in drawn) + ')'


def plot(report: Mapping[str, Any], out: str) -> list[str]:
  s = report['settings']
  idx = _index(report['records'])
  paths = []
  for field, ylabel, name in (('time_s', 'median time (s)', 'time'),
                              ('net_peak_bytes', 'net peak memory (MiB)',
                               'memory')):
    panels = []
    for mode in s['modes']:
      series = []
      for m in s['mechanisms']:
        for backend in s['backends']:
          pts = []
          for n in s['lengths']:
            v = workers.ok_value(idx.get((m, backend, mode, n)), field)
            if v is not None and field == 'net_peak_bytes':
              v = v / reporting.MIB
            pts.append((n, v))
          series.append({'label': m + _BACKEND_LABELS[backend],
                         'points': pts, 'color_key': m, 'backend': backend,
                         'style': _BACKEND_STYLES[backend]})
      panels.append({'title': MODE_NAMES[mode], 'ylabel': ylabel,
                     'series': series})
    path = os.path.join(out, f'attention_{name}.png')
    outputs.plot_panels(
        path, panels, 'sequence length N',
        f'batch {s["batch"]}, D={s["features"]}, {s["heads"]} heads, '
        f'{s["dtype"]}{style_key(panels)}')
    paths.append(path)
  return paths


def main(argv: Sequence[str]) -> None:
  payload = workers.worker_payload(argv)
  if payload is not None:
    worker_main(payload)
    return
  args = parse_args(argv[1:])
  os.makedirs(args.out, exist_ok=True)
  report = run(args, argv)
  report['growth_from'] = args.growth_from
  report['settings']['growth_from'] = args.growth_from
  outputs.write_json(os.path.join(args.out, 'attention.json'), report)
  with open(os.path.join(args.out, 'attention.md'), 'w') as f:
    f.write(markdown(report) + '\n')
  plot(report, args.out)
  workers.log(f'Wrote attention.json, attention.md and plots to {args.out}')
  errors = []
  for name, official in OFFICIAL.items():
    failed = failed_official_checks(report, name)
    if failed:
      errors.append(
          f'the {official.what} output check failed (' + '; '.join(failed)
          + '); its points were not timed. The mapping of our weights '
          f'(lra_msmra_tools/benchmark/{official.module.__name__.split(".")[-1]}'
          '.py) or the official checkout differs from what the comparison '
          'assumes.')
  if errors:
    raise SystemExit('error: ' + ' '.join(errors))


if __name__ == '__main__':
  main(sys.argv)
