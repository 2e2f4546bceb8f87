r"""Where a training step's time goes, by part of the model (CPU backend).

  python -m lra_msmra_tools.benchmark.profile_step \
      --config configs/listops/cst.py:xiong [--steps 5] [--out DIR]

Builds the config's model, optimizer and jitted training step exactly as the
trainer does, on one device, feeds it a batch of the config's shape (random
tokens, random real lengths between a quarter of the input length and all
of it), and reports:

* the steady-state time of one step (median over `--steps`, compilation
  excluded);
* a profile of two more steps (`jax.profiler`), whose XLA operations are
  summed by the model code they come from: dropout random bits, applying
  dropout, layer norms, GELU, the MLP, the attention layer (its projections
  included), embeddings, the classifier head, the optimizer update, other.

Summed operation times can exceed the step time when operations run on
several threads at once. The trace parser reads the XLA CPU runtime's
events (read with `jax.profiler.ProfileData`); on other backends only the
step time is reported.
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lra_msmra import config_lib
from lra_msmra import data as data_lib
from lra_msmra import steps as steps_lib

# (part, pattern of the operation's source path), first match wins.
PARTS = (
    ('dropout random bits', r'_bernoulli|_uniform|threefry|random_bits'),
    ('dropout', r'Dropout|attention_dropout'),
    ('layer norm', r'/ln_|encoder_norm|LayerNorm'),
    ('gelu', r'erf|gelu'),
    ('mlp', r'/mlp/'),
    ('attention', r'attention'),
    ('embeddings', r'/embed|pos_embedding'),
    ('head', r'/head/'),
    ('optimizer', r'adam|optax|apply_updates|global_norm|clip'),
)


def part_of(source: str) -> str:
  for name, pattern in PARTS:
    if re.search(pattern, source):
      return name
  return 'other'


def load_config(spec: str):
  path, _, arg = spec.partition(':')
  module = config_lib.load_sibling(os.path.abspath(path),
                                   os.path.basename(path)[:-3])
  return module.get_config(arg or None)


def example_batch(spec: Mapping[str, Any], batch_size: int, seed: int = 0
                  ) -> dict[str, jax.Array]:
  rng = np.random.default_rng(seed)
  length = spec['max_len']
  batch = {}
  for key in ('inputs', 'inputs2') if spec['dual'] else ('inputs',):
    ids = np.zeros((batch_size, length), np.int32)
    for row, n in enumerate(rng.integers(length // 4, length + 1,
                                         batch_size)):
      ids[row, :n] = rng.integers(1, spec['vocab_size'], n)
    batch[key] = jnp.asarray(ids)
  batch['targets'] = jnp.asarray(rng.integers(0, spec['num_classes'],
                                              batch_size), jnp.int32)
  return batch


def _op_sources(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> the JAX source path in its metadata."""
  out = {}
  for line in hlo_text.split('\n'):
    m = re.match(r'\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name="([^"]*)"', line)
    if m:
      out[m.group(1)] = m.group(2)
  return out


# Events of the runtime itself (scheduling, completion markers), not operations.
_RUNTIME_EVENTS = ('ThunkExecutor', 'ThreadpoolListener', 'end: ')


def trace_op_seconds(trace_dir: str, calls: int
                     ) -> Optional[collections.Counter[str]]:
  """Seconds per call of each XLA operation, by HLO instruction name.

  Reads the newest `jax.profiler` trace under `trace_dir` (the XLA CPU
  runtime's events over `calls` calls of one executable); None if there is
  no trace.
  """
  files = sorted(glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'),
                           recursive=True))
  if not files:
    return None
  space = jax.profiler.ProfileData.from_file(files[-1])
  ops: collections.Counter[str] = collections.Counter()
  for plane in space.planes:
    for line in plane.lines:
      # XLA CPU runs an executable's operations on its Eigen pool and on
      # the client's own threads; which one takes an operation varies from
      # run to run, so both count.
      if 'XLAEigen' not in line.name and 'XLAPjRtCpuClient' not in line.name:
        continue
      for event in line.events:
        if not event.name.startswith(_RUNTIME_EVENTS):
          ops[event.name] += event.duration_ns / 1e9 / calls
  return ops


