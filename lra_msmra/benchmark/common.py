"""Pieces shared by the benchmarks: specs, worker processes, memory, reports.

Measuring choices (the benchmarks' docstrings refer to these):

* Every measured point (mechanism, length, mode) runs in a fresh Python
  process (`run_worker`), so that one point's allocations, compiled programs
  and allocator caches never inflate another's peak.
* Time: the jitted function is compiled first (compile time recorded), then
  called `warmup` times untimed, then `repeats` times, each call waited for
  with `block_until_ready`; the median is reported (`time_calls`).
* Memory on CPU: `compiled.memory_analysis()` under-reports on the CPU
  backend, so the figure is the process's resident memory. Just before the
  warm-up the kernel's high-water mark is reset (`/proc/self/clear_refs`,
  value 5) and the resident size noted; after the last repeat the high-water
  mark (`VmHWM`) is read. The reported peak is their difference: the memory
  the computation itself adds on top of parameters, inputs and the compiled
  program (`PeakMemory`). The process's overall peak (`ru_maxrss`, compile
  included) is recorded as well. On GPU/TPU the runtime's per-device
  `peak_bytes_in_use` minus `bytes_in_use` before the run is used instead
  (the /proc figures are then host memory and are only recorded).
* Points that would not fit are skipped, not crashed: before a point runs,
  its peak is predicted from the two previous lengths of the same mechanism
  (a power law in the length, exponent clipped to [1, 2.5]; from a single
  point, the exponent a hint gives, e.g. the same mechanism's growth on
  another backend, else 2), and a point predicted above the memory budget
  is recorded as skipped, as are longer lengths after it. The peaks and the
  budget are the device's on GPU/TPU (`measured_bytes`, `prediction_budget`:
  `--memory_budget_gb` or 90 % of the device's memory) and the process's
  resident memory on CPU. A watchdog also kills a worker
  whose resident memory passes the (host) budget or whose run passes the
  time limit, and records the point as skipped with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import json
import math
import operator
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

# A worker prints its result as one JSON line after this marker.
RESULT_MARKER = 'BENCHMARK_RESULT '
MIB = 2 ** 20
GIB = 2 ** 30


# ------------------------------------------------------------------- specs


@dataclasses.dataclass(frozen=True)
class Spec:
  """A mechanism (or config) name plus knob overrides.

  Attributes:
    name: registry name (attention benchmark) or config name (train step).
    kw: knob overrides, e.g. {'slice_length': 8}.
  """
  name: str
  kw: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def label(self) -> str:
    """`name` or `name:key=value,...` (the form `parse_specs` reads)."""
    if not self.kw:
      return self.name
    knobs = ','.join(f'{k}={_format_value(v)}' for k, v in self.kw.items())
    return f'{self.name}:{knobs}'


def _format_value(value: Any) -> str:
  if isinstance(value, (list, tuple)):
    return '(' + ','.join(_format_value(v) for v in value) + ')'
  if isinstance(value, float):
    return f'{value:g}'
  return str(value)


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub,
           ast.Mult: operator.mul, ast.Div: operator.truediv}


def _eval_literal(node: ast.AST) -> Any:
  """Numbers, strings, booleans, None, tuples/lists and + - * / of numbers."""
  if isinstance(node, ast.Constant):
    return node.value
  if isinstance(node, (ast.Tuple, ast.List)):
    return tuple(_eval_literal(e) for e in node.elts)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    return -_eval_literal(node.operand)
  if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
    left, right = _eval_literal(node.left), _eval_literal(node.right)
    if not all(isinstance(v, (int, float)) for v in (left, right)):
      raise ValueError('arithmetic on non-numbers')
    return _BINOPS[type(node.op)](left, right)
  raise ValueError(f'not a literal: {ast.dump(node)}')


def parse_value(text: str) -> Any:
  """`8` -> 8, `1/2` -> 0.5, `(1/2,1/8)` -> (0.5, 0.125), `true` -> True,
  anything else -> the string itself."""
  lowered = text.strip().lower()
  if lowered in ('true', 'false'):
    return lowered == 'true'
  if lowered == 'none':
    return None
  try:
    return _eval_literal(ast.parse(text.strip(), mode='eval').body)
  except (SyntaxError, ValueError):
    return text.strip()


def _split_top_level(text: str) -> list[str]:
  """Splits on commas outside parentheses/brackets."""
  parts, depth, current = [], 0, []
  for ch in text:
    if ch in '([':
      depth += 1
    elif ch in ')]':
      depth -= 1
    if ch == ',' and depth == 0:
      parts.append(''.join(current))
      current = []
    else:
      current.append(ch)
  parts.append(''.join(current))
  return [p.strip() for p in parts if p.strip()]


def parse_specs(text: str) -> list[Spec]:
  """Parses `softmax,cst:slice_length=8,alpha=1,combiner:variant=fixed`.

  A token `name` or `name:key=value` starts a new spec; a following token
  `key=value` (no colon) adds a knob to the current spec. Values are Python
  literals where possible (`8`, `1/2`, `(1/2,1/8)`, `true`), else strings.

  Raises:
    ValueError: a knob before any name, a malformed token, a repeated knob
      or a repeated spec.
  """
  specs: list[tuple[str, dict[str, Any]]] = []
  for token in _split_top_level(text):
    if ':' in token:
      name, knob = token.split(':', 1)
      specs.append((name.strip(), {}))
      token = knob
    elif '=' not in token:
      specs.append((token, {}))
      continue
    if not specs:
      raise ValueError(f'Knob {token!r} comes before any mechanism name; '
                       'write name:key=value.')
    if '=' not in token:
      raise ValueError(f'Malformed knob {token!r}; write key=value.')
    key, value = token.split('=', 1)
    key = key.strip()
    if not key.isidentifier():
      raise ValueError(f'Malformed knob name {key!r} in {text!r}.')
    if key in specs[-1][1]:
      raise ValueError(f'Knob {key!r} given twice for {specs[-1][0]!r}.')
    specs[-1][1][key] = parse_value(value)
  result = [Spec(name, kw) for name, kw in specs]
  labels = [s.label for s in result]
  duplicates = sorted({l for l in labels if labels.count(l) > 1})
  if duplicates:
    raise ValueError(f'Mechanism(s) {duplicates} requested twice.')
  if not result:
    raise ValueError('No mechanism given.')
  return result


def parse_lengths(text: str) -> list[int]:
  """`1024,2048` -> [1024, 2048]; `1K,2K` works too. Sorted, unique."""
  lengths = []
  for token in _split_top_level(text):
    scale = 1
    if token[-1] in 'kK':
      token, scale = token[:-1], 1024
    try:
      value = int(token) * scale
    except ValueError:
      raise ValueError(f'Length {token!r} is not an integer.') from None
    if value < 1:
      raise ValueError(f'Length {value} must be positive.')
    lengths.append(value)
  if not lengths:
    raise ValueError('No length given.')
  return sorted(set(lengths))


# ------------------------------------------------------------------ memory


def _status_bytes(field: str, pid: str = 'self') -> Optional[int]:
  """`VmRSS`, `VmHWM`, ... of a process from /proc, in bytes (None if n/a)."""
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith(field + ':'):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def reset_peak_rss() -> bool:
  """Resets this process's resident high-water mark (Linux >= 4.0)."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
    return True
  except OSError:
    return False


