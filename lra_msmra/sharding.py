"""Device mesh and shardings: data parallelism under `jax.jit`, no pmap.

Parameters and optimizer state are replicated; batches are split along their
first axis over the mesh axis `data`, which spans every device of every
process. Each process supplies its own slice of the global batch and
`jax.make_array_from_process_local_data` assembles the global array.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

DATA_AXIS = 'data'


def create_mesh(devices: Any = None) -> Mesh:
  """A 1-D mesh over all devices (or `devices`) with axis `data`."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices).reshape(-1), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def check_batch_size(name: str, global_batch: int, mesh: Mesh,
                     micro_batches: int = 1) -> None:
  """Raises ValueError unless each (micro-)batch splits evenly over devices."""
  n = mesh.devices.size
  if global_batch % (n * micro_batches):
    what = (f'{n} devices' if micro_batches == 1 else
            f'{n} devices x {micro_batches} gradient-accumulation steps')
    raise ValueError(
        f'config.{name}={global_batch} is not divisible by {what}; use a '
        f'multiple of {n * micro_batches} (batch sizes are global).')


def to_global(batch: Mapping[str, np.ndarray], mesh: Mesh
              ) -> dict[str, jax.Array]:
  """Turns this process's slice of a batch into global sharded arrays."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v)
          for k, v in batch.items()}
