r"""How much work the Pallas kernels do for the work they must do: a report.

  python -m lra_msmra_tools.benchmark.kernel_work [--cases listops,pathx] \
      [--batch 4] [--json F.json] [--doc docs/benchmarks.md]

For each mechanism variant with a Pallas implementation
(`lra_msmra_tools.kernels.VARIANTS`), at the shape, heads and knobs of its
ListOps config (2,001 tokens with CLS) and at 16K (its Path-X config's
knobs and 16,384 pixels, with 4 heads of 64 as in the device benchmark's
layer), batch 4, one
attention layer (`StandaloneAttention`, as the encoder builds it) with
`implementation='pallas'`: the jaxpr of its forward pass and of the
gradients of its parameters and input, read as the GPU program (the
`cuda` branch of each kernel's platform switch). Nothing runs and nothing
compiles, so the report takes seconds and needs no accelerator.

Per case, in one table:

* kernels per layer, forward and backward (`pallas_call`s);
* XLA transposes, pads and gathers outside the kernels (plus cumulative
  sums and maxima, which XLA lowers as scans), forward and backward
  together; pads that only remove elements (the gradient of a pad: a
  slice) apart, as crops;
* programs per grid: the smallest grid of any kernel, against 2 x the 132
  SMs of an H100 (fewer programs leave SMs idle);
* matmuls per tile: the most `dot_general`s in one loop body of a kernel,
  forward / backward (FlashAttention-2 does 2 / 5); in the backward, those
  of the fused kernel of tile-local passes (`flash.tile_local`: dQ, dK and
  dV of a tile in one kernel) apart from those of the split passes (a dQ
  kernel and a dK / dV kernel, added up);
* for the kernels built on `kernels/flash.py` (cst, long_short, every
  combiner variant): key tiles visited against key tiles that hold a key
  some query of the tile sees, and the useful share of computed scores
  (scores a query may use over the scores the visited tiles compute) of the
  sequence keys ('window') and the extra keys ('extra') of each call of the
  layer in its order (cst: local, then global), counted from the
  call's own window and extra-key rules (`key_range`, `mask`) with every
  key valid; and per pass, both parts together where a call has both.
  Calls that pad for themselves (Combiner's) are counted at their padded
  sizes. The other kernels' tiles are not counted ('-');
* kernels whose exponentials are all exp2 (of those with any), and flash
  kernels whose tile loops branch per tile to a body without the mask for
  interior tiles (of all flash kernels).

`--json` writes the records; `--doc` puts the table between the markers
of the work-report section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra import config_lib
from lra_msmra import data as data_lib
from lra_msmra.attention import standalone
from lra_msmra.kernels import flash
from lra_msmra_tools import kernels as kernel_matrix
from lra_msmra_tools import reporting

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# The config file of each variant's mechanism, per task of the report.
CONFIG_FILES = {
    'cst': 'cst', 'long_short': 'long_short', 'adamra': 'adamra',
    'combiner_fixed': 'combiner_fixed',
    'combiner_axial_vertical': 'combiner_axial',
    'combiner_axial_horizontal': 'combiner_axial',
    'combiner_mixture': 'combiner_fixed',
}
# 'listops': the ListOps config's shape; '16k': the Path-X config's knobs and
# length (16,384) at the device benchmark's layer (4 heads of 64), where
# the targets are set.
TASKS = ('listops', '16k')
WIDE = {'heads': 4, 'head_dim': 64}
H100_SMS = 132
XLA_GLUE = ('transpose', 'pad', 'gather', 'cumsum', 'cummax')
# The backward kernel of a tile-local flash pass (`flash.tile_local`): dQ,
# dK and dV of one tile in one kernel.
FUSED_KERNEL = 'flash_window_fused_bwd'
DOC_START = '<!-- kernel-work:start -->'
DOC_END = '<!-- kernel-work:end -->'


@dataclasses.dataclass(frozen=True)
class Case:
  variant: str
  task: str
  length: int
  heads: int
  head_dim: int
  batch: int
  knobs: dict


def case(variant: str, task: str, batch: int) -> Case:
  """The variant at its `task` config's shape and knobs."""
  folder = 'pathx' if task == '16k' else task
  path = os.path.join(ROOT, 'configs', folder,
                      CONFIG_FILES[variant] + '.py')
  config = config_lib.load_sibling(path, CONFIG_FILES[variant]).get_config()
  mechanism, variant_kw = kernel_matrix.VARIANTS_BY_LABEL[variant]
  if config.model.attention != mechanism:
    raise ValueError(f'{path} configures {config.model.attention!r}, not '
                     f'{mechanism!r}.')
  knobs = dict(config.model.attention_kw)
  knobs.update(variant_kw)
  spec = data_lib.get_model_spec(config)
  length = spec['max_len'] + int(config.model.pooling == 'CLS')
  m = config.model
  heads, head_dim = m.num_heads, m.qkv_dim // m.num_heads
  if task == '16k':
    heads, head_dim = WIDE['heads'], WIDE['head_dim']
  return Case(variant, task, length, heads, head_dim, batch, knobs)


