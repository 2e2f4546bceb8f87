r"""Compiles a config's train and eval steps for TPUs and GPUs, on a CPU.

  python -m lra_msmra_tools.compile --config configs/pathx/cst.py \
      --target v5e:4x4 [--target h200:8 ...] [--config.KEY=VALUE ...] \
      [--dtype bfloat16] [--implementation pallas] [--per_device_batch N] \
      [--max_batch_search N] [--jobs N] [--out FILE] [--require_fit]

For every target (`lra_msmra_tools.targets`: `v5e:2x2`, `v5e-4`, `v4-8`,
`v5p:2x2x1`, `v6e:4x4`, `h100:8`, `h200:2x8`, ...) the trainer's jitted train
step (forward, loss, backward, optimizer update, state donated) and eval
step (`lra_msmra.steps.jit_steps` through `lra_msmra_tools.scaling.build_steps`),
at the config's global batch, over a data-parallel mesh of all the target's
devices, are compiled for real by the target's own compiler (libtpu; XLA's
CUDA compiler down to sm_90a machine code) against compile-only devices:
nothing runs and no accelerator is needed. What the compile checks, and
what it cannot, is in docs/scaling.md ("Compiled for the target").

One markdown table, one row per (config, target), figures per device:

* state (parameters + optimizer state), temporaries, outputs and total from
  the compiled training step's `memory_analysis()`: total = arguments +
  outputs + temporaries - aliased (the donated state) + generated code;
  the eval step's total beside it;
* HBM per device and fits / does NOT fit. TPU: the compiler itself refuses
  a program that does not fit its HBM (it keeps a little for the runtime,
  15.75 of 16 GiB on v5e) after trying to rematerialise, and a program it
  compiles fits. GPU: XLA compiles any size; the tool compares the larger
  total with `--usable` (default 90%) of the GPU's memory, leaving the rest
  for the CUDA context, cuBLAS/cuDNN workspaces and fragmentation. (JAX's
  default preallocation takes 75%; the launchers set
  XLA_PYTHON_CLIENT_PREALLOCATE=false.);
* the largest per-device training batch that fits, by bisection over
  compiles of the training step (`--max_batch_search` compiles at most);
* compile time of the two steps;
* FLOPs of the training step per device, counted as the trainer counts
  them (`lra_msmra.train.train_step_flops`: matmuls of the jaxpr of the
  'xla' implementation, since XLA's cost analysis cannot see inside Pallas
  kernels), bytes accessed (TPU: XLA's cost analysis; GPU: none), and a
  roofline ESTIMATE of the step time, max(FLOPs / peak, bytes / bandwidth)
  with the peaks of `lra_msmra.hardware`;
* GPU targets with Pallas kernels: each kernel's shared memory (XLA's
  thunk sequence), registers and spills (`ptxas -v` on the PTX XLA wrote).
  A kernel that spills registers fails the compile (XLA's
  `--xla_gpu_fail_ptx_compilation_on_register_spilling`), reported as a
  failure naming the kernel.

The cells compile in `--jobs` worker processes (default: one per core), each
with the environment `targets.prepare_environment` sets. A wrong target, a
missing compile package and a config that does not fit each print one line
(`error: ...` or `... does NOT fit ...`) on stderr; the exit status is 1
for errors and failed compiles, and for configs that do not fit only with
`--require_fit`.

The "Where it fits" table of every task's full-size config on v5e-4, v4-8,
v5p-8, 8 H100s and 8 H200s is a command of its own built on this one:
`python -m lra_msmra_tools.fits`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import glob
import math
import multiprocessing
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

from lra_msmra_tools import reporting
from lra_msmra_tools import targets
from lra_msmra_tools.benchmark import outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = 'python -m lra_msmra_tools.compile'
# GPU targets: the fraction of the GPU's memory a program may use.
DEFAULT_USABLE = 0.9
DEFAULT_MAX_BATCH_SEARCH = 4
# The largest per-device batch the search tries.
MAX_PER_DEVICE_BATCH = 1 << 20


def _one_line(text: Any, limit: int = 600) -> str:
  text = ' '.join(str(text).split())
  return text if len(text) <= limit else text[:limit] + ' ...'


def cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not on Linux.
    return os.cpu_count() or 1


# ------------------------------------------------------------------ a cell


@dataclasses.dataclass
class Job:
  """One (config, target) cell: what a worker process compiles."""
  label: str  # The config as given, with its options and overrides.
  config: Any  # ml_collections.ConfigDict, settings applied.
  target: str
  per_device_batch: Optional[int] = None
  max_batch_search: int = DEFAULT_MAX_BATCH_SEARCH
  usable: float = DEFAULT_USABLE
  kernel_stats: bool = True


def usable_bytes(target: targets.Target, usable: float) -> int:
  """The bytes a program may take per device on `target`.

  TPU: the whole HBM (the compiler itself refuses what does not fit and
  keeps the runtime's share); GPU: `usable` of its memory.
  """
  return int(target.hbm_bytes * (1.0 if target.platform == 'tpu' else usable))


def _memory(compiled: Any) -> dict[str, int]:
  m = compiled.memory_analysis()
  out = {k: int(getattr(m, f'{k}_size_in_bytes', 0) or 0) for k in
         ('argument', 'output', 'temp', 'alias', 'generated_code')}
  out['total'] = (out['argument'] + out['output'] + out['temp']
                  - out['alias'] + out['generated_code'])
  return out


def _cost(compiled: Any) -> dict[str, float]:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return {}
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost:
    return {}
  return {k: float(cost[k]) for k in ('flops', 'bytes accessed')
          if k in cost and cost[k] is not None}


_UNITS = {'': 1, 'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
_TPU_OOM = re.compile(
    r'required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available '
    r'HBM \(([\d.]+)([KMGT]?)\)')
_TPU_USED = re.compile(r'Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm')


def parse_oom(text: str) -> Optional[int]:
  """Bytes a TPU program needed, from libtpu's out-of-memory message."""
  for pattern in (_TPU_OOM, _TPU_USED):
    m = pattern.search(text)
    if m:
      return int(float(m.group(1)) * _UNITS[m.group(2)])
  return None


def is_out_of_memory(text: str) -> bool:
  """Whether a failed compile says the program does not fit the device
  (not a kernel beyond a GPU block's shared memory, a kernel's own fault)."""
  lower = text.lower()
  return ('RESOURCE_EXHAUSTED' in text and 'shared memory' not in lower
          and ('memory' in lower or 'hbm' in lower))


def _spilling_kernel(text: str) -> Optional[str]:
  for pattern in (r"entry function '([\w$.]+)'", r'kernel[ :]+"?([\w$.]+)"?',
                  r"function '([\w$.]+)'"):
    m = re.search(pattern, text)
    if m:
      return m.group(1)
  return None


class CompileFailure(Exception):
  """A compile that failed for a reason other than memory."""


def compile_once(fn: Any, args: Sequence[Any], target: targets.Target,
                 dump_dir: Optional[str] = None, spill_check: bool = True
                 ) -> tuple[Any, float]:
  """`fn.trace(*args).lower().compile()` for `target`; (compiled, seconds).

  With `target.compiler_options(spill_check)` (False lets GPU kernels that
  spill registers compile) and, GPU, XLA's dump in `dump_dir` if given.
  """
  options = target.compiler_options(spill_check)
  if options is not None and dump_dir:
    options['xla_dump_to'] = dump_dir
  lowered = fn.trace(*args).lower()
  start = time.perf_counter()
  compiled = lowered.compile(compiler_options=options) if options else (
      lowered.compile())
  return compiled, time.perf_counter() - start


def failure_line(error: BaseException) -> str:
  """One line for a failed compile; a register spill names its kernel."""
  text = str(error)
  if 'spill' in text.lower():
    kernel = _spilling_kernel(text)
    where = f'kernel {kernel} ' if kernel else 'a kernel '
    return (f'{where}spills registers (compile fails under '
            f'{targets.SPILL_FLAG}): {_one_line(text, 400)}')
  return f'{type(error).__name__}: {_one_line(text)}'


# ------------------------------------------------------- GPU kernel figures


def _spills(k: dict[str, Any]) -> int:
  return k.get('spill_stores', 0) + k.get('spill_loads', 0)


def _spill_names(kernels: Sequence[dict[str, Any]]) -> str:
  """'kernel X (R registers, S B spill stores, L B spill loads) spills
  registers', for one kernel or several."""
  names = ', '.join(f'{k["kernel"]} ({k.get("registers", "?")} registers, '
                    f'{k.get("spill_stores", 0)} B spill stores, '
                    f'{k.get("spill_loads", 0)} B spill loads)'
                    for k in kernels)
  if len(kernels) == 1:
    return f'kernel {names} spills registers'
  return f'kernels {names} spill registers'


def find_ptxas() -> Optional[str]:
  """ptxas: $PTXAS, the nvidia-cuda-nvcc-cu12 wheel's, or one on PATH."""
  if os.environ.get('PTXAS'):
    return os.environ['PTXAS']
  try:
    import nvidia.cuda_nvcc  # pylint: disable=g-import-not-at-top
    for folder in getattr(nvidia.cuda_nvcc, '__path__', []):
      path = os.path.join(folder, 'bin', 'ptxas')
      if os.access(path, os.X_OK):
        return path
  except ImportError:
    pass
  return shutil.which('ptxas')


_THUNK = re.compile(r'kCustomKernel\s+\[[^\]]*\]\s+(\S+) grid: \[([^\]]*)\] '
                    r'threads: \[([^\]]*)\]\s+shared_memory: (\d+) bytes')
_ENTRY = re.compile(r'^\.(?:visible\s+)?\.entry\s+([\w$]+)\(', re.M)
_PTXAS_FUNCTION = re.compile(r"Function properties for ([\w$]+)")
_PTXAS_SPILLS = re.compile(r'(\d+) bytes spill stores, (\d+) bytes spill loads')
_PTXAS_REGISTERS = re.compile(r'Used (\d+) registers')


def _base(kernel: str) -> str:
  return re.sub(r'__\d+$', '', kernel)


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
  """Registers and spills per function from `ptxas -v` output."""
  out: dict[str, dict[str, int]] = {}
  current = None
  for line in text.splitlines():
    m = _PTXAS_FUNCTION.search(line)
    if m:
      current = out.setdefault(m.group(1), {})
      continue
    m = re.search(r"Compiling entry function '([\w$]+)'", line)
    if m:
      current = out.setdefault(m.group(1), {})
      continue
    if current is None:
      continue
    m = _PTXAS_SPILLS.search(line)
    if m:
      current['spill_stores'] = int(m.group(1))
      current['spill_loads'] = int(m.group(2))
    m = _PTXAS_REGISTERS.search(line)
    if m:
      current['registers'] = int(m.group(1))
  return out


def gpu_kernel_stats(dump_dir: str, arch: str = 'sm_90a',
                     every_function: bool = False) -> dict[str, Any]:
  """The Pallas (Triton) kernels of a GPU compile dumped to `dump_dir`.

  Kernel names come from the `__gpu$xla.gpu.triton` custom calls of the
  optimized HLO; their launch shapes and shared memory from XLA's thunk
  sequence; registers and spills from `ptxas -v` on the PTX files that
  define them (when ptxas is found). Returns {'kernels': [...], 'note': str}
  and, with `every_function`, `other_spills`: XLA's own kernels that spill
  (every PTX file is then assembled, seconds to a minute).
  """
  names: set[str] = set()
  for path in glob.glob(os.path.join(dump_dir, '*after_optimizations.txt')):
    with open(path, encoding='utf-8', errors='replace') as f:
      for line in f:
        if 'xla.gpu.triton' in line:
          found = re.findall(r', name = "([^"]+)"', line)
          if found:
            names.add(found[-1])
  kernels: dict[str, dict[str, Any]] = {}
  for path in glob.glob(os.path.join(dump_dir, '*thunk_sequence.txt')):
    with open(path, encoding='utf-8', errors='replace') as f:
      for m in _THUNK.finditer(f.read()):
        name = m.group(1)
        if _base(name) in names:
          kernels.setdefault(name, {
              'kernel': name, 'grid': m.group(2).replace(' ', ''),
              'threads': m.group(3).replace(' ', ''),
              'shared_memory': int(m.group(4))})
  note = ''
  others: list[dict[str, Any]] = []
  ptxas = find_ptxas()
  if (names or every_function) and ptxas is None:
    note = ('registers not counted: no ptxas (pip install '
            'nvidia-cuda-nvcc-cu12, in requirements-compile.txt)')
  elif names or every_function:
    for path in sorted(glob.glob(os.path.join(dump_dir, '*.ptx'))):
      with open(path, encoding='utf-8', errors='replace') as f:
        entries = _ENTRY.findall(f.read())
      if not every_function and not any(_base(e) in names for e in entries):
        continue
      run = subprocess.run([ptxas, '-v', f'-arch={arch}', path, '-o',
                            os.devnull], capture_output=True, text=True,
                           check=False)
      for function, figures in parse_ptxas(run.stdout + run.stderr).items():
        if function in kernels:
          kernels[function].update(figures)
        elif _base(function) in names:
          kernels[function] = dict(kernel=function, **figures)
        elif _spills(figures):
          others.append(dict(kernel=function, **figures))
  out = {'kernels': sorted(kernels.values(), key=lambda k: k['kernel']),
         'note': note}
  if every_function:
    out['other_spills'] = others
  return out


# ---------------------------------------------------------- batch search


@dataclasses.dataclass
class Search:
  """The bisection's outcome: per-device training batches."""
  largest_fit: Optional[int]  # The largest batch compiled and fitting.
  smallest_no_fit: Optional[int]  # The smallest known not to fit.
  exact: bool  # smallest_no_fit == largest_fit + one step.
  compiles: int
  seconds: float
  points: list[tuple[int, Optional[int]]]  # (batch, total bytes or None).


def search_batch(measure: Callable[[int], Optional[int]], start: int,
                 start_bytes: Optional[int], limit: int, unit: int,
                 budget: int, fixed_bytes: Optional[int] = None,
                 maximum: int = MAX_PER_DEVICE_BATCH) -> Search:
  """The largest per-device batch (a multiple of `unit`) whose training step
  fits in `limit` bytes, by bisection over compiles.

  `measure(b)` compiles at per-device batch `b` and returns the total bytes
  per device, or None when the compiler refuses it for memory. `start` was
  measured already (`start_bytes`). Memory grows about linearly with the
  batch, but not exactly (XLA fuses and, on TPU, rematerialises differently
  at other sizes), so the search keeps a batch that compiled and fits (lo)
  below one that does not (hi) and guesses where the line through what it
  knows meets the limit: first the line through `fixed_bytes` (the part
  that does not grow with the batch: state, outputs, code) at batch 0 and
  the start; then the line through lo and hi when both have a size, else
  through the two measured batches nearest below the boundary. A guess at or
  below lo checks the next batch up; one at or above hi, or the third guess
  in a row on the same side of an interval, halves it instead. At most
  `budget` compiles.
  """
  t0 = time.perf_counter()
  points: list[tuple[int, Optional[int]]] = [(start, start_bytes)]
  sizes = {start: start_bytes}
  fits = lambda m: m is not None and m <= limit
  lo = start if fits(start_bytes) else None
  hi = None if fits(start_bytes) else start
  outcomes: list[bool] = []  # Fit or not, of the search's own compiles.
  compiles = 0

  def line(b1: int, m1: float, b2: int, m2: float) -> Optional[int]:
    if b2 == b1 or m2 <= m1:
      return None
    slope = (m2 - m1) / (b2 - b1)
    return int(b1 + (limit - m1) / slope)

  while compiles < budget:
    if lo is not None and hi is not None and hi - lo <= unit:
      break
    if lo is None and hi is not None and hi <= unit:
      break  # Not even the smallest batch fits.
    guess = None
    stalled = (lo is not None and hi is not None and len(outcomes) >= 2
               and outcomes[-1] == outcomes[-2])
    if not stalled:
      measured = sorted((b, m) for b, m in sizes.items() if m is not None)
      if lo is not None and hi is not None and sizes.get(hi) is not None:
        guess = line(lo, sizes[lo], hi, sizes[hi])
      elif lo is not None:
        below = [p for p in measured if p[0] <= lo]
        if len(below) >= 2:
          guess = line(*below[-2], *below[-1])
      if guess is None and len(measured) == 1 and fixed_bytes is not None:
        (b1, m1), = measured
        guess = line(0, fixed_bytes, b1, m1)
    if guess is None:  # Halve the interval, or double a batch that fits.
      if hi is None:
        guess = 2 * lo
      else:
        guess = ((lo or 0) + hi) // 2
    guess = max(unit, guess // unit * unit)
    if lo is not None and guess <= lo:
      guess = lo + unit  # Check the next one up.
    if hi is not None and guess >= hi:
      guess = max(unit, ((lo or 0) + hi) // 2 // unit * unit)
      if lo is not None and guess <= lo:
        guess = lo + unit
      if guess >= hi:
        break
    guess = min(guess, maximum)
    if lo is not None and guess <= lo:
      break  # At the maximum.
    total = measure(guess)
    compiles += 1
    points.append((guess, total))
    sizes[guess] = total
    outcomes.append(fits(total))
    if fits(total):
      lo = guess
    else:
      hi = guess if hi is None else min(hi, guess)
  exact = lo is not None and hi is not None and hi - lo <= unit
  if lo is None and hi is not None and hi <= unit:
    exact = True
  return Search(largest_fit=lo, smallest_no_fit=hi, exact=exact,
                compiles=compiles, seconds=time.perf_counter() - t0,
                points=points)


# ---------------------------------------------------------------- a worker


def _nbytes(tree: Any) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return sum(math.prod(x.shape) * x.dtype.itemsize
             for x in jax.tree_util.tree_leaves(tree))


def is_spill(text: str) -> bool:
  return 'register spilling' in text or 'spills registers' in text


def compile_step(program: Any, target: targets.Target, kernel_stats: bool
                 ) -> dict[str, Any]:
  """Compiles one step for `target`; its memory, cost and problems.

  Returns the memory figures (`_memory`), `seconds`, `cost`, and
  `failures` and `notes` (lines); `oom` with the bytes libtpu reports when
  the program does not fit a TPU's HBM (and, in `seconds_total`, the time
  until that refusal); `kernels` (GPU, `kernel_stats`):
  each Pallas kernel's shared memory, registers and spills.

  GPU compiles fail on any kernel that spills registers
  (`targets.SPILL_FLAG`), XLA's own fusions included. On that failure the
  step is compiled again without the check, dumping its PTX, and `ptxas -v`
  tells which kernels spill: a Pallas kernel that spills is a failure; a
  spill only in XLA's own fusions is a note (it is XLA's code, not ours),
  and the figures come from that second compile.
  """
  out: dict[str, Any] = {'failures': [], 'notes': []}
  dump_dir = tempfile.mkdtemp(prefix='lra_compile_dump_') if (
      kernel_stats) else None
  try:
    start = time.perf_counter()
    try:
      compiled, seconds = compile_once(program.fn, program.args, target,
                                       dump_dir)
    except Exception as e:  # pylint: disable=broad-except
      text = str(e)
      if is_out_of_memory(text):
        # The time until the refusal (tracing and lowering included).
        out.update(oom=True, total=parse_oom(text),
                   message=_one_line(text, 300),
                   seconds_total=time.perf_counter() - start)
        return out
      if not (target.platform == 'cuda' and is_spill(text)):
        out['failures'].append(failure_line(e))
        return out
      shutil.rmtree(dump_dir or '', ignore_errors=True)
      dump_dir = tempfile.mkdtemp(prefix='lra_compile_dump_')
      try:
        compiled, seconds = compile_once(program.fn, program.args, target,
                                         dump_dir, spill_check=False)
      except Exception as e2:  # pylint: disable=broad-except
        out['failures'].append(failure_line(e))
        out['failures'].append(f'without the spill check: {failure_line(e2)}')
        return out
      stats = gpu_kernel_stats(dump_dir, every_function=True)
      ours = [k for k in stats['kernels'] if _spills(k)]
      theirs = stats.get('other_spills', [])
      if ours:
        out['failures'].append(failure_line(e).replace(
            'a kernel spills registers', _spill_names(ours), 1))
      elif theirs:
        out['notes'].append(
            f'XLA\'s own {_spill_names(theirs)} (`ptxas -v`), no Pallas '
            'kernel does; figures from a compile without the spill check')
      else:
        out['failures'].append(
            failure_line(e) + ' (ptxas -v finds no spilling kernel: '
            + (stats['note'] or 'its version differs from XLA\'s') + ')')
      if kernel_stats:
        out['kernels'] = stats
    out.update(_memory(compiled), seconds=round(seconds, 2),
               cost=_cost(compiled), seconds_total=seconds)
    if kernel_stats and 'kernels' not in out:
      out['kernels'] = gpu_kernel_stats(dump_dir)
    return out
  finally:
    if dump_dir:
      shutil.rmtree(dump_dir, ignore_errors=True)


def run_cell(job: Job) -> dict[str, Any]:
  """Compiles one (config, target) cell; returns its figures (a worker job).

  Never raises: a problem is returned as `error` (the cell was not built)
  or `failures` (a step did not compile), one line each.
  """
  t_start = time.perf_counter()
  targets.prepare_environment()
  out: dict[str, Any] = {'config': job.label, 'target': job.target}
  try:
    target = targets.parse(job.target)
    out.update(target=target.name, label=target.label,
               platform=target.platform, devices=target.num_devices,
               hosts=target.num_hosts, hbm_bytes=target.hbm_bytes,
               usable_bytes=usable_bytes(target, job.usable),
               device_kind=target.device_kind)
    from lra_msmra_tools import scaling  # pylint: disable=g-import-not-at-top
    from lra_msmra import sharding  # pylint: disable=g-import-not-at-top
    # pylint: disable=g-import-not-at-top
    from lra_msmra import steps as steps_lib
    from lra_msmra import train as train_lib
    # pylint: enable=g-import-not-at-top
    from lra_msmra import validation  # pylint: disable=g-import-not-at-top

    config = job.config
    n = target.num_devices
    mesh = sharding.create_mesh(target.devices())
    if job.per_device_batch:
      config.batch_size = job.per_device_batch * n
      config.eval_batch_size = job.per_device_batch * n
    sharding.check_batch_size('batch_size', config.batch_size, mesh,
                              config.grad_accum_steps)
    sharding.check_batch_size('eval_batch_size', config.eval_batch_size, mesh)
    spec, abstract = validation.trace(config)
    steps = scaling.build_steps(config, mesh, abstract)
  except targets.MissingPackage as e:
    out['error'] = str(e)
    return out
  except Exception as e:  # pylint: disable=broad-except
    out['error'] = f'{type(e).__name__}: {_one_line(e)}'
    return out
  per_device = config.batch_size // n
  out.update(
      length=spec['max_len'], dtype=config.model.dtype,
      implementation=config.model.attention_kw.get('implementation', 'xla'),
      batch_size=config.batch_size, per_device_batch=per_device,
      eval_batch_size=config.eval_batch_size,
      grad_accum_steps=config.grad_accum_steps,
      state_bytes=_nbytes(abstract), param_bytes=_nbytes(abstract.params),
      opt_state_bytes=_nbytes(abstract.opt_state), failures=[])
  limit = usable_bytes(target, job.usable)
  want_kernels = (job.kernel_stats and target.platform == 'cuda'
                  and out['implementation'] != 'xla')
  compile_seconds = 0.0
  out['notes'] = []
  for program in (steps.train, steps.eval):
    key = 'train' if program is steps.train else 'eval'
    step = compile_step(program, target,
                        want_kernels and key == 'train')
    compile_seconds += step.pop('seconds_total', 0.0)
    out['failures'] += [f'{program.name}: {f}' for f in step.pop('failures')]
    out['notes'] += [f'{program.name}: {line}'
                     for line in step.pop('notes')]
    kernels = step.pop('kernels', None)
    if kernels is not None and key == 'train':
      out['kernels'] = kernels
    if step:
      out[key] = step
  out['compile_seconds'] = round(compile_seconds, 2)

  # FLOPs as the trainer counts them (the 'xla' implementation's matmuls).
  try:
    flops = train_lib.train_step_flops(config, spec, steps.train.fn,
                                       steps.state, mesh)
    out['flops'] = flops['flops']
    out['flops_per_device'] = flops['flops'] / n
    out['flops_notes'] = flops['notes']
  except Exception as e:  # pylint: disable=broad-except
    out['flops_error'] = f'{type(e).__name__}: {_one_line(e)}'

  train, evaluate = out.get('train'), out.get('eval')
  totals = [s.get('total') for s in (train, evaluate) if s]
  out['peak_bytes'] = max((t for t in totals if t is not None), default=None)
  oom = any(s and s.get('oom') for s in (train, evaluate))
  measured = bool(train and evaluate) and None not in totals
  out['fits'] = (False if oom else None if not measured else
                 out['peak_bytes'] <= limit)

  # Roofline estimate of the training step, per device.
  if train and not train.get('oom') and 'flops_per_device' in out:
    peak = target.peak_flops(config.model.dtype)
    compute_s = out['flops_per_device'] / peak
    bytes_accessed = train['cost'].get('bytes accessed')
    memory_s = (bytes_accessed / target.hbm_bytes_per_s
                if bytes_accessed else None)
    out['estimate'] = {
        'compute_s': compute_s, 'memory_s': memory_s,
        'step_s': max(compute_s, memory_s or 0.0),
        'peak_flops': peak, 'bytes_per_s': target.hbm_bytes_per_s,
        'bytes_accessed': bytes_accessed}

  # The largest per-device training batch that fits.
  if job.max_batch_search > 0 and not out['failures'] and train:
    unit = config.grad_accum_steps

    def measure(b: int) -> Optional[int]:
      batch = steps_lib.abstract_batch(spec, b * n, mesh)
      try:
        compiled, _ = compile_once(steps.train.fn, (steps.state, batch),
                                   target, spill_check=False)
      except Exception as e:  # pylint: disable=broad-except
        if is_out_of_memory(str(e)):
          return None
        raise CompileFailure(failure_line(e)) from e
      return _memory(compiled)['total']

    try:
      fixed = (train['total'] - train['temp'] if 'temp' in train else None)
      found = search_batch(measure, per_device, train.get('total'), limit,
                           unit, job.max_batch_search, fixed_bytes=fixed)
      out['search'] = dataclasses.asdict(found)
    except CompileFailure as e:
      out['search'] = {'error': str(e)}
  out['seconds'] = round(time.perf_counter() - t_start, 1)
  return out


def _worker_start(quiet: bool) -> None:
  """A worker: the compile environment, and libtpu's start-up noise (it
  writes to the C++ stderr) sent to /dev/null unless `quiet` is False."""
  targets.prepare_environment()
  if quiet:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def run_jobs(jobs: Sequence[Job], workers: int, quiet: bool = True,
             on_result: Optional[Callable[[int, dict[str, Any]], None]] = None
             ) -> list[dict[str, Any]]:
  """Runs `jobs` in `workers` processes; results in the order of `jobs`."""
  results: list[Optional[dict[str, Any]]] = [None] * len(jobs)
  if not jobs:
    return []
  targets.prepare_environment()  # Inherited by the workers.
  with concurrent.futures.ProcessPoolExecutor(
      max(1, min(workers, len(jobs))),
      mp_context=multiprocessing.get_context('spawn'),
      initializer=_worker_start, initargs=(quiet,)) as pool:
    futures = {pool.submit(run_cell, job): i for i, job in enumerate(jobs)}
    for future in concurrent.futures.as_completed(futures):
      i = futures[future]
      try:
        result = future.result()
      except Exception as e:  # pylint: disable=broad-except
        # The worker died (e.g. killed for memory).
        result = {'config': jobs[i].label, 'target': jobs[i].target,
                  'error': f'worker failed: {type(e).__name__}: '
                           f'{_one_line(e)}'}
      results[i] = result
      if on_result:
        on_result(i, result)
  return [r for r in results if r is not None]


# ----------------------------------------------------------------- reports


# The house formats (MiB for memory, lra_msmra_tools.reporting).
fmt_bytes = reporting.fmt_bytes
fmt_flops = outputs.fmt_flops


def fmt_seconds(value: Optional[float]) -> str:
  """The benchmarks' time format, and µs below a millisecond."""
  if value is not None and 0 < value < 1e-3:
    return f'{value * 1e6:.3g} µs'
  return outputs.fmt_time(value)


def step_text(est: dict[str, Any], long: bool = False) -> str:
  """'~13.4 ms', the roofline estimate; '≥ 9.06 µs' from the FLOPs alone
  when there is no byte count (GPU), a lower bound."""
  if est.get('memory_s') is None:
    return f'≥ {fmt_seconds(est["step_s"])}' + (' (FLOPs only)' if long
                                                 else '')
  bound = 'compute' if est['compute_s'] >= est['memory_s'] else 'memory'
  return f'~{fmt_seconds(est["step_s"])}' + (f' ({bound})' if long else '')


def fits_text(r: dict[str, Any]) -> str:
  if r.get('error'):
    return 'error'
  if r.get('failures'):
    return 'NOT compiled'
  if r.get('fits') is None:
    return '—'
  return 'fits' if r['fits'] else 'does NOT fit'


def largest_batch_text(r: dict[str, Any]) -> str:
  s = r.get('search')
  if not s:
    return '—'
  if 'error' in s:
    return 'search failed'
  lo, hi = s['largest_fit'], s['smallest_no_fit']
  if lo is None:
    return (f'none (≤ {hi} does not fit)' if not s['exact'] else
            'none (1 does not fit)') if hi else '—'
  if s['exact']:
    return f'{lo} ({hi} does not)'
  if hi is None:
    return f'≥ {lo} (larger untested)'
  return f'≥ {lo} (< {hi}; between untested)'


def _total(step: Optional[dict[str, Any]]) -> str:
  if not step:
    return '—'
  if step.get('oom'):
    need = step.get('total')
    return f'> HBM ({fmt_bytes(need)} needed)' if need else '> HBM'
  return fmt_bytes(step.get('total'))


HEADER = ('config', 'target', 'batch / device', 'state (params + opt)',
          'temporaries', 'outputs', 'total (train)', 'total (eval)', 'HBM',
          'fits', 'largest batch / device (bisection)',
          'compile (train + eval)',
          'FLOPs / device (counted)', 'bytes / device (XLA)',
          'step time (roofline ESTIMATE)')


def row(r: dict[str, Any]) -> list[str]:
  name = f'`{r["config"]}`'
  target = r.get('label') or r['target']
  if r.get('error'):
    return [name, target] + ['—'] * (len(HEADER) - 3) + ['error (below)']
  train = r.get('train') or {}
  est = r.get('estimate')
  step = step_text(est, long=True) if est else '—'
  return [
      name, target, str(r.get('per_device_batch', '—')),
      fmt_bytes(r.get('state_bytes')),
      fmt_bytes(train.get('temp')) if not train.get('oom') else '—',
      fmt_bytes(train.get('output')) if not train.get('oom') else '—',
      _total(r.get('train')), _total(r.get('eval')),
      fmt_bytes(r.get('hbm_bytes')), fits_text(r), largest_batch_text(r),
      fmt_seconds(r.get('compile_seconds')),
      fmt_flops(r.get('flops_per_device')),
      fmt_bytes((est or {}).get('bytes_accessed')) if est else '—', step]


def kernel_lines(r: dict[str, Any]) -> list[str]:
  info = r.get('kernels')
  if not info:
    return []
  lines = []
  for k in info['kernels']:
    regs = k.get('registers')
    spills = k.get('spill_stores', 0) + k.get('spill_loads', 0)
    lines.append(
        f'  - `{k["kernel"]}` grid [{k.get("grid", "?")}] threads '
        f'[{k.get("threads", "?")}]: shared memory '
        f'{fmt_bytes(k.get("shared_memory"))}, '
        + (f'{regs} registers / thread, ' if regs is not None else '')
        + (f'spills {k.get("spill_stores", 0)} B stored / '
           f'{k.get("spill_loads", 0)} B loaded' if spills else
           'no spills' if regs is not None else 'spills not checked'))
  if info.get('note'):
    lines.append(f'  - {info["note"]}')
  if not lines:
    return []
  return [f'- `{r["config"]}` on {r.get("label") or r["target"]}:'] + lines


def problem_lines(r: dict[str, Any]) -> list[str]:
  where = f'`{r["config"]}` on {r.get("label") or r["target"]}'
  out = []
  if r.get('error'):
    out.append(f'- {where}: {r["error"]}')
  for f in r.get('failures', []):
    out.append(f'- {where}: {f}')
  s = r.get('search') or {}
  if 'error' in s:
    out.append(f'- {where}: batch search stopped: {s["error"]}')
  if r.get('flops_error'):
    out.append(f'- {where}: FLOPs not counted: {r["flops_error"]}')
  return out


def note_lines(r: dict[str, Any]) -> list[str]:
  where = f'`{r["config"]}` on {r.get("label") or r["target"]}'
  return [f'- {where}: {n}' for n in r.get('notes', [])]


def markdown(results: Sequence[dict[str, Any]], usable: float) -> str:
  lines = [reporting.markdown_table(HEADER, [row(r) for r in results])]
  kernels, problems, remarks = [], [], []
  for r in results:
    kernels += kernel_lines(r)
    problems += problem_lines(r)
    remarks += note_lines(r)
  notes = [
      '',
      'Per device. total = arguments + outputs + temporaries − aliased '
      '(donated state) + generated code, from `compiled.memory_analysis()`. '
      'fits: TPU, the compiler itself refuses a program over its HBM (it '
      'keeps a share for the runtime), so a compiled program fits; GPU, '
      f'the larger of the train and eval totals ≤ {usable:.0%} of the '
      'GPU\'s memory, the rest left to the CUDA context, libraries and '
      'fragmentation. Largest batch: the training step compiled at other '
      'batches, bisection from an affine guess. FLOPs: the training step\'s '
      'matmuls, counted from the \'xla\' implementation\'s program as the '
      'trainer counts them; bytes: XLA\'s cost analysis (TPU only). Step '
      'time: a roofline ESTIMATE, max(FLOPs / peak, bytes / bandwidth), '
      'not a measurement; on GPU, with no byte count, FLOPs / peak alone, '
      'a lower bound (≥).']
  if kernels:
    notes += ['', 'Pallas kernels on GPU (shared memory from XLA\'s thunk '
              'sequence, registers and spills from `ptxas -v`):', ''] + kernels
  if remarks:
    notes += ['', 'Notes:', ''] + remarks
  if problems:
    notes += ['', 'Not compiled or not complete:', ''] + problems
  return '\n'.join(lines + notes)


def stderr_lines(results: Sequence[dict[str, Any]]) -> list[str]:
  """One line per problem, for the terminal."""
  out = []
  for r in results:
    where = f'{r["config"]} on {r.get("label") or r["target"]}'
    if r.get('error'):
      out.append(f'error: {where}: {r["error"]}')
      continue
    for f in r.get('failures', []):
      out.append(f'error: {where}: {f}')
    if r.get('fits') is False:
      need = r.get('peak_bytes')
      if need is None:
        need = max((s.get('total') or 0 for s in (r.get('train'), r.get('eval'))
                    if s), default=0) or None
      out.append(
          f'{where} does NOT fit: {fmt_bytes(need)} per device, '
          f'{fmt_bytes(r["usable_bytes"])} usable of '
          f'{fmt_bytes(r["hbm_bytes"])}'
          + (f'; largest batch per device that fits: {best}'
             if (best := (r.get('search') or {}).get('largest_fit')) else ''))
  return out


def versions() -> str:
  import importlib.metadata as metadata  # pylint: disable=g-import-not-at-top
  parts = []
  for package in ('jax', 'libtpu', 'jax-cuda12-plugin'):
    try:
      parts.append(f'{package} {metadata.version(package)}')
    except metadata.PackageNotFoundError:
      pass
  return ', '.join(parts)


def command_line(argv: Sequence[str], prog: str = PROG) -> str:
  """The command as typed, less where it writes its files."""
  shown, skip = [], False
  for arg in argv:
    if skip:
      skip = False
      continue
    if arg in ('--out', '--cache', '--jobs'):
      skip = True
      continue
    if arg.startswith(('--out=', '--cache=', '--jobs=')):
      continue
    shown.append(shlex.quote(arg))
  return ' '.join([prog] + shown)


def write_outputs(path: str, text: str, results: Any) -> str:
  """Writes the markdown to `path` and the figures to `path`'s .json."""
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text + '\n')
  json_path = (path[:-3] if path.endswith('.md') else path) + '.json'
  outputs.write_json(json_path, results)
  return json_path


# -------------------------------------------------------------- the command


def define_compile_flags(fv) -> None:
  """The flags that say how a cell compiles: shared with `fits`."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_enum('dtype', None, ['float32', 'bfloat16'],
                    'Activation dtype (config.model.dtype).', flag_values=fv)
  flags.DEFINE_string('implementation', None, 'Attention implementation '
                      '(config.model.attention_kw.implementation): xla, '
                      'pallas, ...', flag_values=fv)
  flags.DEFINE_integer('max_batch_search', DEFAULT_MAX_BATCH_SEARCH,
                       'At most this many extra compiles of the training '
                       'step to find the largest per-device batch that '
                       'fits (bisection); 0 skips the search.',
                       flag_values=fv, lower_bound=0)
  flags.DEFINE_float('usable', DEFAULT_USABLE, 'GPU targets: the fraction of '
                     'the GPU\'s memory a program may use.', flag_values=fv,
                     lower_bound=0.05, upper_bound=1.0)
  flags.DEFINE_integer('jobs', cores(), 'Worker processes compiling in '
                       'parallel (default: one per core).', flag_values=fv,
                       lower_bound=1)
  flags.DEFINE_string('out', None, 'Also write the table (markdown) to this '
                      'file and every figure to the same name with .json.',
                      flag_values=fv)
  flags.DEFINE_bool('kernel_stats', True, 'GPU targets with Pallas kernels: '
                    'report each kernel\'s shared memory, registers and '
                    'spills.', flag_values=fv)
  flags.DEFINE_bool('verbose', False, 'Show the compilers\' own logs.',
                    flag_values=fv)


def _define_flags(argv: Sequence[str]):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file(
      'config', None, 'Config file, optionally with :options, as the '
      'trainer takes it; --config.KEY=VALUE overrides work.',
      flag_values=fv, lock_config=False, sys_argv=list(argv))
  flags.DEFINE_multi_string('target', [], 'Target to compile for (repeat '
                            'for several): v5e:2x2, v5e-4, v4-8, v5p:2x2x1, '
                            'v6e:4x4, h100, h100:8, h200:2x8, ...',
                            flag_values=fv)
  flags.DEFINE_integer('per_device_batch', None, 'Set the global train and '
                       'eval batch to this many examples per device.',
                       flag_values=fv, lower_bound=1)
  flags.DEFINE_bool('require_fit', False, 'Exit with status 3 when a cell '
                    'does not fit.', flag_values=fv)
  flags.DEFINE_bool('fits_table', False, 'Moved: the "Where it fits" table '
                    'is `python -m lra_msmra_tools.fits`.', flag_values=fv)
  define_compile_flags(fv)
  return fv


def fail(message: str, status: int = 1) -> int:
  """Prints `error: message` on stderr; returns the exit status."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  return status


def parse_flags(argv: Sequence[str], define: Callable[[Sequence[str]], Any]
                = _define_flags):
  """The flags `define(argv)` defines, parsed, or a one-line error
  (ValueError)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  fv = define(argv)
  try:
    fv(list(argv))
  except flags.Error as e:
    text = str(e)
    if 'Traceback (most recent call last)' in text:
      text = text.strip().splitlines()[-1]
    raise ValueError(f'{_one_line(text, 400)} (--helpfull lists the flags).'
                     ) from e
  except (AttributeError, KeyError) as e:
    raise ValueError(f'--config override: {_one_line(e, 400)}') from e
  return fv


def config_label(fv) -> str:
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  path = config_flags.get_config_filename(fv['config'])
  label = os.path.relpath(path, ROOT) if os.path.isabs(path) and \
      path.startswith(ROOT) else path
  overrides = config_flags.get_override_values(fv['config'])
  for key, value in overrides.items():
    label += f' --config.{key}={value}'
  return label


def apply_settings(config: Any, dtype: Optional[str],
                   implementation: Optional[str]) -> Any:
  """A copy of `config` with the command's dtype and implementation."""
  config = config.copy_and_resolve_references()
  if dtype:
    config.model.dtype = dtype
  if implementation:
    config.model.attention_kw.implementation = implementation
  return config


def main(argv: Sequence[str]) -> int:
  targets.prepare_environment()
  try:
    fv = parse_flags(argv)
  except ValueError as e:
    return fail(str(e))
  if fv.fits_table:
    return fail('the "Where it fits" table is a command of its own: python '
                '-m lra_msmra_tools.fits (the same flags, less --fits_table).')
  if fv['config'].value is None:
    return fail('--config FILE[:OPTIONS] is required.')
  if not fv.target:
    return fail('give at least one --target, e.g. --target v5e:2x2 or '
                 '--target h100:8.')
  try:
    target_list = [targets.parse(t) for t in fv.target]
    for t in target_list:
      t.check_packages()
  except (ValueError, targets.MissingPackage) as e:
    return fail(str(e))
  try:
    config = fv.config
    config.keys()  # A config file that failed to load raises here.
  except (OSError, AttributeError, ValueError) as e:
    return fail(f'--config: {_one_line(e)}')
  label = config_label(fv)
  extra = []
  if fv.dtype:
    extra.append(f'--dtype={fv.dtype}')
  if fv.implementation:
    extra.append(f'--implementation={fv.implementation}')
  if fv.per_device_batch:
    extra.append(f'--per_device_batch={fv.per_device_batch}')
  if extra:
    label += ' ' + ' '.join(extra)
  config = apply_settings(config, fv.dtype, fv.implementation)
  jobs = [Job(label=label, config=config, target=t.label,
              per_device_batch=fv.per_device_batch,
              max_batch_search=fv.max_batch_search, usable=fv.usable,
              kernel_stats=fv.kernel_stats) for t in target_list]

  def progress(_, r):
    state = ('error' if r.get('error') else 'NOT compiled' if
             r.get('failures') else fits_text(r))
    print(f'{r["config"]} on {r.get("label") or r["target"]}: {state} '
          f'({r.get("seconds", "?")} s)', file=sys.stderr, flush=True)

  results = run_jobs(jobs, fv.jobs, quiet=not fv.verbose, on_result=progress)
  date = datetime.date.today().isoformat()
  text = (f'`{command_line(argv[1:])}` ({date}; {versions()}): compiled for '
          'the targets\' own compilers on compile-only devices, over a '
          'data-parallel mesh of all their devices.\n\n'
          + markdown(results, fv.usable))
  print(text, flush=True)
  for line in stderr_lines(results):
    print(line, file=sys.stderr, flush=True)
  if fv.out:
    write_outputs(fv.out, text, results)
  if any(r.get('error') or r.get('failures') for r in results):
    return 1
  if fv.require_fit and any(r.get('fits') is False for r in results):
    return 3
  return 0


if __name__ == '__main__':
  targets.prepare_environment()
  sys.exit(main(sys.argv))
