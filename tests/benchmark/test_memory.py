"""Which memory the benchmarks predict from (the device's on GPU/TPU),
and how they predict it."""

import os
import pytest

from lra_msmra_tools.benchmark import memory
from lra_msmra_tools.benchmark import workers

GIB = memory.GIB


def test_cpu_points_use_resident_memory_and_the_host_budget():
  rec = {'memory': {'method': 'resident memory (VmHWM after clear_refs)',
                    'peak_bytes': 5 * GIB},
         'process_peak_bytes': 7 * GIB}
  assert memory.measured_bytes(rec) == 7 * GIB
  assert memory.prediction_budget(rec, None, 20 * GIB) == 20 * GIB
  assert memory.prediction_budget(rec, 8.0, 8 * GIB) == 8 * GIB


def test_accelerator_points_use_device_memory_and_its_size():
  rec = {'memory': {'method': memory.DEVICE_METHOD, 'peak_bytes': 30 * GIB,
                    'limit_bytes': 80 * GIB},
         'process_peak_bytes': 3 * GIB}
  assert memory.measured_bytes(rec) == 30 * GIB
  assert memory.prediction_budget(rec, None, 200 * GIB) == 72 * GIB
  assert memory.prediction_budget(rec, 16.0, 200 * GIB) == 16 * GIB
  no_limit = {'memory': {'method': memory.DEVICE_METHOD, 'peak_bytes': 1}}
  assert memory.prediction_budget(no_limit, None, 200 * GIB) is None


def test_peak_memory_reads_device_statistics_where_there_are_some():
  class Device:
    def __init__(self):
      self.in_use = 100

    def memory_stats(self):
      return {'bytes_in_use': self.in_use, 'peak_bytes_in_use': 900,
              'bytes_limit': 1000}

  device = Device()
  with memory.PeakMemory(device) as meter:
    device.in_use = 300
  result = meter.result()
  assert result['method'] == memory.DEVICE_METHOD
  assert result['net_peak_bytes'] == 800 and result['limit_bytes'] == 1000
  rec = {'memory': result, 'process_peak_bytes': 5}
  assert memory.measured_bytes(rec) == 900
  assert memory.prediction_budget(rec, None, None) == 900


def test_predict_bytes():
  assert memory.predict_bytes([], 4096) is None
  # Quadratic history extrapolates quadratically; one point assumes N^2.
  hist = [(1024, 1.0e9), (2048, 4.0e9)]
  assert memory.predict_bytes(hist, 4096) == pytest.approx(16e9)
  assert memory.predict_bytes(hist[:1], 4096) == pytest.approx(16e9)
  # A single point follows a hint (e.g. another backend's growth).
  assert memory.predict_bytes(hist[:1], 4096, 1.0) == pytest.approx(4e9)
  assert memory.growth_exponent(hist) == pytest.approx(2.0)
  # Sub-linear growth is clipped to linear.
  assert memory.predict_bytes([(1, 1.0), (2, 1.0)], 8) == pytest.approx(4.0)


def _huge_pages_may_serve() -> bool:
  """Whether the kernel's transparent huge pages are always on (or
  unknown), or glibc is asked for huge pages: then 4 KiB faults are not
  what a fresh allocation costs."""
  try:
    with open('/sys/kernel/mm/transparent_hugepage/enabled') as f:
      mode = next((w[1:-1] for w in f.read().split()
                   if w.startswith('[')), None)
  except OSError:
    mode = None
  return (mode in ('always', None) or
          'glibc.malloc.hugetlb' in os.environ.get('GLIBC_TUNABLES', ''))


@pytest.mark.skipif(
    _huge_pages_may_serve(),
    reason='counts 4 KiB pages; here huge pages may serve the allocation')
def test_time_calls_counts_the_page_faults_of_fresh_memory():
  # 64 MiB is above glibc's largest dynamic mmap threshold (32 MiB), so each
  # call gets fresh pages from the kernel and writes all 16,384 of them
  # (bytes, through malloc; NumPy would ask for huge pages itself).
  fresh = lambda: b'\x01' * (64 * 2 ** 20)
  timing = workers.time_calls(fresh, lambda _: None, warmup=1, repeats=3,
                              max_seconds=60)
  assert timing['faults_per_call'] > 8_000
  assert workers.time_calls(lambda: None, lambda _: None, warmup=1,
                            repeats=3, max_seconds=60)['faults_per_call'] < 50


@pytest.mark.skipif(not memory.release_free_heap(), reason='needs glibc')
def test_free_heap_is_handed_back_before_the_baseline():
  # Without it, memory freed before the work (compilation) could leave the
  # process during the work and hide the work's growth: a 16K-token `cst`
  # forward point measured a net peak of 0 (baseline 786 MB), and 329 MB
  # with it (baseline 355 MB).
  with memory.PeakMemory() as meter:
    pass
  assert meter.method.endswith('free heap trimmed first)'), meter.method
