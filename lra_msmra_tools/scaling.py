r"""TPU and GPU readiness, checked on a CPU: lowering and memory per device.

  python -m lra_msmra_tools.scaling --configs 'configs/pathx/*.py' --devices 8

For every config file given (default: every config of every task), at the
config's own size and global batch, with nothing allocated:

1. The trainer's jitted training step (forward, loss, backward, optimizer
   update) and evaluation step (`lra_msmra.steps.jit_steps`), over a
   data-parallel mesh of `--devices` devices, are lowered for TPU and GPU
   with `jax.export.export(..., platforms=('tpu', 'cuda'))`. A step that does
   not lower is reported per platform with the operation that failed.
2. Figures: the parameters and the bytes of parameters and optimizer state
   per device (exact: the train state's shapes, replicated on every
   device); the matmul FLOPs of one training step on the global batch
   (`lra_msmra.flops`, exact for our implementation); and, from
   one device's share of the batch, estimates of the activations: what the
   forward pass saves for the backward pass, the largest single
   intermediate, and optionally (`--xla_cpu`) XLA's own buffer sizes for the
   step compiled for the CPU. docs/scaling.md says how each is derived.

The command runs on the CPU with `--devices` fake devices, set up before JAX
starts (which is why JAX is imported inside the functions here).
`tests/test_export.py` runs step 1 for every config at `runlocal` size in
float32 and bfloat16.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import math
import os
import shlex
import sys
from typing import Any, Callable, Iterable, Optional, Sequence

PLATFORMS = ('tpu', 'cuda')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_ROOT = os.path.join(ROOT, 'configs')


def config_files(root: str = CONFIG_ROOT) -> list[str]:
  """Every config file of every task folder (`configs/*/*.py`).

  `base.py` (a task's shared settings) and `configs/common/` (a mechanism's
  shared settings) hold no config.
  """
  return sorted(
      f for f in glob.glob(os.path.join(root, '*', '*.py'))
      if os.path.basename(f) != 'base.py'
      and os.path.basename(os.path.dirname(f)) != 'common')


def config_name(path: str) -> str:
  """`<task>/<file>.py` of a config file."""
  return os.path.join(os.path.basename(os.path.dirname(path)),
                      os.path.basename(path))


def load_config(path: str, options: Optional[str] = None):
  from lra_msmra import config_lib  # pylint: disable=g-import-not-at-top
  module = config_lib.load_sibling(path, os.path.basename(path)[:-3])
  return module.get_config(options or None)


# ------------------------------------------------------------ the programs


@dataclasses.dataclass
class Program:
  """A jitted function and the abstract arguments it is lowered with."""
  name: str
  fn: Callable[..., Any]
  args: tuple[Any, ...]


@dataclasses.dataclass
class Steps:
  """The train and eval steps of a config over a mesh, shapes only."""
  config: Any
  spec: dict[str, Any]
  model: Any
  state: Any  # ShapeDtypeStructs of the train state, with shardings.
  train: Program
  eval: Program


def build_steps(config, mesh, abstract: Any = None) -> Steps:
  """The trainer's jitted steps of `config` over `mesh`, with their inputs.

  The batch sizes are the config's (global); the state and batches are
  `jax.ShapeDtypeStruct`s with the trainer's shardings. `abstract`, the
  train state's shapes (`steps.abstract_train_state`), may be passed in
  when already known: it does not depend on `config.model.dtype`.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from lra_msmra import data as data_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra import sharding  # pylint: disable=g-import-not-at-top
  from lra_msmra import steps as steps_lib  # pylint: disable=g-import-not-at-top

  spec = data_lib.get_model_spec(config)
  model, tx, schedule = steps_lib.build(config, spec)
  if abstract is None:
    abstract = steps_lib.abstract_train_state(config, spec)
  state_sharding = jax.tree.map(lambda _: sharding.replicated(mesh), abstract)
  state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, state_sharding)
  train_fn, eval_fn = steps_lib.jit_steps(config, model, tx, schedule, mesh,
                                          state_sharding)
  train_batch = steps_lib.abstract_batch(spec, config.batch_size, mesh)
  eval_batch = steps_lib.abstract_batch(spec, config.eval_batch_size, mesh,
                                        train=False)
  return Steps(
      config=config, spec=spec, model=model, state=state,
      train=Program('train_step', train_fn, (state, train_batch)),
      eval=Program('eval_step', eval_fn, (state.params, eval_batch)))


