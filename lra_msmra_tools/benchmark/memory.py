"""Memory of the benchmarks' points: measuring it, predicting it, and the
budget that points predicted not to fit are skipped by.

* Memory on CPU: `compiled.memory_analysis()` under-reports on the CPU
  backend, so the figure is the process's resident memory. Just before the
  warm-up the C library's free heap is handed back to the kernel
  (`malloc_trim`, so that memory freed earlier cannot leave during the work
  and hide its growth), the kernel's high-water mark is reset
  (`/proc/self/clear_refs`, value 5) and the resident size noted; after the
  last repeat the high-water mark (`VmHWM`) is read. The reported peak is
  their difference: the memory the computation itself adds on top of
  parameters, inputs and the compiled program (`PeakMemory`). The
  process's overall peak (`ru_maxrss`, compile included) is recorded as
  well. On GPU/TPU the runtime's per-device `peak_bytes_in_use` minus
  `bytes_in_use` before the run is used instead (the /proc figures are then
  host memory and are only recorded).
* Points that would not fit are skipped, not crashed: before a point runs,
  its peak is predicted from the two previous lengths of the same mechanism
  (a power law in the length, exponent clipped to [1, 2.5]; from a single
  point, the exponent a hint gives, e.g. the same mechanism's growth on
  another backend, else 2), and a point predicted above the memory budget
  is recorded as skipped, as are longer lengths after it. The peaks and the
  budget are the device's on GPU/TPU (`measured_bytes`, `prediction_budget`:
  `--memory_budget_gb` or 90 % of the device's memory) and the process's
  resident memory on CPU (`memory_budget`: `--memory_budget_gb` or 90 % of
  the memory available at the start).
"""

from __future__ import annotations

import ctypes
import math
import resource
from typing import Any, Mapping, Optional, Sequence

GIB = 2 ** 30


def _proc_bytes(path: str, field: str) -> Optional[int]:
  """The `field: N kB` line of a /proc file, in bytes (None if n/a)."""
  try:
    with open(path) as f:
      for line in f:
        if line.startswith(field + ':'):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def proc_status_bytes(field: str, pid: str = 'self') -> Optional[int]:
  """`VmRSS`, `VmHWM`, ... of a process from /proc, in bytes (None if n/a)."""
  return _proc_bytes(f'/proc/{pid}/status', field)


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


def memory_total_bytes() -> Optional[int]:
  return _proc_bytes('/proc/meminfo', 'MemTotal')


def memory_available_bytes() -> Optional[int]:
  return _proc_bytes('/proc/meminfo', 'MemAvailable')


DEVICE_METHOD = 'device peak_bytes_in_use'


def release_free_heap() -> bool:
  """Hands the C library's free heap memory back to the kernel (glibc's
  `malloc_trim(0)`); False where the C library has no such call."""
  try:
    trim = ctypes.CDLL(None).malloc_trim
  except (OSError, AttributeError):
    return False
  trim(0)
  return True


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
      return self
    # Memory freed earlier (compilation, setup) but still resident could be
    # handed back to the kernel during the work and hide part of its growth
    # (a net peak of 0 was seen); hand it back before the baseline instead.
    trimmed = ', free heap trimmed first' if release_free_heap() else ''
    if reset_peak_rss():
      self.method = f'resident memory (VmHWM after clear_refs{trimmed})'
    else:
      # Without clear_refs the high-water mark includes everything before.
      self.method = f'resident memory (VmHWM, not reset{trimmed})'
    self._start = proc_status_bytes('VmRSS')
    return self

  def __exit__(self, *exc) -> None:
    self.limit = None
    if self._device is not None:
      stats = self._device.memory_stats()
      self.peak = stats['peak_bytes_in_use']
      self.limit = stats.get('bytes_limit')
    else:
      self.peak = proc_status_bytes('VmHWM')
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