# ------------------------------------------------------------ the jaxpr


def _is_triton_branch(jaxpr) -> bool:
  for eqn in _eqns(jaxpr, cuda_only=False):
    if eqn.primitive.name == 'pallas_call':
      params = eqn.params.get('compiler_params')
      return 'triton' in type(params).__module__
  return False


def _sub_jaxprs(eqn, cuda_only: bool):
  """The jaxprs inside `eqn`; of a platform switch only its cuda branch."""
  if eqn.primitive.name == 'pallas_call':
    return []
  if eqn.primitive.name == 'cond' and cuda_only:
    branches = [b.jaxpr for b in eqn.params['branches']]
    platforms = eqn.params.get('branches_platforms')
    if platforms:  # A platform switch: its cuda branch, else its default.
      cuda = [b for b, p in zip(branches, platforms) if p and 'cuda' in p]
      default = [b for b, p in zip(branches, platforms) if p is None]
      if cuda or default:
        return (cuda or default)[:1]
    triton = [b for b in branches if _is_triton_branch(b)]
    if triton:
      return triton[:1]
    return branches
  subs = []
  for value in eqn.params.values():
    for v in (value if isinstance(value, (tuple, list)) else (value,)):
      if hasattr(v, 'jaxpr') and hasattr(v.jaxpr, 'eqns'):
        subs.append(v.jaxpr)
      elif hasattr(v, 'eqns'):
        subs.append(v)
  return subs


def _eqns(jaxpr, cuda_only: bool = True):
  """Every equation of `jaxpr` and of the jaxprs inside it, kernels' bodies
  left out."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in _sub_jaxprs(eqn, cuda_only):
      yield from _eqns(sub, cuda_only)


def _loop_dots(jaxpr) -> int:
  """The most dot_generals in one loop body of a kernel (or its whole body
  where it has no loop)."""
  best, here = 0, 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      here += 1
    for value in eqn.params.values():
      for v in (value if isinstance(value, (tuple, list)) else (value,)):
        inner = getattr(v, 'jaxpr', v)
        if hasattr(inner, 'eqns'):
          best = max(best, _loop_dots(inner))
  return max(best, here)


def _inner(eqn):
  """The jaxprs in `eqn`'s parameters (loop bodies, cond branches)."""
  for value in eqn.params.values():
    for v in (value if isinstance(value, (tuple, list)) else (value,)):
      inner = getattr(v, 'jaxpr', v)
      if hasattr(inner, 'eqns'):
        yield inner


def _primitives(jaxpr) -> set[str]:
  """The primitives of a kernel body, its loops and branches included."""
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for inner in _inner(eqn):
      names |= _primitives(inner)
  return names


def _switches_in_loops(jaxpr, in_loop: bool = False) -> int:
  """conds inside a kernel's loops: a tile loop that picks, per tile, the
  unmasked body (interior tiles) or the masked one."""
  count = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'cond' and in_loop:
      count += 1
    loop = in_loop or eqn.primitive.name in ('scan', 'while')
    for inner in _inner(eqn):
      count += _switches_in_loops(inner, loop)
  return count


def kernels_of(jaxpr) -> list[dict[str, Any]]:
  """Each pallas_call of the program: name, grid, matmuls per tile, the
  exponentials of its body, whether its tile loops split interior tiles
  from boundary ones."""
  out = []
  for eqn in _eqns(jaxpr):
    if eqn.primitive.name != 'pallas_call':
      continue
    grid = tuple(eqn.params['grid_mapping'].grid)
    info = eqn.params.get('name_and_src_info')
    name = getattr(info, 'name', None) or eqn.params.get('name', '?')
    body = eqn.params['jaxpr']
    prims = _primitives(body)
    out.append({'name': name, 'grid': grid,
                'programs': int(np.prod(grid)),
                'dots': _loop_dots(body),
                'exp': sorted(prims & {'exp', 'exp2'}),
                # The fused kernel's one window tile is at its top level.
                'interior_split': _switches_in_loops(
                    body, in_loop=name == FUSED_KERNEL) > 0})
  return out


