"""Where a result comes from: code commit, package versions and devices."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from typing import Any, Mapping, Optional, Sequence

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


def versions() -> dict[str, str]:
  out = {'python': platform.python_version()}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = 'not installed'
  return out


def devices(mesh: Optional[jax.sharding.Mesh] = None) -> dict[str, Any]:
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
  """Code, versions and devices of this process, for results.json."""
  return {'code': git_commit(), 'versions': versions(),
          'devices': devices(mesh)}
