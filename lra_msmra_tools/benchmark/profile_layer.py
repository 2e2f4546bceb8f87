r"""Where one attention layer's time goes, by XLA operation (CPU backend).

  python -m lra_msmra_tools.benchmark.profile_layer --mechanism long_short \
      --length 1024 [--mode fwd|fwd_bwd] [--calls 5] [--top 25] [--out DIR]

Builds the same layer, weights and inputs as a point of
`lra_msmra_tools.benchmark.attention` (batch 4, width 256, 4 heads, float32,
all tokens real, unless set otherwise), compiles its forward or
forward+backward function, times `--calls` calls (median), then traces
`--calls` more (`jax.profiler`) and prints:

* the time per call of each kind of operation: matrix products (fusions
  holding a `dot`), layout copies (fusions that only move data: transpose,
  copy, concatenate, pad, broadcast, slice), and the rest (element-wise
  work and reductions);
* the `--top` operations by time, with their output shape and the model
  code they come from.

Operation times are summed over threads, so with several threads they can
exceed the wall time of a call, and operations that run at the same time
slow each other down. For a clean split, profile on one thread:

  XLA_FLAGS='--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1' \
      taskset -c 0 python -m lra_msmra_tools.benchmark.profile_layer ...
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Any, Mapping, Optional, Sequence

import jax

from lra_msmra import attention as attention_lib
from lra_msmra_tools import reporting
from lra_msmra_tools.benchmark import attention as attention_bench
from lra_msmra_tools.benchmark import environment
from lra_msmra_tools.benchmark import outputs
from lra_msmra_tools.benchmark import profile_step
from lra_msmra_tools.benchmark import specs as specs_lib

KINDS = ('matrix products', 'layout copies', 'element-wise and reductions')
# Operations that only move or replicate data.
_LAYOUT_OPS = frozenset((
    'parameter', 'constant', 'bitcast', 'reshape', 'transpose', 'copy',
    'concatenate', 'pad', 'broadcast', 'slice', 'dynamic-slice', 'tuple',
    'get-tuple-element', 'iota'))
# `name = shape opcode(`; a tuple shape (multi-output fusions, loops) is in
# parentheses and holds spaces.
_INSTRUCTION = re.compile(
    r'\s*(?:ROOT )?%?([\w.\-]+) = (\((?:[^()]|\([^()]*\))*\)|\S+) '
    r'([\w\-]+)\(')
# Control flow: the operations of its bodies are traced on their own, and
# its event spans theirs, so counting it too would count them twice.
_CONTROL_FLOW = frozenset(('while', 'conditional', 'call'))


def _computations(hlo_text: str) -> dict[str, str]:
  """Computation name -> its body, from an HLO module's text."""
  out = {}
  for block in re.split(r'\n(?=\S)', hlo_text):
    m = re.match(r'(?:ENTRY )?%?([\w.\-]+) ', block)
    if m:
      out[m.group(1)] = block
  return out


def _kind(opcode: str, line: str, computations: Mapping[str, str]) -> str:
  """The kind (`KINDS`) of one instruction of the entry computation."""
  ops = {opcode}
  called = re.search(r'calls=%?([\w.\-]+)', line)
  if called and called.group(1) in computations:
    ops = {m.group(3) for m in map(_INSTRUCTION.match,
                                   computations[called.group(1)].split('\n'))
           if m}
  if 'dot' in ops or 'convolution' in ops:
    return KINDS[0]
  if ops <= _LAYOUT_OPS:
    return KINDS[1]
  return KINDS[2]


def instructions(hlo_text: str) -> dict[str, dict[str, str]]:
  """Instruction name -> its output shape, kind (`KINDS`) and source path
  (the JAX op name in its metadata, '' if none)."""
  computations = _computations(hlo_text)
  out = {}
  for line in hlo_text.split('\n'):
    m = _INSTRUCTION.match(line)
    if not m or m.group(3) in _CONTROL_FLOW:
      continue
    source = re.search(r'op_name="([^"]*)"', line)
    out[m.group(1)] = {'shape': m.group(2),
                       'kind': _kind(m.group(3), line, computations),
                       'source': source.group(1) if source else ''}
  return out