def _trace_parts(trace_dir: str, sources: Mapping[str, str], steps: int
                 ) -> Optional[dict[str, float]]:
  """Seconds per part and step from the XLA CPU runtime's trace events."""
  ops = trace_op_seconds(trace_dir, steps)
  if not ops:
    return None
  parts: collections.Counter[str] = collections.Counter()
  for name, seconds in ops.items():
    parts[part_of(sources[name]) if name in sources else 'other'] += seconds
  return dict(parts)


def profile(config, *, steps: int, batch_size: Optional[int], seed: int = 0,
            trace_dir: Optional[str] = None) -> dict[str, Any]:
  """Times and traces `steps` training steps of `config`; the trace goes to
  `trace_dir`, or to a temporary folder removed before returning."""
  if trace_dir is None:
    with tempfile.TemporaryDirectory(prefix='profile_step_') as tmp:
      return profile(config, steps=steps, batch_size=batch_size, seed=seed,
                     trace_dir=tmp)
  spec = data_lib.get_model_spec(config)
  model, tx, schedule = steps_lib.build(config, spec)
  batch_size = batch_size or config.batch_size
  init = functools.partial(steps_lib.create_train_state, model=model, tx=tx,
                           batch=steps_lib.example_batch(spec))
  state = jax.jit(init)(jax.random.PRNGKey(seed))
  batch = example_batch(spec, batch_size, seed)
  step = jax.jit(functools.partial(
      steps_lib.train_step, model=model, tx=tx, schedule=schedule,
      grad_accum_steps=config.grad_accum_steps), donate_argnums=0)
  start = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  compile_seconds = time.perf_counter() - start
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  result = {'step_seconds': statistics.median(times),
            'step_seconds_all': times, 'first_step_seconds': compile_seconds,
            'batch': batch_size, 'length': spec['max_len'],
            'backend': jax.default_backend(), 'parts': None}
  if jax.default_backend() != 'cpu':
    return result
  sources = _op_sources(step.lower(state, batch).compile().as_text())
  jax.profiler.start_trace(trace_dir)
  for _ in range(2):
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
  jax.profiler.stop_trace()
  result['parts'] = _trace_parts(trace_dir, sources, 2)
  return result


def markdown(name: str, result: Mapping[str, Any]) -> str:
  lines = [f'`{name}`: batch {result["batch"]} × {result["length"]} '
           f'tokens, {result["step_seconds"]:.3f} s per step (median), first '
           f'step with compilation {result["first_step_seconds"]:.1f} s.']
  parts = result.get('parts')
  if parts:
    total = sum(parts.values())
    lines += ['', '| part | seconds per step | share of operation time |',
              '|---|---|---|']
    for part, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
      lines.append(f'| {part} | {seconds:.3f} | {100 * seconds / total:.0f}% '
                   '|')
    lines.append(f'| all operations | {total:.3f} | 100% |')
  return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(prog='python -m lra_msmra_tools.benchmark.profile_step',
                              description=__doc__.split('\n\n')[0])
  p.add_argument('--config', required=True, action='append',
                 help='config file with options (repeatable)')
  p.add_argument('--steps', type=int, default=5)
  p.add_argument('--batch', type=int, default=None,
                 help='batch size (default: the config\'s)')
  p.add_argument('--out', default=None, help='folder for profile.json')
  args = p.parse_args(argv)
  report = {'load_average': os.getloadavg(), 'runs': {}}
  for spec in args.config:
    result = profile(load_config(spec), steps=args.steps,
                     batch_size=args.batch)
    report['runs'][spec] = result
    print(markdown(spec, result), '\n', flush=True)
  print('load average: ' + ', '.join(f'{x:.2f}'
                                     for x in report['load_average']))
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, 'profile.json'), 'w') as f:
      json.dump(report, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
