"""Combiner's prefix and suffix span pools along the lines of a grid.

Entry r of a line's prefix pool pools the real members strictly before
position r ('max': their elementwise maximum, 'mean': their mean; 0 where
there is none); its suffix pool those strictly after r. These are the span
abstractions of Combiner-Axial and -Mixture (`lra_msmra.kernels.combiner`),
the same function as `combiner_spans.prefix_pool`, which the `'xla'`
implementation and the TPU form here use.

In XLA a prefix maximum is a cumulative maximum, and its gradient goes
through `lax.associative_scan`: a Combiner-Axial layer at ListOps' length
had some 70 pads and slices of activations around its kernels, most of
them there. Here one kernel pools every operand in every direction, and
one kernel takes the gradient, each a sequential sweep along the line per
program (a line and a head), with the running maximum or sum in float32:

* forward: the pooled values, in the operands' dtype;
* backward, max: a member's gradient is the sum of the cotangents of the
  positions whose maximum it is (the first of equal maxima), found in one
  reverse sweep from the operand and the pooled values; mean: a reverse
  sweep of cotangent / count.

Operands are flash's 'bnhd' sequence operands `[rows, L, fold * H, d]`
(`flash._Static`'s fold: a grid's columns are B * m lines read in place),
so the kernels read the model's layout, with no transposed copy, on GPUs
and in Pallas' interpreter on the CPU. Mosaic's loads and stores are whole
(8, 128) tiles, and a sweep reads one position at a time, so TPUs keep
XLA's pools (`combiner_spans.prefix_pool`, through `lax.platform_dependent`;
on the CPU too under `flash.INTERPRET_TPU_FORM`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
from jax import lax
from jax.experimental import pallas as pl
import jax.numpy as jnp

from lra_msmra.kernels import combiner_spans
from lra_msmra.kernels import flash

Array = jax.Array

DIRECTIONS = ('prefix', 'suffix')
KINDS = ('max', 'mean')


class _Static(NamedTuple):
  kind: str
  directions: tuple[str, ...]
  heads: int
  fold: int


def _position(direction: str, step: Array, length: int) -> Array:
  """The position a sweep in `direction` order reaches at `step`."""
  return step if direction == 'prefix' else length - 1 - step


def _forward_kernel(*refs, static: _Static, count: int, length: int):
  xs, flags, outs = refs[:count], refs[count], refs[count + 1:]
  for a, x_ref in enumerate(xs):
    for k, direction in enumerate(static.directions):
      out_ref = outs[a * len(static.directions) + k]
      width = x_ref.shape[-1]

      def body(step, carry, x_ref=x_ref, out_ref=out_ref,
               direction=direction):
        run, seen = carry
        r = _position(direction, step, length)
        row = x_ref[pl.ds(r, 1), :].astype(jnp.float32)
        ok = flags[pl.ds(r, 1), :] > 0
        if static.kind == 'max':
          pooled = run
          run = jnp.where(ok, jnp.maximum(run, row), run)
        else:
          pooled = run / jnp.maximum(seen, 1.0)
          run = jnp.where(ok, run + row, run)
        out_ref[pl.ds(r, 1), :] = jnp.where(seen > 0, pooled,
                                            0.0).astype(out_ref.dtype)
        return run, seen + ok.astype(jnp.float32)
      start = -jnp.inf if static.kind == 'max' else 0.0
      lax.fori_loop(0, length, body,
                    (jnp.full((1, width), start, jnp.float32),
                     jnp.zeros((1, 1), jnp.float32)))


def _backward_kernel(*refs, static: _Static, count: int, length: int):
  """Per operand and direction, the gradient (one output each: `_pools_bwd`
  adds an operand's directions, so no output is read back here)."""
  kinds = len(static.directions)
  xs = refs[:count]
  pooled = refs[count:count + count * kinds]
  d_pooled = refs[count + count * kinds:count + 2 * count * kinds]
  flags = refs[count + 2 * count * kinds]
  outs = refs[count + 2 * count * kinds + 1:]

  def total(step, n):
    return n + (flags[pl.ds(step, 1), :] > 0).astype(jnp.float32)
  members = lax.fori_loop(0, length, total, jnp.zeros((1, 1), jnp.float32))
  for a, x_ref in enumerate(xs):
    for k, direction in enumerate(static.directions):
      index = a * kinds + k
      y_ref, dy_ref, dx_ref = pooled[index], d_pooled[index], outs[index]
      width = x_ref.shape[-1]

      # Positions in reverse sweep order: p = length - 1 .. 0 of the
      # direction's order. `after`: members at p and beyond, so that
      # `members - after` are those before p (the pool's).
      def body(step, carry, x_ref=x_ref, y_ref=y_ref, dy_ref=dy_ref,
               dx_ref=dx_ref, direction=direction):
        acc, first_next, dy_next, after = carry
        r = _position(direction, length - 1 - step, length)
        ok = flags[pl.ds(r, 1), :] > 0
        after = after + ok.astype(jnp.float32)
        before = members - after
        dy = dy_ref[pl.ds(r, 1), :].astype(jnp.float32)
        if static.kind == 'max':
          # acc: the cotangents of the later positions whose maximum is
          # this one's, if it is the first of its value.
          acc = jnp.where(first_next, 0.0, acc) + dy_next
          x = x_ref[pl.ds(r, 1), :].astype(jnp.float32)
          y = y_ref[pl.ds(r, 1), :].astype(jnp.float32)
          first = ok & ((before == 0) | (x > y))
          dx_ref[pl.ds(r, 1), :] = jnp.where(first, acc,
                                             0.0).astype(dx_ref.dtype)
          return acc, first, dy, after
        # mean: acc = sum over later positions q of dy_q / (members before
        # q), for those with any.
        acc = acc + dy_next
        dx_ref[pl.ds(r, 1), :] = jnp.where(ok, acc, 0.0).astype(dx_ref.dtype)
        share = jnp.where(before > 0, dy / jnp.maximum(before, 1.0), 0.0)
        return acc, first_next, share, after
      zeros = jnp.zeros((1, width), jnp.float32)
      lax.fori_loop(0, length, body,
                    (zeros, jnp.zeros((1, width), bool), zeros,
                     jnp.zeros((1, 1), jnp.float32)))


def _call(kernel, static: _Static, inputs: int, outputs: list, rows: int,
          width: int, length: int, name: str):
  """`interpret -> f(*sequence operands, flags)`: the `pallas_call` of
  `kernel` over the lines of its `inputs` sequence operands of `rows`
  rows and the flags (`_flags`), writing `outputs` (ShapeDtypeStructs of
  sequence operands): a program per line and head. GPUs and the CPU's
  interpreter only (the module docstring)."""
  batch = rows * static.fold
  spec = flash._tile_spec(length, width, layout='bnhd', fold=static.fold,
                          heads=static.heads)
  flag_spec = flash._column_spec(length)
  launch = flash.Launch(tile=flash.MIN_BLOCK, width=width, warps=1,
                        stages=1)

  def run(interpret):
    params = None if interpret else launch.triton()
    call = pl.pallas_call(
        kernel, grid=(batch, static.heads, 1),
        in_specs=[spec] * inputs + [flag_spec],
        out_specs=[spec] * len(outputs), out_shape=outputs,
        compiler_params=params, interpret=interpret, name=name)
    return lambda *arrays: tuple(call(*arrays))
  return run


def _xla_pools(static: _Static, xs, valid):
  """The same pools by `combiner_spans.prefix_pool`, on the operands'
  lines (the TPU form)."""
  outs = []
  for x in xs:
    rows, length, folded, width = x.shape
    # [rows, L, fold, H, d] with validity [rows, fold, L].
    grid = x.reshape(rows, length, static.fold, static.heads, width)
    member = jnp.swapaxes(valid.reshape(rows, static.fold, length), 1, 2)
    for direction in static.directions:
      pooled, _ = combiner_spans.prefix_pool(
          grid, member[..., None, None], axis=1, kind=static.kind,
          reverse=direction == 'suffix')
      outs.append(pooled.reshape(rows, length, folded, width))
  return tuple(outs)


def _flags(valid: Array) -> Array:
  """bool `[lines, L]` -> int32 `[lines, L, 1]`: one flag per position,
  read at a sublane offset."""
  return valid.astype(jnp.int32)[..., None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pools(static: _Static, xs: tuple, valid: Array) -> tuple:
  return _pools_fwd(static, xs, valid)[0]


def _pools_fwd(static, xs, valid):
  rows, length, _, width = xs[0].shape
  outputs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs
             for _ in static.directions]
  kernel = functools.partial(_forward_kernel, static=static, count=len(xs),
                             length=length)
  call = _call(kernel, static, len(xs), outputs, rows, width, length,
               'combiner_span_pools')
  tpu = lambda *a: _xla_pools(static, a[:-1], valid)
  out = lax.platform_dependent(
      *xs, _flags(valid), cuda=call(False), rocm=call(False), tpu=tpu,
      default=tpu if flash.INTERPRET_TPU_FORM else call(True))
  return out, (xs, valid, out)


def _pools_bwd(static, residuals, d_out):
  xs, valid, out = residuals
  rows, length, _, width = xs[0].shape
  kinds = len(static.directions)
  d_out = tuple(d.astype(o.dtype) for d, o in zip(d_out, out))
  outputs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs
             for _ in static.directions]
  kernel = functools.partial(_backward_kernel, static=static, count=len(xs),
                             length=length)
  call = _call(kernel, static, len(xs) + 2 * len(out), outputs, rows, width,
               length, 'combiner_span_pools_grad')

  def kernels(interpret):
    """Each operand's gradient: the sum of the kernel's per direction."""
    run = call(interpret)

    def grads(*arrays):
      per_direction = run(*arrays)
      return tuple(functools.reduce(jnp.add,
                                    per_direction[a * kinds:(a + 1) * kinds])
                   for a in range(len(xs)))
    return grads

  def tpu(*arrays):
    _, vjp = jax.vjp(lambda *a: _xla_pools(static, a, valid),
                     *arrays[:len(xs)])
    return vjp(d_out)
  d_xs = lax.platform_dependent(
      *xs, *out, *d_out, _flags(valid), cuda=kernels(False),
      rocm=kernels(False), tpu=tpu,
      default=tpu if flash.INTERPRET_TPU_FORM else kernels(True))
  return tuple(d_xs), None


_pools.defvjp(_pools_fwd, _pools_bwd)


def pools(xs: tuple[Array, ...], valid: Array, *, kind: str,
          directions: tuple[str, ...], heads: int, fold: int = 1
          ) -> tuple[Array, ...]:
  """The span pools of every operand in every direction.

  Args:
    xs: flash 'bnhd' sequence operands `[rows, L, fold * heads, d]`, d a
      power of two of at least 16: rows * fold lines of L positions.
    valid: bool `[rows * fold, L]`, True = a real member (line b * fold +
      f of row b).
    kind: 'max' or 'mean'.
    directions: ('prefix',), ('suffix',) or both.
    heads: H.
    fold: lines per row of the operands.

  Returns:
    Per operand, per direction, the pooled values, shaped like the
    operand. Differentiable in `xs`.
  """
  if kind not in KINDS:
    raise ValueError(f'Unknown pool kind {kind!r}; valid: {KINDS}.')
  if not directions or any(d not in DIRECTIONS for d in directions):
    raise ValueError(f'directions={directions!r}: one or both of '
                     f'{DIRECTIONS}.')
  return _pools(_Static(kind, tuple(directions), heads, fold), tuple(xs),
                valid)