def process_peak_bytes() -> int:
  """Peak resident memory of this process so far (`ru_maxrss`)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_available_bytes() -> Optional[int]:
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


DEVICE_METHOD = 'device peak_bytes_in_use'


class PeakMemory:
  """Net peak memory of a block of work (see the module docstring).

  Args:
    device: a JAX device whose runtime reports `memory_stats()` (GPU/TPU);
      None or a device without statistics (CPU) uses resident memory.
  """

  def __init__(self, device: Any = None):
    stats = device.memory_stats() if device is not None else None
    self._device = device if stats and 'peak_bytes_in_use' in stats else None
    self._start = None
    self.method = None

  def __enter__(self) -> 'PeakMemory':
    if self._device is not None:
      self.method = DEVICE_METHOD
      self._start = self._device.memory_stats()['bytes_in_use']
    elif reset_peak_rss():
      self.method = 'resident memory (VmHWM after clear_refs)'
      self._start = _status_bytes('VmRSS')
    else:
      # Without clear_refs the high-water mark includes everything before.
      self.method = 'resident memory (VmHWM, not reset)'
      self._start = _status_bytes('VmRSS')
    return self

  def __exit__(self, *exc) -> None:
    self.limit = None
    if self._device is not None:
      stats = self._device.memory_stats()
      self.peak = stats['peak_bytes_in_use']
      self.limit = stats.get('bytes_limit')
    else:
      self.peak = _status_bytes('VmHWM')
    self.baseline = self._start

  def result(self) -> dict[str, Any]:
    net = None
    if self.peak is not None and self.baseline is not None:
      net = max(self.peak - self.baseline, 0)
    out = {'method': self.method, 'baseline_bytes': self.baseline,
           'peak_bytes': self.peak, 'net_peak_bytes': net}
    if self.limit is not None:
      out['limit_bytes'] = self.limit
    return out


def measured_bytes(rec: Mapping[str, Any]) -> Optional[float]:
  """The memory of a measured point that longer lengths are predicted from.

  The device's peak where the worker measured one (GPU/TPU), else the worker
  process's resident peak (CPU).
  """
  memory = rec.get('memory') or {}
  if memory.get('method') == DEVICE_METHOD:
    return memory.get('peak_bytes')
  return rec.get('process_peak_bytes')


def prediction_budget(rec: Mapping[str, Any], budget_gb: Optional[float],
                      host_budget: Optional[float]) -> Optional[float]:
  """The budget that predictions from measured point `rec` are held to.

  On GPU/TPU (device memory measured) `budget_gb`, else 90 % of the
  device's memory; on CPU the host budget.
  """
  memory = rec.get('memory') or {}
  if memory.get('method') != DEVICE_METHOD:
    return host_budget
  if budget_gb:
    return budget_gb * GIB
  limit = memory.get('limit_bytes')
  return 0.9 * limit if limit else None


def growth_exponent(history: Sequence[tuple[int, float]]
                    ) -> Optional[float]:
  """Power-law exponent of the last two (length, bytes) points, or None."""
  points = sorted((n, b) for n, b in history if b)
  if len(points) < 2:
    return None
  (n0, b0), (n1, b1) = points[-2:]
  if n1 <= n0:
    return None
  return min(max(math.log(b1 / b0) / math.log(n1 / n0), 1.0), 2.5)


def predict_bytes(history: Sequence[tuple[int, float]], length: int,
                  exponent_hint: Optional[float] = None) -> Optional[float]:
  """Predicts a peak at `length` from (length, bytes) points of shorter ones.

  A power law through the last two points (exponent clipped to [1, 2.5]).
  Through a single point the exponent is `exponent_hint` (e.g. the growth
  the same mechanism showed on another backend) or 2. None without points.
  """
  points = sorted((n, b) for n, b in history if b and n < length)
  if not points:
    return None
  n1, b1 = points[-1]
  exponent = growth_exponent(points)
  if exponent is None:
    exponent = 2.0 if exponent_hint is None else exponent_hint
  return b1 * (length / n1) ** exponent


def add_measurement_flags(parser) -> None:
  """The flags both benchmark commands share: repeats, limits, budget."""
  parser.add_argument('--repeats', type=int, default=5,
                      help='timed calls per point (median reported)')
  parser.add_argument('--warmup', type=int, default=1,
                      help='untimed calls after compilation')
  parser.add_argument('--max_repeat_seconds', type=float, default=60.0,
                      help='stop repeating after this much timed work (at '
                           'least 3 calls)')
  parser.add_argument('--timeout_s', type=float, default=1200.0,
                      help='kill a point running longer (recorded as '
                           'skipped)')
  parser.add_argument('--memory_budget_gb', type=float, default=None,
                      help='skip points predicted to need more (GiB); '
                           'default 90%% of the memory available at start')


def memory_budget(budget_gb: Optional[float], available: Optional[float]
                  ) -> Optional[float]:
  """Bytes a point may use: `budget_gb` if given, else 90 % of `available`."""
  if budget_gb:
    return budget_gb * GIB
  return 0.9 * available if available else None


def over_budget(predicted: Optional[float], budget: Optional[float]
                ) -> Optional[str]:
  """The skip reason when the predicted peak is over the budget, else None."""
  if budget and predicted and predicted > budget:
    return (f'predicted peak {predicted / GIB:.1f} GiB > budget '
            f'{budget / GIB:.1f} GiB')
  return None


def not_run_reason(length: int, rec: Mapping[str, Any]) -> str:
  """Why the longer lengths after a failed or skipped point are not run."""
  return (f'not run: length {length} was {rec["status"]} '
          f'({rec.get("reason", "")})')


def ok_value(rec: Optional[Mapping[str, Any]], field: str) -> Optional[float]:
  """`rec[field]` of a measured point; None if missing or not measured."""
  if rec is None or rec.get('status') != 'ok':
    return None
  return rec.get(field)


def log(msg: str) -> None:
  print(msg, flush=True)


# ------------------------------------------------------------------ timing


def time_calls(call: Callable[[], Any], sync: Callable[[Any], Any], *,
               warmup: int, repeats: int, max_seconds: float
               ) -> dict[str, Any]:
  """Median wall time of `call()` after `warmup` untimed calls.

  Stops early once `max_seconds` of timed calls have passed and at least
  min(3, repeats) were made.
  """
  for _ in range(warmup):
    sync(call())
  times = []
  start = time.perf_counter()
  while len(times) < repeats:
    t0 = time.perf_counter()
    sync(call())
    times.append(time.perf_counter() - t0)
    if (len(times) >= min(3, repeats)
        and time.perf_counter() - start > max_seconds):
      break
  return {'time_s': statistics.median(times), 'times_s': times}


# ---------------------------------------------------------------- workers


def emit_result(result: Mapping[str, Any]) -> None:
  """Prints a worker's result line (read by `run_worker`)."""
  sys.stdout.write(RESULT_MARKER + json.dumps(result) + '\n')
  sys.stdout.flush()


