"""Analytic matmul FLOPs of a JAX function, counted from its jaxpr.

`matmul_flops(fn, *args)` traces `fn` and adds 2 x (multiply-adds) of every
`dot_general` (einsum, Dense) and `conv_general_dilated` in it, from the
operand shapes alone: the count is exact for our implementation, including
its internal padding and, for forward+backward, the transposed products of
the backward pass. Element-wise work (softmax, LayerNorm, masking) is not
counted, as in the usual FLOP tables (e.g. fvcore's, which Transformer-LS
reports). Sub-programs are followed: `pjit`, `custom_jvp`/`custom_vjp`,
`remat`, `scan` (times its length) and `cond` (the costliest branch). A
`while` body is counted once and reported in `notes`, since its trip count
is not static.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator


def sub_jaxprs(value: Any) -> Iterator[Any]:
  """Jaxprs inside an equation parameter (ClosedJaxpr, Jaxpr or sequences)."""
  if hasattr(value, 'eqns'):
    yield value
  elif hasattr(value, 'jaxpr') and hasattr(value.jaxpr, 'eqns'):
    yield value.jaxpr
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from sub_jaxprs(v)


def _eqn_flops(eqn: Any) -> int:
  name = eqn.primitive.name
  if name == 'dot_general':
    (lhs_contract, _), _ = eqn.params['dimension_numbers']
    lhs = eqn.invars[0].aval
    out = eqn.outvars[0].aval
    contract = math.prod(lhs.shape[d] for d in lhs_contract)
    return 2 * math.prod(out.shape) * contract
  if name == 'conv_general_dilated':
    rhs = eqn.invars[1].aval
    out = eqn.outvars[0].aval
    spec = eqn.params['dimension_numbers'].rhs_spec
    # rhs_spec = (out feature dim, in feature dim, spatial dims...); the in
    # feature dim is already per group.
    per_output = rhs.shape[spec[1]] * math.prod(rhs.shape[d]
                                                for d in spec[2:])
    return 2 * math.prod(out.shape) * per_output
  return 0


def jaxpr_flops(jaxpr: Any, notes: set[str]) -> int:
  """Matmul FLOPs of a (closed or open) jaxpr; adds caveats to `notes`."""
  jaxpr = getattr(jaxpr, 'jaxpr', jaxpr)
  total = 0
  for eqn in jaxpr.eqns:
    total += _eqn_flops(eqn)
    name = eqn.primitive.name
    if name == 'cond':
      branches = eqn.params['branches']
      total += max(jaxpr_flops(b, notes) for b in branches)
      continue
    subs = [j for v in eqn.params.values() for j in sub_jaxprs(v)]
    if not subs:
      continue
    times = eqn.params.get('length', 1) if name == 'scan' else 1
    if name == 'while':
      notes.add('while loop bodies counted once')
    total += times * sum(jaxpr_flops(j, notes) for j in subs)
  return total


def matmul_flops(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
  """Traces `fn(*args)` and returns {'flops': int, 'notes': [str]}."""
  import jax  # pylint: disable=g-import-not-at-top
  notes: set[str] = set()
  flops = jaxpr_flops(jax.make_jaxpr(fn)(*args), notes)
  return {'flops': flops, 'notes': sorted(notes)}
