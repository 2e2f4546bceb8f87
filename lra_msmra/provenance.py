"""Where a result comes from: code commit, source digest, package versions
and devices.

Importing this module does not import JAX (the benchmarks' parent process
records its environment without it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence


if TYPE_CHECKING:
  import jax

PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy',
            'ml_collections')


def git_commit(path: Optional[str] = None) -> dict[str, Any]:
  """Commit of the checkout holding `path` (default: this package), and
  whether tracked files differ from it; {} outside a git checkout."""
  path = path or os.path.dirname(os.path.abspath(__file__))

  def git(*args):
    return subprocess.run(['git', '-C', path, *args], capture_output=True,
                          text=True, timeout=30, check=False)

  try:
    head = git('rev-parse', 'HEAD')
  except (OSError, subprocess.SubprocessError):
    return {}
  if head.returncode != 0:
    return {}
  status = git('status', '--porcelain', '--untracked-files=no')
  return {'commit': head.stdout.strip(),
          'dirty': bool(status.stdout.strip())}


def source_digest(path: Optional[str] = None) -> str:
  """SHA-256 (first 16 hex digits) of the package's Python sources under
  `path` (default: this package): each file's path relative to `path` and
  its bytes, in sorted order. Names the code of a run where there is no git
  checkout (a copied tree, an installed package); equal digests mean equal
  package code."""
  root = path or os.path.dirname(os.path.abspath(__file__))
  files = []
  for folder, dirs, names in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d != '__pycache__')
    files += [os.path.join(folder, n) for n in names if n.endswith('.py')]
  digest = hashlib.sha256()
  for name in sorted(files, key=lambda f: os.path.relpath(f, root)):
    digest.update(os.path.relpath(name, root).encode() + b'\0')
    with open(name, 'rb') as f:
      digest.update(f.read() + b'\0')
  return digest.hexdigest()[:16]


def versions() -> dict[str, str]:
  out = {'python': platform.python_version()}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = 'not installed'
  return out


def devices(mesh: Optional[jax.sharding.Mesh] = None) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  devs = list(mesh.devices.flat) if mesh is not None else jax.devices()
  return {'platform': devs[0].platform,
          'device_kind': devs[0].device_kind,
          'num_devices': len(devs),
          'num_processes': jax.process_count()}


def extend_history(history: Sequence[Mapping[str, Any]],
                   device: Mapping[str, Any], start: int, step: int
                   ) -> list[dict[str, Any]]:
  """`history` (the checkpoint's list of {devices, from_step, to_step}) with
  this process's steps `start`..`step` on `device` appended."""
  return [dict(h) for h in history] + [
      dict(device, from_step=int(start), to_step=int(step))]


def collect(mesh: Optional[jax.sharding.Mesh] = None) -> dict[str, Any]:
  """Code, versions and devices of this process, for results.json.

  Runs recorded before 2026-11-29 also hold `cpu_unrolled_threefry`, an
  option since removed that drew the same dropout bits faster on the CPU,
  and `host_memory`, the host's huge page settings (transparent huge page
  mode, glibc's `glibc.malloc.hugetlb` tunable, `MALLOC_*` variables),
  which changed the speed of XLA:CPU, never the numbers, and are no longer
  recorded (docs/benchmarks.md, "Page faults", keeps the advice)."""
  return {'code': dict(git_commit(), source_digest=source_digest()),
          'versions': versions(),
          'devices': devices(mesh)}