def run_worker(module: str, payload: Mapping[str, Any], *,
               memory_budget_bytes: Optional[float], timeout_s: float,
               poll_s: float = 0.2) -> dict[str, Any]:
  """Runs `python -m module --worker JSON` and returns its result.

  Returns a dict with `status` 'ok' (plus the worker's result), 'skipped'
  (killed by the watchdog: memory budget or time limit; `reason` says which)
  or 'failed' (non-zero exit; `reason` holds the end of its stderr).
  """
  cmd = [sys.executable, '-m', module, '--worker', json.dumps(payload)]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  out, err = [], []
  readers = [threading.Thread(target=lambda s=s, b=b: b.extend(s), daemon=True)
             for s, b in ((proc.stdout, out), (proc.stderr, err))]
  for r in readers:
    r.start()
  start = time.monotonic()
  sampled_peak = 0
  killed = None
  while proc.poll() is None:
    rss = _status_bytes('VmRSS', str(proc.pid)) or 0
    sampled_peak = max(sampled_peak, rss)
    if memory_budget_bytes and rss > memory_budget_bytes:
      killed = (f'resident memory {rss / GIB:.1f} GiB passed the budget of '
                f'{memory_budget_bytes / GIB:.1f} GiB')
    elif time.monotonic() - start > timeout_s:
      killed = f'ran longer than the {timeout_s:.0f} s limit'
    if killed:
      proc.kill()
      proc.wait()
      break
    time.sleep(poll_s)
  for r in readers:
    r.join()
  wall = time.monotonic() - start
  if killed:
    return {'status': 'skipped', 'reason': f'killed: {killed}',
            'wall_s': wall}
  result = None
  for line in out:
    if line.startswith(RESULT_MARKER):
      result = json.loads(line[len(RESULT_MARKER):])
  if proc.returncode != 0 or result is None:
    tail = ''.join(err)[-2000:].strip()
    return {'status': 'failed', 'wall_s': wall,
            'reason': f'worker exit code {proc.returncode}: {tail}'}
  result.setdefault('status', 'ok')
  result['wall_s'] = wall
  result['sampled_peak_rss_bytes'] = sampled_peak
  return result