def glue_of(jaxpr, min_elements: int = 0) -> dict[str, int]:
  """XLA_GLUE ops of the program outside the kernels. Transposes, pads and
  gathers count where their operand is activation-sized (at least
  `min_elements`: a head's width per token of the batch); those of smaller
  arrays (the projections' weight gradients laid out as their weights,
  masks, per-token statistics) are counted apart, as 'small'. A pad that
  only removes elements (the gradient of a pad) is a slice, counted apart
  as 'crop'. Scans count at any size (their cost is their serial
  steps)."""
  counts = {p: 0 for p in XLA_GLUE}
  counts['small'] = counts['crop'] = 0
  for eqn in _eqns(jaxpr):
    name = eqn.primitive.name
    if name not in XLA_GLUE:
      continue
    if (name in ('transpose', 'pad', 'gather')
        and int(np.prod(eqn.invars[0].aval.shape)) < min_elements):
      counts['small'] += 1
    elif name == 'pad' and _crops(eqn):
      counts['crop'] += 1
    else:
      counts[name] += 1
  return counts


def _crops(eqn) -> bool:
  """A pad that only removes elements (negative low and high padding, no
  interior): a slice, as JAX writes the gradient of a pad."""
  return all(lo <= 0 and hi <= 0 and not interior
             for lo, hi, interior in eqn.params['padding_config'])


# ------------------------------------------------------------ flash tiles


def _length(x, layout: str) -> int:
  """The sequence length of a flash operand in `layout`."""
  return x.shape[2] if layout == 'bhnd' else x.shape[1]


@contextlib.contextmanager
def recording_flash_calls(calls: list):
  """Records, for every `flash.flash_attention` call traced inside, its
  static settings (`flash._Static`, the tile among them), batch x heads,
  and its queries, sequence keys and extra keys before the kernels pad
  them to the tile (as given, where a kernel module calls `flash._flash`
  or `flash._forward` itself: Combiner's joint passes)."""
  public, kernel = flash.flash_attention, flash._flash  # pylint: disable=protected-access
  forward = flash._forward  # pylint: disable=protected-access
  sizes: list = []
  inside = [0]

  def spy_public(q, k=None, v=None, key_valid=None, **kw):
    extra = kw.get('extra')
    n = lambda a: _length(a, kw.get('layout', 'bhnd'))
    sizes.append((n(q), 0 if k is None or kw.get('window', 1) is None
                  else n(k), 0 if extra is None else n(extra[0])))
    return public(q, k, v, key_valid, **kw)

  def spy_kernel(static, seed, q, window_args, extra_args):
    # A kernel module that pads for itself (combiner's axial passes) calls
    # `_flash` directly: its padded sizes.
    n = lambda a: _length(a, getattr(static, 'layout', 'bhnd'))
    real = sizes.pop(0) if sizes else (
        n(q), 0 if window_args is None else n(window_args[0]),
        0 if extra_args is None else n(extra_args[0]))
    calls.append((static, q.shape[0] * static.heads, *real))
    inside[0] += 1
    try:
      return kernel(static, seed, q, window_args, extra_args)
    finally:
      inside[0] -= 1

  def spy_forward(static, seed, q, window_args, extra_args):
    # The forward kernels of a pass outside `_flash` (Combiner's joint
    # softmax over several passes): its padded sizes.
    if not inside[0]:
      n = lambda a: _length(a, getattr(static, 'layout', 'bhnd'))
      calls.append((static, q.shape[0] * static.heads, n(q),
                    0 if window_args is None else n(window_args[0]),
                    0 if extra_args is None else n(extra_args[0])))
    return forward(static, seed, q, window_args, extra_args)
  flash.flash_attention, flash._flash = spy_public, spy_kernel  # pylint: disable=protected-access
  flash._forward = spy_forward  # pylint: disable=protected-access
  try:
    yield
  finally:
    flash.flash_attention, flash._flash = public, kernel  # pylint: disable=protected-access
    flash._forward = forward  # pylint: disable=protected-access