def profile(payload: Mapping[str, Any], *, calls: int,
            trace_dir: Optional[str] = None) -> dict[str, Any]:
  """Times and traces one point (`attention_bench.jax_point`'s payload).

  The trace goes to `trace_dir`, or to a temporary folder removed before
  returning (a trace takes tens of MB).
  """
  if trace_dir is None:
    with tempfile.TemporaryDirectory(prefix='profile_layer_') as tmp:
      return profile(payload, calls=calls, trace_dir=tmp)
  fn, args = attention_bench.jax_point(payload)
  compiled = jax.jit(fn).lower(*args).compile()
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  result = {'seconds': statistics.median(times), 'seconds_all': times,
            'backend': jax.default_backend(), 'ops': None, 'kinds': None}
  if jax.default_backend() != 'cpu':
    return result
  jax.profiler.start_trace(trace_dir)
  for _ in range(calls):
    jax.block_until_ready(compiled(*args))
  jax.profiler.stop_trace()
  seconds = profile_step.trace_op_seconds(trace_dir, calls)
  if not seconds:
    return result
  known = instructions(compiled.as_text())
  ops = []
  kinds: collections.Counter[str] = collections.Counter()
  for name, s in seconds.most_common():
    info = known.get(name)
    if info is None:  # Runtime bookkeeping, not an operation of the program.
      continue
    ops.append({'name': name, 'seconds': s, **info})
    kinds[info['kind']] += s
  result['ops'], result['kinds'] = ops, dict(kinds)
  return result


def _short_source(source: str) -> str:
  """The last two parts of an op's source path (e.g. `key/dot_general`)."""
  return '/'.join(source.split('/')[-2:]) or '—'


def markdown(title: str, result: Mapping[str, Any], top: int) -> str:
  lines = [f'{title}: {1e3 * result["seconds"]:.1f} ms per call (median of '
           f'{len(result["seconds_all"])}).']
  if not result['ops']:
    return '\n'.join(lines + ['', 'No operation profile (needs the CPU '
                              'backend).'])
  total = sum(result['kinds'].values())
  rows = [[kind, f'{1e3 * result["kinds"].get(kind, 0.0):.1f}',
           f'{100 * result["kinds"].get(kind, 0.0) / total:.0f}%']
          for kind in KINDS]
  rows.append(['all operations', f'{1e3 * total:.1f}', '100%'])
  lines += ['', reporting.markdown_table(['kind', 'ms per call', 'share'],
                                         rows), '']
  rows = [[f'{1e3 * op["seconds"]:.2f}', f'`{op["name"]}`', op['kind'],
           f'`{op["shape"]}`', f'`{_short_source(op["source"])}`']
          for op in result['ops'][:top]]
  lines += [reporting.markdown_table(
      ['ms per call', 'operation', 'kind', 'output', 'source'], rows)]
  return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(
      prog='python -m lra_msmra_tools.benchmark.profile_layer',
      description=__doc__.split('\n\n')[0])
  p.add_argument('--mechanism', required=True,
                 help='name, optionally name:key=value,key=value')
  p.add_argument('--length', type=int, required=True)
  p.add_argument('--mode', choices=('fwd', 'fwd_bwd'), default='fwd')
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--features', type=int, default=256)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--dtype', choices=('float32', 'bfloat16'),
                 default='float32')
  p.add_argument('--calls', type=int, default=5,
                 help='timed calls, then as many traced ones')
  p.add_argument('--top', type=int, default=25,
                 help='operations listed')
  p.add_argument('--out', default=None, help='folder for profile.json')
  args = p.parse_args(argv)
  try:
    specs = specs_lib.parse_specs(args.mechanism)
  except ValueError as e:
    p.error(f'--mechanism: {e}')
  if len(specs) != 1:
    p.error('--mechanism takes one mechanism.')
  if args.calls < 1 or args.length < 1:
    p.error('--calls and --length must be >= 1.')
  spec = specs[0]
  if spec.name not in attention_lib.REGISTRY:
    p.error(f'--mechanism: unknown mechanism {spec.name!r}; choose one of '
            f'{sorted(attention_lib.REGISTRY)}.')
  payload = {'name': spec.name, 'kw': dict(spec.kw), 'batch': args.batch,
             'length': args.length, 'features': args.features,
             'heads': args.heads, 'dtype': args.dtype, 'mode': args.mode}
  load = os.getloadavg()
  result = profile(payload, calls=args.calls)
  title = (f'`{spec.label}` {args.mode}, batch {args.batch} × {args.length} '
           f'tokens, width {args.features}, {args.heads} heads, '
           f'{args.dtype}')
  print(markdown(title, result, args.top))
  print('\nload average at start: ' + ', '.join(f'{x:.2f}' for x in load))
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    outputs.write_json(os.path.join(args.out, 'profile.json'),
                       {'command': environment.command_line(
                          sys.argv if argv is None else ['', *argv],
                          'lra_msmra_tools.benchmark.profile_layer'),
                       'payload': payload, 'load_average': load,
                       'environment': environment.environment(), **result})
  return 0


if __name__ == '__main__':
  sys.exit(main())