def worker_payload(argv: Sequence[str]) -> Optional[dict[str, Any]]:
  """The payload if this process was started as a worker, else None."""
  if len(argv) >= 3 and argv[1] == '--worker':
    return json.loads(argv[2])
  return None


# ------------------------------------------------------------ environment


def _cpu_model() -> Optional[str]:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or None


def _version(package: str) -> Optional[str]:
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    return metadata.version(package)
  except metadata.PackageNotFoundError:
    return None


def cpu_cores() -> str:
  """'2 CPU cores', or '1 of 2 CPU cores' where this process may run on
  fewer cores than the machine has (e.g. under `taskset`)."""
  total = os.cpu_count() or 1
  try:
    usable = len(os.sched_getaffinity(0))
  except AttributeError:  # Not on Linux.
    usable = total
  return (f'{total} CPU cores' if usable >= total else
          f'{usable} of {total} CPU cores')


def environment(packages: Iterable[str] = ('jax', 'jaxlib', 'flax',
                                           'numpy', 'torch')
                ) -> dict[str, Any]:
  """Host, versions and load, for the record (no JAX import needed)."""
  mem_total = None
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemTotal:'):
          mem_total = int(line.split()[1]) * 1024
  except OSError:
    pass
  return {
      'date_utc': datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      'python': platform.python_version(),
      'os': platform.platform(),
      'cpu': _cpu_model(),
      'cpu_count': os.cpu_count(),
      'cores': cpu_cores(),
      'memory_total_bytes': mem_total,
      'memory_available_bytes': memory_available_bytes(),
      'load_average': list(os.getloadavg()),
      'versions': {p: _version(p) for p in packages},
  }


