"""`'xla_rows'`: the `'xla'` code, evaluated on CPU one batch row at a time.

XLA:CPU allocates a compiled program's temporary buffer anew at every call,
and glibc maps a buffer over 32 MiB afresh, so a whole batch's activations
are page-faulted in at every call (`lra_msmra.benchmark.cpu_malloc`); one
row at a time the buffer is a batch's worth smaller. A mechanism offers this
implementation where a CPU benchmark shows the gain (docs/benchmarks.md,
"Page faults"); it is never the default.

Only a deterministic call that is not differentiated, lowered for CPU, in a
process with one CPU device, loops (`loops`, `by_rows`). Differentiated
(training), on GPU and TPU, and with several CPU devices (a CPU mesh, where
the batch may be split over devices and a loop over its rows would gather
the whole batch onto every device), the layer is exactly the `'xla'` one.
Where it loops, the values are those of the whole-batch call up to float32
rounding: XLA:CPU may order a reduction along the sequence differently for
one row than for several.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
IMPLEMENTATION = 'xla_rows'


def one_cpu_device() -> bool:
  """Whether this process has one CPU device, where `by_rows` loops."""
  return len(jax.devices('cpu')) == 1


def loops(module: nn.Module, deterministic: bool,
          kwargs: Mapping[str, Any]) -> bool:
  """Whether a call of the bound layer `module` may go `by_rows`.

  Not with dropout, with `kwargs` (e.g. `shared`), while initialising, or
  with `intermediates` or `metrics` mutable (a loop would sow per row), nor
  in a process with several CPU devices.
  """
  return (deterministic and not kwargs and not module.is_initializing()
          and not any(module.is_mutable_collection(c)
                      for c in ('intermediates', 'metrics'))
          and one_cpu_device())


def by_rows(module: nn.Module, x: Array, padding_mask: Array | None
            ) -> Array:
  """`module(x, padding_mask=...)` (deterministic) as its `'xla'`
  implementation, one batch row at a time on CPU unless differentiated.

  The row loop needs the layer as a pure function of its variables, so it
  applies an unbound copy of the module to a snapshot of its variables; the
  parameters and their gradients are the module's own.
  """
  detached = module.clone(parent=None, implementation='xla')
  if padding_mask is None:
    padding_mask = jnp.ones(x.shape[:2], bool)

  def apply(variables, x, padding_mask):
    return detached.apply(variables, x, padding_mask=padding_mask,
                          deterministic=True)
  return _by_rows_unless_differentiated(apply, module.variables, x,
                                        padding_mask)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _by_rows_unless_differentiated(fn: Callable[..., Array], variables,
                                   *batched):
  """`fn(variables, *batched)`, lowered for CPU as a loop over batch rows.

  `fn` must treat rows independently and return `[batch, ...]`. Only the
  evaluation without differentiation loops: under `jax.grad` / `jax.vjp`
  the forward rule below runs `fn` on the whole batch, so training computes
  exactly what it would without this wrapper. GPU and TPU lowerings never
  loop.
  """
  def rows(variables, *batched):
    def one(row):
      return fn(variables, *(a[None] for a in row))[0]
    return jax.lax.map(one, batched)
  return jax.lax.platform_dependent(variables, *batched, cpu=rows,
                                    default=fn)


def _by_rows_fwd(fn, variables, *batched):
  return jax.vjp(fn, variables, *batched)


def _by_rows_bwd(fn, pullback, cotangent):
  del fn
  return pullback(cotangent)


_by_rows_unless_differentiated.defvjp(_by_rows_fwd, _by_rows_bwd)
