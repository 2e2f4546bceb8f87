"""Worker processes and timing: how the benchmarks measure a point.

* Every measured point (mechanism, length, mode) runs in a fresh Python
  process (`run_worker`), so that one point's allocations, compiled programs
  and allocator caches never inflate another's peak. The worker prints its
  result as one JSON line after `RESULT_MARKER` (`emit_result`). A point's
  record has the status 'ok' where it was measured (`ok_value` reads its
  figures), else another status ('skipped', 'failed', ...) and a reason.
* Time: the jitted function is compiled first (compile time recorded), then
  called `warmup` times untimed, then `repeats` times, each call waited for
  with `block_until_ready`; the median is reported (`time_calls`), with the
  minor page faults of the whole process per timed call: memory touched for
  the first time, which on the CPU backend is XLA's per-call temporary
  buffer (docs/benchmarks.md, "Page faults", says why and what the host
  can do about it).
* A worker's environment is the command's, or one given to `run_worker`.
* A watchdog kills a worker whose resident memory passes the (host) budget
  or whose run passes the time limit, and records the point as skipped with
  the reason. How memory is measured, and how points predicted not to fit
  are skipped before they run, is in `lra_msmra_tools.benchmark.memory`.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from lra_msmra_tools.benchmark import memory

# A worker prints its result as one JSON line after this marker.
RESULT_MARKER = 'BENCHMARK_RESULT '


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


def time_calls(call: Callable[[], Any], sync: Callable[[Any], Any], *,
               warmup: int, repeats: int, max_seconds: float
               ) -> dict[str, Any]:
  """Median wall time of `call()` after `warmup` untimed calls.

  Stops early once `max_seconds` of timed calls have passed and at least
  min(3, repeats) were made. `faults_per_call`: the process's minor page
  faults during the timed calls, per call.
  """
  for _ in range(warmup):
    sync(call())
  times = []
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  start = time.perf_counter()
  while len(times) < repeats:
    t0 = time.perf_counter()
    sync(call())
    times.append(time.perf_counter() - t0)
    if (len(times) >= min(3, repeats)
        and time.perf_counter() - start > max_seconds):
      break
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
  return {'time_s': statistics.median(times), 'times_s': times,
          'faults_per_call': faults / len(times)}


def emit_result(result: Mapping[str, Any]) -> None:
  """Prints a worker's result line (read by `run_worker`)."""
  sys.stdout.write(RESULT_MARKER + json.dumps(result) + '\n')
  sys.stdout.flush()


def run_worker(module: str, payload: Mapping[str, Any], *,
               memory_budget_bytes: Optional[float], timeout_s: float,
               poll_s: float = 0.2,
               env: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
  """Runs `python -m module --worker JSON` and returns its result.

  `env`: the worker's environment (default: this process's).

  Returns a dict with `status` 'ok' (plus the worker's result), 'skipped'
  (killed by the watchdog: memory budget or time limit; `reason` says which)
  or 'failed' (non-zero exit; `reason` holds the end of its stderr).
  """
  cmd = [sys.executable, '-m', module, '--worker', json.dumps(payload)]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=None if env is None else dict(env))
  out, err = [], []
  readers = [threading.Thread(target=lambda s=s, b=b: b.extend(s), daemon=True)
             for s, b in ((proc.stdout, out), (proc.stderr, err))]
  for r in readers:
    r.start()
  start = time.monotonic()
  sampled_peak = 0
  killed = None
  while proc.poll() is None:
    rss = memory.proc_status_bytes('VmRSS', str(proc.pid)) or 0
    sampled_peak = max(sampled_peak, rss)
    if memory_budget_bytes and rss > memory_budget_bytes:
      killed = (f'resident memory {rss / memory.GIB:.1f} GiB passed the '
                f'budget of {memory_budget_bytes / memory.GIB:.1f} GiB')
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


def ok_value(rec: Optional[Mapping[str, Any]], field: str) -> Optional[float]:
  """`rec[field]` of a measured point; None if missing or not measured."""
  if rec is None or rec.get('status') != 'ok':
    return None
  return rec.get(field)


def log(msg: str) -> None:
  print(msg, flush=True)