def visible_of(rule):
  """`(i, j) -> bool array`: which keys j queries i see under `rule` (a
  flash Window or Extra), every key valid."""
  def visible(i, j):
    m = rule.mask(jnp.asarray(i), jnp.asarray(j))
    return (np.ones(np.broadcast_shapes(i.shape, j.shape), bool)
            if m is None else np.asarray(m))
  return visible


def _tile_work(rule, t: int, nq: int, n: int, visible
               ) -> tuple[int, int, int, int]:
  """(tiles visited, tiles needed, scores computed, scores used) of one
  key set under `rule` for one (batch, head): `nq` queries and `n` keys,
  each padded to a multiple of the tile `t` as the kernels pad them."""
  nq_pad, n_pad = -(-nq // t) * t, -(-n // t) * t
  visited = needed = used = 0
  j = np.arange(n_pad)[None, :]
  for q0 in range(0, nq_pad, t):
    lo, hi = (int(x) for x in rule.key_range(
        jnp.int32(q0), jnp.int32(q0 + t - 1), n_pad))
    visited += max(-(-hi // t) - lo // t, 0)
    i = np.arange(q0, q0 + t)[:, None]
    ok = visible(i, j) & (i < nq) & (j < n)
    used += int(ok.sum())
    needed += int(ok.reshape(t, -1, t).any(axis=(0, 2)).sum())
  return visited, needed, visited * t * t, used


def flash_work(calls) -> Optional[dict[str, Any]]:
  """Tiles over the recorded `flash._flash` calls, and the useful share of
  each part of each call (window keys, extra keys) and of each call (its
  window and extra keys together: one pass of the kernels)."""
  if not calls:
    return None
  visited = needed = 0
  shares, call_shares = [], []
  for static, rows, nq, nk, nm in calls:
    t = static.block
    parts = [(part, rule, n) for part, rule, n in (
        ('window', static.window, nk), ('extra', static.extra, nm))
             if rule is not None]
    computed = used = 0
    for part, rule, n in parts:
      v, nd, c, u = _tile_work(rule, t, nq, n, visible_of(rule))
      visited += rows * v
      needed += rows * nd
      computed, used = computed + c, used + u
      shares.append((part, u / c if c else None))
    call_shares.append(used / computed if computed else None)
  return {'tiles_visited': visited, 'tiles_needed': needed,
          'useful_shares': shares, 'call_shares': call_shares}


# ---------------------------------------------------------------- a case


def _program(c: Case):
  """The case's layer: (its forward, a loss of its output, abstract
  params, input and mask)."""
  from flax.core import FrozenDict  # pylint: disable=g-import-not-at-top
  mechanism, _ = kernel_matrix.VARIANTS_BY_LABEL[c.variant]
  features = c.heads * c.head_dim
  layer = standalone.StandaloneAttention(
      mechanism=mechanism,
      kw=FrozenDict(dict(c.knobs, implementation='pallas')),
      num_heads=c.heads, qkv_features=features, dtype=jnp.bfloat16,
      max_len=c.length)
  x = jax.ShapeDtypeStruct((c.batch, c.length, features), jnp.bfloat16)
  mask = jax.ShapeDtypeStruct((c.batch, c.length), jnp.bool_)
  params = jax.eval_shape(lambda: layer.init(
      jax.random.PRNGKey(0), jnp.zeros((1, c.length, features),
                                       jnp.bfloat16),
      padding_mask=jnp.ones((1, c.length), bool)))

  def forward(p, x, mask):
    return layer.apply(p, x, padding_mask=mask, deterministic=True)

  def loss(p, x, mask):
    return jnp.sum(forward(p, x, mask).astype(jnp.float32) ** 2)
  return forward, loss, params, x, mask


# Ops of optimised HLO that move data without computing: what their names
# say (XLA names a fusion after the ops it holds, e.g.
# 'input_transpose_fusion', 'wrapped_transpose', 'loop_pad_fusion').
_HLO_LINE = re.compile(
    r'\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\(')
_HLO_ARRAY = re.compile(r'\b[a-z]+\d*\[([\d,]*)\]')


def hlo_glue(text: str, min_elements: int) -> dict[str, int]:
  """Transposes and pads at the top level (ENTRY) of optimised HLO text:
  transpose and copy ops and fusions named for a transpose count as
  'transpose', pad ops and fusions named for a pad as 'pad', where their
  largest output has at least `min_elements` elements; smaller ones count
  as 'small'."""
  counts = {'transpose': 0, 'pad': 0, 'small': 0}
  entry = text[text.index('\nENTRY'):] if '\nENTRY' in text else text
  for line in entry.split('\n')[1:]:
    if line.startswith('}'):
      break
    m = _HLO_LINE.match(line)
    if not m:
      continue
    name, types, op = m.groups()
    kind = None
    if op in ('transpose', 'copy') or (op == 'fusion'
                                       and 'transpose' in name):
      kind = 'transpose'
    elif op == 'pad' or (op == 'fusion' and '_pad' in name):
      kind = 'pad'
    if kind is None:
      continue
    sizes = [int(np.prod([int(d) for d in dims.split(',') if d]))
             for dims in _HLO_ARRAY.findall(types)]
    counts[kind if max(sizes, default=0) >= min_elements else 'small'] += 1
  return counts


def compiled_glue(c: Case, target: str) -> dict[str, Any]:
  """`hlo_glue` of the program that `target`'s compiler makes of the
  case's layer, forward and gradients (one compile-only device, the
  compile extras), with the compile's seconds."""
  import time  # pylint: disable=g-import-not-at-top
  from jax.sharding import SingleDeviceSharding  # pylint: disable=g-import-not-at-top
  from lra_msmra_tools import targets  # pylint: disable=g-import-not-at-top
  spec = targets.parse(target)
  device = SingleDeviceSharding(spec.devices()[0])
  _, loss, params, x, mask = _program(c)
  placed = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device)
  start = time.time()
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(
      jax.tree.map(placed, params), placed(x), placed(mask)).lower().compile(
          spec.compiler_options(spill_check=False))
  counts = hlo_glue(compiled.as_text(), c.batch * c.length * c.head_dim)
  return dict(counts, target=spec.label, seconds=round(time.time() - start))


def measure(c: Case, compiled_on: Optional[str] = None) -> dict[str, Any]:
  forward, loss, params, x, mask = _program(c)
  calls: list = []
  with recording_flash_calls(calls):
    fwd = jax.make_jaxpr(forward)(params, x, mask).jaxpr
  both = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, x,
                                                        mask).jaxpr
  fwd_kernels, all_kernels = kernels_of(fwd), kernels_of(both)
  bwd_kernels = all_kernels[len(fwd_kernels):]
  # The passes whose dQ and dK / dV are separate kernels.
  split = [k for k in bwd_kernels if k['name'] != FUSED_KERNEL]
  glue = glue_of(both, c.batch * c.length * c.head_dim)
  record = dataclasses.asdict(c)
  record.pop('knobs')
  record.update(
      kernels_forward=len(fwd_kernels), kernels_backward=len(bwd_kernels),
      glue=glue, glue_total=sum(n for op, n in glue.items()
                                if op in XLA_GLUE),
      min_programs=min(k['programs'] for k in all_kernels),
      smallest_grid=min(all_kernels, key=lambda k: k['programs'])['name'],
      dots_forward=max(k['dots'] for k in fwd_kernels),
      dots_backward=sum(max((k['dots'] for k in split
                             if k['name'] == name), default=0)
                        for name in dict.fromkeys(k['name'] for k in split)),
      dots_backward_fused=max((k['dots'] for k in bwd_kernels
                               if k['name'] == FUSED_KERNEL), default=None),
      flash=flash_work(calls),
      exp2_kernels=sum(k['exp'] == ['exp2'] for k in all_kernels
                       if k['exp']),
      exp_kernels=sum(bool(k['exp']) for k in all_kernels),
      flash_kernels=sum(k['name'].startswith('flash') for k in all_kernels),
      split_kernels=sum(k['interior_split'] for k in all_kernels
                        if k['name'].startswith('flash')))
  if compiled_on:
    record['compiled'] = compiled_glue(c, compiled_on)
  return record


# ---------------------------------------------------------------- output


def _of(record: dict[str, Any], part: str, whole: str) -> str:
  """'part of whole' from a record ('-' for records from before the
  field, or without such kernels)."""
  if whole not in record or not record[whole]:
    return '-'
  return f'{record[part]} of {record[whole]}'


def _backward_dots(record: dict[str, Any]) -> str:
  """Matmuls per backward tile: of the fused kernel of tile-local passes,
  and of the split passes' dQ and dK / dV kernels together."""
  fused, split = record.get('dots_backward_fused'), record['dots_backward']
  if fused is None:
    return str(split)
  return f'{fused} fused' + (f', {split} split' if split else '')


def table(records: Sequence[dict[str, Any]]) -> str:
  header = ('| case | N | kernels fwd / bwd | XLA transposes, pads, gathers,'
            ' scans | fewest programs (kernel) | matmuls per tile fwd / bwd '
            '| key tiles visited / needed | useful share | kernels on exp2 '
            '| flash kernels with unmasked interior tiles |')
  on = next((r['compiled']['target'] for r in records if 'compiled' in r),
            None)
  columns = 10
  if on:
    header += f' transposes, pads compiled for {on} |'
    columns += 1
  rows = [header, '|' + '---|' * columns]
  for r in records:
    g = r['glue']
    glue = (f'{r["glue_total"]} ({g["transpose"]}, {g["pad"]}, '
            f'{g["gather"]}, {g["cumsum"] + g["cummax"]})')
    if g.get('crop'):
      glue += f'; crops {g["crop"]}'

    programs = r['min_programs']
    mark = '' if programs >= 2 * H100_SMS else ' ✗'
    f = r['flash']
    tiles = (f'{f["tiles_visited"]:,} / {f["tiles_needed"]:,}' if f else '-')
    share = (', '.join(f'{part} {100 * x:.1f}%'
                       for part, x in f['useful_shares'] if x is not None)
             if f else '-')
    if f and len(f.get('call_shares', ())) < len(f['useful_shares']):
      share += ' (per pass: ' + ', '.join(
          f'{100 * x:.1f}%' for x in f['call_shares'] if x is not None) + ')'

    rows.append(
        f'| {r["variant"]} ({r["task"]}) | {r["length"]:,} | '
        f'{r["kernels_forward"]} / {r["kernels_backward"]} | {glue} | '
        f'{programs:,}{mark} ({r["smallest_grid"]}) | '
        f'{r["dots_forward"]} / {_backward_dots(r)} | {tiles} | {share} | '
        f'{_of(r, "exp2_kernels", "exp_kernels")} | '
        f'{_of(r, "split_kernels", "flash_kernels")} |'
        + (f' {r["compiled"]["transpose"]}, {r["compiled"]["pad"]} |'
           if on and 'compiled' in r else ' - |' if on else ''))
  return '\n'.join(rows)


def main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--cases', default=','.join(TASKS),
                      help='shapes: listops (its config), 16k: '
                      f'{",".join(TASKS)}')
  parser.add_argument('--variants', default=','.join(CONFIG_FILES))
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument('--compiled', default=None, metavar='TARGET',
                      help='also compile each layer for TARGET (e.g. h200; '
                      'needs the compile extras) and count the transposes '
                      'and pads of activations in the optimised program')
  parser.add_argument('--json', help='write the records here')
  parser.add_argument('--doc', help='put the table into this markdown file, '
                      f'between {DOC_START} and {DOC_END}')
  args = parser.parse_args(argv)
  tasks = [t for t in args.cases.split(',') if t]
  variants = [v for v in args.variants.split(',') if v]
  for t in tasks:
    if t not in TASKS:
      parser.error(f'--cases: unknown task {t!r}; valid: {",".join(TASKS)}')
  for v in variants:
    if v not in CONFIG_FILES:
      parser.error(f'--variants: unknown variant {v!r}; valid: '
                   f'{",".join(CONFIG_FILES)}')
  if args.compiled:
    from lra_msmra_tools import targets  # pylint: disable=g-import-not-at-top
    try:  # JAX is imported already: JAX_PLATFORMS=cpu must be set.
      targets.prepare_environment()
      targets.parse(args.compiled).check_packages()
    except (RuntimeError, ValueError, targets.MissingPackage) as e:
      parser.error(f'--compiled: {e}')
  records = []
  for task in tasks:
    for variant in variants:
      records.append(measure(case(variant, task, args.batch),
                             compiled_on=args.compiled))
      print(f'{variant} ({task}) measured', file=sys.stderr, flush=True)
  text = table(records)
  print(text)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(records, f, indent=1)
  if args.doc:
    reporting.replace_between(args.doc, DOC_START, DOC_END, text)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