def _one_line(text: str, limit: int = 2000) -> str:
  text = ' '.join(text.split())
  return text if len(text) <= limit else text[:limit] + ' ...'


def _lower(program: Program, platforms: Sequence[str], use_export: bool
           ) -> None:
  if use_export:
    from jax import export  # pylint: disable=g-import-not-at-top
    export.export(program.fn, platforms=tuple(platforms))(*program.args)
  else:
    program.fn.trace(*program.args).lower(
        lowering_platforms=tuple(platforms))


def lowering_failures(program: Program,
                      platforms: Sequence[str] = PLATFORMS, *,
                      use_export: bool = False) -> list[str]:
  """Lowers `program` for `platforms`; returns one line per failure.

  By default the program is lowered as `jax.jit` lowers it on those
  platforms (`.trace(...).lower(lowering_platforms=...)`, what the trainer
  runs there); `use_export` goes through `jax.export.export` instead, which
  lowers the same way for serialization and also checks that every custom
  call it emits is a stable one. One multi-platform lowering covers all
  platforms; only if it fails is each platform lowered alone, to name the
  ones that fail. A line reads `<step> on <platform>: <exception>`; the
  exception names the operation (primitive or custom call) that has no
  lowering there.
  """
  try:
    _lower(program, platforms, use_export)
    return []
  except Exception as e:  # pylint: disable=broad-except
    joint = e
  failures = []
  for platform in platforms if len(platforms) > 1 else ():
    try:
      _lower(program, (platform,), use_export)
    except Exception as e:  # pylint: disable=broad-except
      failures.append(f'{program.name} on {platform}: '
                      f'{type(e).__name__}: {_one_line(str(e))}')
  if not failures:  # Fails only together, or a single platform was asked.
    failures.append(f'{program.name} on {"+".join(platforms)}: '
                    f'{type(joint).__name__}: '
                    f'{_one_line(str(joint))}')
  return failures


# ------------------------------------------------------------- the figures


def _nbytes(avals: Iterable[Any]) -> int:
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in avals)


def _leaves(tree: Any) -> list[Any]:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_leaves(tree)


