r"""The GPU tile sweep: the tile, warps and stages the flash kernels run
fastest with, per head width, timed in the same run as cuDNN.

  python -m lra_msmra_tools.benchmark.tile_sweep --out DIR [--install] \
      [--budget_s 150] [--head_dims 64,128] [--dtypes bfloat16] \
      [--tiles 32,64,128] [--warps 4,8] [--stages 1,2,3] [--length 4096]

On a GPU, for each head dim and dtype, each candidate (the largest tile,
Triton's warps and its pipelining stages) is set in the kernels' tile table
(`lra_msmra.kernels.flash.TILE_TABLE`) and the forward and backward pass of
`flash.flash_attention` is timed (median of `--repeats` calls) at
`--length` tokens, batch 4, 4 heads, over the patterns whose tile is the
largest one (`PATTERNS`: a full window, bidirectional and causal); beside
them, cuDNN's fused attention (`jax.nn.dot_product_attention(...,
implementation='cudnn')`) at the same shape, and the tile-local patterns
of `BACKWARD_PATTERNS` (CST's slices) with the backward fused (one kernel,
5 products per tile) and split (dQ and dK / dV kernels, 7), which the
tile choice does not use. A candidate that does not
compile (shared memory beyond the limit) or fails is recorded and skipped;
the sweep stops starting candidates at `--budget_s`.

It writes DIR/tile_sweep.json (every timing, the device, JAX's version and
the date) and DIR/tile_table.json: per head width and dtype the fastest
candidate's tile (`max_tile`) and, for the first dtype of `--dtypes`, its
warps and stages (`launch`; the table keys them by tile and width alone).
With `--install` the table also replaces lra_msmra/kernels/tile_table.json,
which the kernels read when imported: launch/gpu_benchmark.sh sweeps first,
so that its benchmark runs with the table. Commit the file after checking
it with the compile matrix (`python -m lra_msmra_tools.kernels`).

`--interpret` runs the same sweep in Pallas' interpreter on the CPU at a
short length: the plumbing check of the tests (its times mean nothing, and
cuDNN is left out).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shutil
import sys
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra.kernels import flash

# (name, window): patterns whose calls run on the largest tile.
PATTERNS = (('full', flash.Window('full')),
            ('full-causal', flash.Window('full', causal=True)))
# (name, window): tile-local patterns (`flash.tile_local`: CST's slices),
# whose backward is timed fused ('flash-fused', the default) and split
# ('flash-split': `flash.FUSED_BACKWARD` off) at the kernels' own tiles,
# once per head dim and dtype; not part of the tile choice.
BACKWARD_PATTERNS = (('segment-8', flash.Window('segment', size=8)),
                     ('segment-32', flash.Window('segment', size=32)))
BATCH, HEADS = 4, 4


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(',') if x]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--out', required=True, help='output folder')
  p.add_argument('--install', action='store_true',
                 help=f'also write {flash.TILE_TABLE_FILE}')
  p.add_argument('--budget_s', type=float, default=150.0)
  p.add_argument('--head_dims', default='64,128')
  p.add_argument('--dtypes', default='bfloat16')
  p.add_argument('--tiles', default='32,64,128')
  p.add_argument('--warps', default='4,8')
  p.add_argument('--stages', default='1,2,3')
  p.add_argument('--length', type=int, default=4096)
  p.add_argument('--repeats', type=int, default=10)
  p.add_argument('--interpret', action='store_true',
                 help="Pallas' interpreter on the CPU (a plumbing check)")
  args = p.parse_args(argv)
  for name in ('head_dims', 'tiles', 'warps', 'stages'):
    values = _ints(getattr(args, name))
    if not values or min(values) < 1:
      p.error(f'--{name}: give positive integers, comma-separated.')
    setattr(args, name, values)
  for t in args.tiles:
    if t < flash.MIN_BLOCK or t & (t - 1):
      p.error(f'--tiles: {t} is not a power of two >= {flash.MIN_BLOCK}.')
  args.dtypes = [d for d in args.dtypes.split(',') if d]
  for d in args.dtypes:
    if d not in ('bfloat16', 'float16', 'float32'):
      p.error(f'--dtypes: {d!r}; valid: bfloat16, float16, float32.')
  if not args.interpret and jax.default_backend() != 'gpu':
    p.error(f'no GPU here (JAX backend {jax.default_backend()!r}); run it '
            'on a GPU machine, or pass --interpret for the CPU check.')
  return args


def _median_seconds(fn, args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # Compile and warm up.
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def _inputs(length: int, head_dim: int, dtype: Any):
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  shape = (BATCH, HEADS, length, head_dim)
  q, k, v = (jax.random.normal(key, shape, dtype) for key in keys)
  return q, k, v, jnp.ones((BATCH, length), bool)


def _flash_step(window: flash.Window):
  def loss(q, k, v, valid):
    out = flash.flash_attention(q, k, v, valid, window=window)
    return jnp.sum(out.astype(jnp.float32))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _cudnn_step(causal: bool):
  def loss(q, k, v, valid):
    del valid
    # [B, N, H, d], the layout cuDNN's attention takes.
    t = lambda a: jnp.swapaxes(a, 1, 2)
    out = jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=causal,
                                       implementation='cudnn')
    return jnp.sum(out.astype(jnp.float32))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _timed(record: dict[str, Any], step, inputs, repeats: int,
           echo: bool = True) -> dict[str, Any]:
  """`record` with the median seconds of `step(*inputs)`, or the error of
  a step that does not compile or run."""
  try:
    record['seconds'] = _median_seconds(step, inputs, repeats)
  except Exception as e:  # pylint: disable=broad-except
    record['error'] = f'{type(e).__name__}: {str(e)[:300]}'
  if echo:
    print(json.dumps(record), flush=True)
  return record


def _with_candidate(width: int, dtype: Any, tile: int, warps: int,
                    stages: int) -> dict[str, Any]:
  """A tile table holding only this candidate."""
  return {'max_tile': {flash.table_key(width, dtype): tile},
          'launch': {flash.launch_key(tile, width): {'warps': warps,
                                                     'stages': stages}}}


def sweep(args: argparse.Namespace) -> dict[str, Any]:
  start = time.time()
  records = []
  saved = flash.TILE_TABLE
  try:
    for head_dim, dtype_name in itertools.product(args.head_dims,
                                                  args.dtypes):
      dtype = jnp.dtype(dtype_name)
      width = flash.tile_size(head_dim, 2**30)
      inputs = _inputs(args.length, head_dim, dtype)
      if not args.interpret:
        for name, window in PATTERNS:
          records.append(_timed(
              {'head_dim': head_dim, 'dtype': dtype_name, 'pattern': name,
               'kernel': 'cudnn'}, _cudnn_step(window.causal), inputs,
              args.repeats, echo=False))
      records += _backward_forms(head_dim, dtype_name, inputs, args.repeats)
      for tile, warps, stages in itertools.product(args.tiles, args.warps,
                                                   args.stages):
        if time.time() - start > args.budget_s:
          return {'records': records, 'stopped': 'budget'}
        flash.TILE_TABLE = _with_candidate(width, dtype, tile, warps, stages)
        for name, window in PATTERNS:
          records.append(_timed(
              {'head_dim': head_dim, 'dtype': dtype_name, 'pattern': name,
               'kernel': 'flash', 'tile': tile, 'warps': warps,
               'stages': stages}, _flash_step(window), inputs,
              args.repeats))
  finally:
    flash.TILE_TABLE = saved
  return {'records': records, 'stopped': None}


def _backward_forms(head_dim: int, dtype_name: str, inputs,
                    repeats: int) -> list[dict[str, Any]]:
  """The forward and backward pass of each `BACKWARD_PATTERNS` window with
  its backward fused and split."""
  records = []
  saved = flash.FUSED_BACKWARD
  try:
    for name, window in BACKWARD_PATTERNS:
      for fused in (True, False):
        flash.FUSED_BACKWARD = fused
        records.append(_timed(
            {'head_dim': head_dim, 'dtype': dtype_name, 'pattern': name,
             'kernel': 'flash-fused' if fused else 'flash-split'},
            _flash_step(window), inputs, repeats))
  finally:
    flash.FUSED_BACKWARD = saved
  return records


def best_table(records: Sequence[dict[str, Any]], dtypes: Sequence[str]
               ) -> dict[str, Any]:
  """The tile table of the fastest candidates: per (head dim, dtype), the
  candidate with the least total time over the patterns, among those
  timed on every pattern."""
  table = {'max_tile': {}, 'launch': {}}
  groups: dict[tuple, dict[tuple, list]] = {}
  for r in records:
    if r['kernel'] != 'flash':
      continue
    key = (r['head_dim'], r['dtype'])
    groups.setdefault(key, {}).setdefault(
        (r['tile'], r['warps'], r['stages']), []).append(r)
  for (head_dim, dtype), candidates in sorted(groups.items()):
    timed = {c: sum(r['seconds'] for r in rs) for c, rs in candidates.items()
             if len(rs) == len(PATTERNS) and all('seconds' in r for r in rs)}
    if not timed:
      continue
    tile, warps, stages = min(timed, key=timed.get)
    width = flash.tile_size(head_dim, 2**30)
    table['max_tile'][flash.table_key(width, dtype)] = tile
    if dtype == dtypes[0]:
      table['launch'][flash.launch_key(tile, width)] = {'warps': warps,
                                                        'stages': stages}
  return table


def main(argv: Sequence[str]) -> int:
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  result = sweep(args)
  device = jax.devices()[0]
  result.update(
      date=datetime.date.today().isoformat(), jax=jax.__version__,
      device=device.device_kind, platform=device.platform,
      interpret=args.interpret, length=args.length, batch=BATCH,
      heads=HEADS)
  with open(os.path.join(args.out, 'tile_sweep.json'), 'w') as f:
    json.dump(result, f, indent=1)
  table = best_table(result['records'], args.dtypes)
  table_path = os.path.join(args.out, 'tile_table.json')
  with open(table_path, 'w') as f:
    json.dump(dict(table, measured={
        'date': result['date'], 'jax': result['jax'],
        'device': result['device'], 'length': args.length,
        'command': 'python -m lra_msmra_tools.benchmark.tile_sweep'}), f,
              indent=1)
  flash.load_tile_table(table_path)  # Refuses what the kernels would.
  print(f'{len(result["records"])} timings; tile table: {table_path}'
        + (f' (stopped: {result["stopped"]})' if result['stopped'] else ''))
  if args.install:
    shutil.copyfile(table_path, flash.TILE_TABLE_FILE)
    print(f'installed as {flash.TILE_TABLE_FILE}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
