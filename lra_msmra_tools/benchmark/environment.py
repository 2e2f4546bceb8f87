"""Where and how a benchmark ran, for its report: the command line, the
host (CPU model, cores, memory, load), package versions and the JAX device.

`environment()` needs no JAX import; `jax_device_info()` is called inside a
worker that has JAX loaded.
"""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any, Iterable, Optional, Sequence

from lra_msmra_tools.benchmark import memory


def command_line(argv: Sequence[str], module: str) -> str:
  """The command as a user would type it (for the report)."""
  args = ' '.join(_shell_quote(a) for a in argv[1:])
  return f'python -m {module} {args}'.strip()


def _shell_quote(arg: str) -> str:
  import shlex  # pylint: disable=g-import-not-at-top
  return shlex.quote(arg)


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
  return {
      'date_utc': datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      'python': platform.python_version(),
      'os': platform.platform(),
      'cpu': _cpu_model(),
      'cpu_count': os.cpu_count(),
      'cores': cpu_cores(),
      'memory_total_bytes': memory.memory_total_bytes(),
      'memory_available_bytes': memory.memory_available_bytes(),
      'load_average': list(os.getloadavg()),
      'versions': {p: _version(p) for p in packages},
  }


def jax_device_info() -> dict[str, Any]:
  """Backend and device of the current JAX process."""
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  return {'backend': jax.default_backend(), 'device_kind': device.device_kind,
          'device_count': jax.device_count(), 'platform': device.platform}