def jax_device_info() -> dict[str, Any]:
  """Backend and device of the current JAX process."""
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  return {'backend': jax.default_backend(), 'device_kind': device.device_kind,
          'device_count': jax.device_count(), 'platform': device.platform}


# ---------------------------------------------------------------- reports


def fmt_bytes(value: Optional[float]) -> str:
  if value is None:
    return '—'
  return f'{value / MIB:,.0f} MB' if value >= 10 * MIB else (
      f'{value / MIB:.1f} MB')


def fmt_time(seconds: Optional[float]) -> str:
  if seconds is None:
    return '—'
  if seconds >= 1:
    return f'{seconds:.2f} s'
  return f'{seconds * 1e3:.1f} ms'


def fmt_flops(flops: Optional[float]) -> str:
  if flops is None:
    return '—'
  if flops >= 1e12:
    return f'{flops / 1e12:.3g} TFLOP'
  if flops >= 1e9:
    return f'{flops / 1e9:.3g} GFLOP'
  return f'{flops / 1e6:.3g} MFLOP'


def fmt_ratio(value: Optional[float], digits: int = 2) -> str:
  return '—' if value is None else f'{value:.{digits}f}×'


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]
                   ) -> str:
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  for row in rows:
    lines.append('| ' + ' | '.join(str(c) for c in row) + ' |')
  return '\n'.join(lines)


def command_line(argv: Sequence[str], module: str) -> str:
  """The command as a user would type it (for the report)."""
  args = ' '.join(_shell_quote(a) for a in argv[1:])
  return f'python -m {module} {args}'.strip()


def _shell_quote(arg: str) -> str:
  import shlex  # pylint: disable=g-import-not-at-top
  return shlex.quote(arg)


def write_json(path: str, data: Any) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(data, f, indent=2, sort_keys=False)
    f.write('\n')
  os.replace(tmp, path)


# ------------------------------------------------------------------ plots


def pyplot():
  """matplotlib.pyplot with the non-interactive Agg backend (lazy import)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def plot_panels(path: str, panels: Sequence[Mapping[str, Any]],
                xlabel: str, title: str) -> None:
  """Log-log line plots, one panel per entry.

  Each panel is {'title', 'ylabel', 'series': [{'label', 'points':
  [(x, y)], 'style': '-' or '--', 'color_key': str}]}; series sharing a
  color_key share a colour.
  """
  plt = pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5),
                           squeeze=False)
  keys = []
  for panel in panels:
    for s in panel['series']:
      if s['color_key'] not in keys:
        keys.append(s['color_key'])
  # Past ten keys, twenty colours and a second marker shape, so that no two
  # keys look alike.
  many = len(keys) > 10
  colours = {k: plt.get_cmap('tab20' if many else 'tab10')(i % 20)
             for i, k in enumerate(keys)}
  markers = {k: 's' if many and i % 2 else 'o' for i, k in enumerate(keys)}
  for ax, panel in zip(axes[0], panels):
    for s in panel['series']:
      pts = sorted(p for p in s['points'] if p[1] is not None)
      if not pts:
        continue
      xs, ys = zip(*pts)
      ax.plot(xs, ys, s.get('style', '-'), marker=markers[s['color_key']],
              markersize=4, color=colours[s['color_key']], label=s['label'])
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xlabel(xlabel)
    ax.set_ylabel(panel['ylabel'])
    ax.set_title(panel['title'])
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
