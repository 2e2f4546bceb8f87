"""Which memory the benchmarks predict from: the device's on GPU/TPU."""

from lra_msmra.benchmark import common

GIB = common.GIB


def test_cpu_points_use_resident_memory_and_the_host_budget():
  rec = {'memory': {'method': 'resident memory (VmHWM after clear_refs)',
                    'peak_bytes': 5 * GIB},
         'process_peak_bytes': 7 * GIB}
  assert common.measured_bytes(rec) == 7 * GIB
  assert common.prediction_budget(rec, None, 20 * GIB) == 20 * GIB
  assert common.prediction_budget(rec, 8.0, 8 * GIB) == 8 * GIB


def test_accelerator_points_use_device_memory_and_its_size():
  rec = {'memory': {'method': common.DEVICE_METHOD, 'peak_bytes': 30 * GIB,
                    'limit_bytes': 80 * GIB},
         'process_peak_bytes': 3 * GIB}
  assert common.measured_bytes(rec) == 30 * GIB
  assert common.prediction_budget(rec, None, 200 * GIB) == 72 * GIB
  assert common.prediction_budget(rec, 16.0, 200 * GIB) == 16 * GIB
  no_limit = {'memory': {'method': common.DEVICE_METHOD, 'peak_bytes': 1}}
  assert common.prediction_budget(no_limit, None, 200 * GIB) is None


def test_peak_memory_reads_device_statistics_where_there_are_some():
  class Device:
    def __init__(self):
      self.in_use = 100

    def memory_stats(self):
      return {'bytes_in_use': self.in_use, 'peak_bytes_in_use': 900,
              'bytes_limit': 1000}

  device = Device()
  with common.PeakMemory(device) as meter:
    device.in_use = 300
  result = meter.result()
  assert result['method'] == common.DEVICE_METHOD
  assert result['net_peak_bytes'] == 800 and result['limit_bytes'] == 1000
  rec = {'memory': result, 'process_peak_bytes': 5}
  assert common.measured_bytes(rec) == 900
  assert common.prediction_budget(rec, None, None) == 900
