"""Kernels under data parallelism: one kernel call per batch shard.

XLA's partitioner cannot split a Pallas call: given an operand split over
the mesh axis `data`, it gathers the whole batch onto every device and
runs the whole kernel there. `batch_parallel` instead runs the kernel under
`jax.shard_map`, once per device on that device's batch rows, when the
program is traced inside a mesh that has a `data` axis of more than one
device (`under_mesh`, which the trainer's steps use). Outside a mesh, or on
one device, it is a plain call.

The function is told the global index of its first batch row, so that
anything drawn per row (the kernels' dropout masks) is the same however
the batch is split.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Sequence

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from lra_msmra.sharding import DATA_AXIS


def _data_shards(mesh: Any) -> int:
  if mesh.empty or DATA_AXIS not in mesh.axis_names:
    return 1
  return dict(zip(mesh.axis_names, mesh.axis_sizes))[DATA_AXIS]


def batch_parallel(fn: Callable[..., Any], batched: Sequence[Any],
                   replicated: Sequence[Any] = ()) -> Any:
  """`fn(first_row, *batched, *replicated)`, per data shard inside a mesh.

  Args:
    fn: returns an array (or pytree of arrays) whose leading axis is the
      batch; `first_row` is the global index of the first row it gets (an
      int32 scalar; 0 outside a mesh).
    batched: pytrees whose array leaves have the batch as leading axis
      (None leaves allowed).
    replicated: pytrees every shard gets whole (e.g. a seed).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if _data_shards(mesh) == 1:
    return fn(jax.numpy.int32(0), *batched, *replicated)
  count = len(batched)

  def local(*args):
    rows = jax.tree_util.tree_leaves(args[:count])[0].shape[0]
    first = lax.axis_index(DATA_AXIS).astype(jax.numpy.int32) * rows
    return fn(first, *args[:count], *args[count:])

  specs = (tuple(jax.tree_util.tree_map(lambda _: P(DATA_AXIS), b)
                 for b in batched)
           + tuple(jax.tree_util.tree_map(lambda _: P(), r)
                   for r in replicated))
  return jax.shard_map(local, mesh=mesh, in_specs=specs,
                       out_specs=P(DATA_AXIS), check_vma=False)(
                           *batched, *replicated)


@contextlib.contextmanager
def mesh_context(mesh: jax.sharding.Mesh) -> Iterator[None]:
  """Traces inside `mesh` (its abstract form: no devices are touched)."""
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    yield


def under_mesh(fn: Callable[..., Any], mesh: jax.sharding.Mesh
               ) -> Callable[..., Any]:
  """`fn`, traced inside `mesh` (for `jax.jit`), so that kernels split by
  batch shard."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with mesh_context(mesh):
      return fn(*args, **kwargs)
  return wrapped