def local_config(config, devices: int):
  """The config of one device's share: batch sizes divided by `devices`.

  Under data parallelism every device runs the step of the global batch
  split `devices` ways, plus the all-reduce of the gradients.
  """
  local = config.copy_and_resolve_references()
  local.batch_size = config.batch_size // devices
  local.eval_batch_size = max(1, config.eval_batch_size // devices)
  return local


def saved_activations(steps: Steps) -> list[Any]:
  """Avals the forward pass of one micro-batch keeps for the backward pass.

  The residuals of `jax.vjp` of the training loss (`steps.loss_fn`) with
  respect to the parameters, as JAX's autodiff produces them before XLA
  optimises the program; the parameters themselves (counted as parameters),
  literals and duplicates are left out.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from lra_msmra import steps as steps_lib  # pylint: disable=g-import-not-at-top

  state, batch = steps.train.args
  k = steps.config.grad_accum_steps
  micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      (x.shape[0] // k,) + x.shape[1:], x.dtype), batch)
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                        state.params)
  loss = lambda p, b: steps_lib.loss_fn(p, b, jax.random.PRNGKey(0),
                                        model=steps.model)
  closed, shapes = jax.make_jaxpr(
      lambda p, b: jax.vjp(lambda q: loss(q, b), p, has_aux=True),
      return_shape=True)(params, micro)
  # Outputs: the loss, the pullback's residuals, the metrics.
  start = len(_leaves(shapes[0]))
  stop = start + len(_leaves(shapes[1]))
  jaxpr = closed.jaxpr
  inputs = set(jaxpr.invars[:len(_leaves(params))])
  seen, out = set(), []
  for var in jaxpr.outvars[start:stop]:
    if hasattr(var, 'val') or var in inputs or var in seen:
      continue  # A literal, a parameter, or already counted.
    seen.add(var)
    out.append(var.aval)
  return out


def largest_intermediate(jaxpr: Any) -> tuple[int, str]:
  """Bytes and description of the largest array a jaxpr computes."""
  from lra_msmra import flops as flops_lib  # pylint: disable=g-import-not-at-top
  best = (0, '')
  for eqn in getattr(jaxpr, 'jaxpr', jaxpr).eqns:
    subs = [j for v in eqn.params.values() for j in flops_lib.sub_jaxprs(v)]
    # The outputs of a call-like wrapper are computed inside it; a loop's
    # stacked outputs are its own.
    if not subs or eqn.primitive.name in ('scan', 'while'):
      for var in eqn.outvars:
        aval = var.aval
        if not hasattr(aval, 'shape') or not hasattr(aval, 'dtype'):
          continue
        size = _nbytes([aval])
        if size > best[0]:
          best = (size, f'{aval.dtype.name}{list(aval.shape)} '
                        f'({eqn.primitive.name})')
    for sub in subs:
      best = max(best, largest_intermediate(sub), key=lambda b: b[0])
  return best


@dataclasses.dataclass
class Figures:
  """One config's figures for one device count (bytes are per device)."""
  config: str
  attention: str
  length: int
  batch_size: int
  devices: int
  dtype: str
  params: int
  param_bytes: int
  opt_state_bytes: int
  train_flops: int  # The whole global batch.
  activation_bytes: int
  largest_bytes: int
  largest: str
  failures: list[str]
  # XLA's buffers for one device's step compiled for the CPU (`xla_cpu`).
  xla_temp_bytes: Optional[int] = None
  xla_total_bytes: Optional[int] = None

  @property
  def estimated_peak_bytes(self) -> int:
    """Parameters, gradients, optimizer state, saved activations and the
    largest intermediate."""
    return (2 * self.param_bytes + self.opt_state_bytes
            + self.activation_bytes + self.largest_bytes)


def xla_cpu_memory(local: Steps) -> tuple[int, int]:
  """XLA's temporary and total buffer bytes of one device's training step.

  `local` is built from `local_config` on one device; its step is compiled
  for the CPU (compiling allocates nothing) and `memory_analysis()` read:
  temporaries, and arguments + temporaries + outputs not aliased to the
  (donated) arguments.
  """
  m = local.train.fn.trace(*local.train.args).lower().compile(
  ).memory_analysis()
  total = (m.argument_size_in_bytes + m.temp_size_in_bytes
           + m.output_size_in_bytes - m.alias_size_in_bytes)
  return int(m.temp_size_in_bytes), int(total)


def figures(config, mesh, name: str = '',
            platforms: Sequence[str] = PLATFORMS,
            xla_cpu: bool = False) -> Figures:
  """Lowers a config's steps for `platforms` over `mesh`; its figures.

  Lowering and FLOPs use the global step over `mesh`; the memory figures
  use one device's step (`local_config`, on one device). `xla_cpu` adds
  `xla_cpu_memory` (a compilation: seconds to minutes).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from lra_msmra import sharding  # pylint: disable=g-import-not-at-top
  from lra_msmra import flops as flops_lib  # pylint: disable=g-import-not-at-top

  devices = mesh.devices.size
  steps = build_steps(config, mesh)
  failures = []
  if platforms:
    for program in (steps.train, steps.eval):
      failures += lowering_failures(program, platforms, use_export=True)
  flops = flops_lib.matmul_flops(steps.train.fn, *steps.train.args)['flops']
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          steps.state)
  local = build_steps(local_config(config, devices),
                      sharding.create_mesh(jax.devices()[:1]), abstract)
  largest_bytes, largest = largest_intermediate(
      jax.make_jaxpr(local.train.fn)(*local.train.args))
  xla_temp = xla_total = None
  if xla_cpu:
    xla_temp, xla_total = xla_cpu_memory(local)
  return Figures(
      config=name, attention=config.model.attention,
      length=steps.spec['max_len'], batch_size=config.batch_size,
      devices=devices, dtype=config.model.dtype,
      params=sum(math.prod(x.shape) for x in _leaves(abstract.params)),
      param_bytes=_nbytes(_leaves(abstract.params)),
      opt_state_bytes=_nbytes(_leaves(abstract.opt_state)),
      train_flops=flops, activation_bytes=_nbytes(saved_activations(local)),
      largest_bytes=largest_bytes, largest=largest, failures=failures,
      xla_temp_bytes=xla_temp, xla_total_bytes=xla_total)


# ---------------------------------------------------------------- reports


def _fmt_bytes(value: float) -> str:
  for unit, size in (('GiB', 2 ** 30), ('MiB', 2 ** 20), ('KiB', 2 ** 10)):
    if value >= size:
      return f'{value / size:.3g} {unit}' if value < 1000 * size else (
          f'{value / size:,.0f} {unit}')
  return f'{value:.0f} B'


def _fmt_flops(value: float) -> str:
  for unit, size in (('PFLOP', 1e15), ('TFLOP', 1e12), ('GFLOP', 1e9),
                     ('MFLOP', 1e6)):
    if value >= size:
      return f'{value / size:.3g} {unit}'
  return f'{value:.0f} FLOP'


HEADER = ('config', 'length', 'batch', 'parameters', 'FLOPs / step',
          'parameter bytes', 'optimizer state', 'saved activations',
          'largest intermediate', 'estimated peak', 'XLA CPU temp / total',
          'lowers')


def row(f: Figures, platforms: Sequence[str] = PLATFORMS) -> list[str]:
  lowers = ('—' if not platforms else
            'yes' if not f.failures else 'NO (see below)')
  xla = ('—' if f.xla_total_bytes is None else
         f'{_fmt_bytes(f.xla_temp_bytes)} / {_fmt_bytes(f.xla_total_bytes)}')
  return [f'`{f.config}`', str(f.length), str(f.batch_size), f'{f.params:,}',
          _fmt_flops(f.train_flops), _fmt_bytes(f.param_bytes),
          _fmt_bytes(f.opt_state_bytes), _fmt_bytes(f.activation_bytes),
          f'{_fmt_bytes(f.largest_bytes)} `{f.largest}`',
          _fmt_bytes(f.estimated_peak_bytes), xla, lowers]


def markdown(results: Sequence[Figures | tuple[str, str]],
             platforms: Sequence[str] = PLATFORMS) -> str:
  """A markdown table of `results` (Figures, or (config, error) pairs)."""
  lines = ['| ' + ' | '.join(HEADER) + ' |',
           '|' + '|'.join('---' for _ in HEADER) + '|']
  problems = []
  for r in results:
    if isinstance(r, Figures):
      lines.append('| ' + ' | '.join(row(r, platforms)) + ' |')
      problems += [f'- `{r.config}` ({r.dtype}): {x}' for x in r.failures]
    else:
      name, error = r
      lines.append('| ' + ' | '.join([f'`{name}`'] + ['—'] * (len(HEADER) - 2)
                                     + ['error (see below)']) + ' |')
      problems.append(f'- `{name}`: {error}')
  if problems:
    lines += ['', 'Not lowered or not built:', ''] + problems
  return '\n'.join(lines)


def _use_fake_cpu_devices(count: int) -> None:
  """Before JAX starts: run on the CPU with `count` devices."""
  if 'jax' in sys.modules:
    return
  os.environ['JAX_PLATFORMS'] = 'cpu'
  flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  flags.append(f'--xla_force_host_platform_device_count={count}')
  os.environ['XLA_FLAGS'] = ' '.join(flags)
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog='python -m lra_msmra_tools.scaling',
      description='Lower every config for TPU and GPU and report its size '
                  'per device, shapes only.')
  p.add_argument('--configs', nargs='*', default=None,
                 help='config files or glob patterns (default: every config '
                      'of every task)')
  p.add_argument('--devices', type=int, default=8,
                 help='devices of the data-parallel mesh (default 8)')
  p.add_argument('--options', default='',
                 help='config options, e.g. xiong, cst or runlocal')
  p.add_argument('--dtype', default=None, choices=('float32', 'bfloat16'),
                 help='activation dtype (default: the config\'s)')
  p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                 help='config override, e.g. batch_size=32 or '
                      'grad_accum_steps=4 (repeatable)')
  p.add_argument('--platforms', default=','.join(PLATFORMS),
                 help='platforms to lower for, comma-separated; empty to '
                      'skip lowering')
  p.add_argument('--xla_cpu', action='store_true',
                 help='also compile each device\'s step for the CPU and '
                      'report XLA\'s buffer sizes (minutes per config)')
  p.add_argument('--out', default=None, help='also write the table here')
  args = p.parse_args(argv)
  if args.devices < 1:
    p.error('--devices must be >= 1')
  paths = []
  for pattern in args.configs or [CONFIG_ROOT]:
    if os.path.isdir(pattern):
      paths += config_files(pattern)
    else:
      found = sorted(glob.glob(pattern))
      if not found:
        p.error(f'no config file matches {pattern!r}')
      paths += [f for f in found if os.path.basename(f) != 'base.py'
                and os.path.basename(os.path.dirname(f)) != 'common']
  args.paths = paths
  args.platform_list = tuple(x for x in args.platforms.split(',') if x)
  return args


def _apply_override(config, item: str) -> None:
  import ast  # pylint: disable=g-import-not-at-top
  key, sep, value = item.partition('=')
  if not sep:
    raise ValueError(f'--set {item!r}: expected KEY=VALUE.')
  try:
    value = ast.literal_eval(value)
  except (ValueError, SyntaxError):
    pass  # A string.
  *path, last = key.split('.')
  target = config
  for part in path:
    target = target[part]
  target[last] = value


def main(argv: Sequence[str]) -> int:
  args = parse_args(argv[1:])
  _use_fake_cpu_devices(args.devices)
  import jax  # pylint: disable=g-import-not-at-top
  from lra_msmra import sharding  # pylint: disable=g-import-not-at-top
  from lra_msmra import validation  # pylint: disable=g-import-not-at-top

  if jax.device_count() < args.devices:
    raise SystemExit(f'{jax.device_count()} devices, --devices '
                     f'{args.devices}: start with XLA_FLAGS='
                     f'--xla_force_host_platform_device_count={args.devices}.')
  mesh = sharding.create_mesh(jax.devices()[:args.devices])
  results = []
  for path in args.paths:
    name = os.path.relpath(path, ROOT) if path.startswith(ROOT) else path
    try:
      config = load_config(path, args.options)
      if args.dtype:
        config.model.dtype = args.dtype
      for item in args.set:
        _apply_override(config, item)
      validation.validate(config)
      sharding.check_batch_size('batch_size', config.batch_size, mesh,
                                config.grad_accum_steps)
      sharding.check_batch_size('eval_batch_size', config.eval_batch_size,
                                mesh)
      result = figures(config, mesh, name, args.platform_list, args.xla_cpu)
    except Exception as e:  # pylint: disable=broad-except
      result = (name, f'{type(e).__name__}: {_one_line(str(e))}')
    results.append(result)
    print(f'{name}: ' + ('error' if isinstance(result, tuple) else
                         'ok' if not result.failures else 'NOT LOWERED'),
          file=sys.stderr, flush=True)
  shown, skip = [], False  # The command as typed, less where it writes.
  for arg in argv[1:]:
    if skip or arg.startswith('--out'):
      skip = arg == '--out'
      continue
    shown.append(shlex.quote(arg))
  command = 'python -m lra_msmra_tools.scaling ' + ' '.join(shown)
  date = datetime.date.today().isoformat()
  text = (f'`{command.strip()}` ({date}, JAX {jax.__version__}): '
          f'{args.devices} devices, global batch split over them; bytes are '
          f'per device; activations in {args.dtype or "the config dtype"}'
          f'; lowered for {", ".join(args.platform_list) or "no platform"}.'
          '\n\n' + markdown(results, args.platform_list))
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text + '\n')
  bad = [r for r in results
         if isinstance(r, tuple) or r.failures]
  return 1 if bad else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
