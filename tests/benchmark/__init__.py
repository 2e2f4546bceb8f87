"""Benchmark tests; `run_benchmark` runs one benchmark command end to end;
`run_attention_tiny` and `random_layer` serve the official-code comparisons."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def run_benchmark(module: str, mechanisms, lengths, out, *args: str) -> None:
  """Runs `python -m module` on `mechanisms` x `lengths` into `out`.

  Fails the test with the command's stderr if it exits non-zero.
  """
  cmd = [sys.executable, '-m', module, '--mechanisms', ','.join(mechanisms),
         '--lengths', ','.join(map(str, lengths)), *args,
         '--memory_budget_gb', '8', '--out', str(out)]
  # The command and its worker processes inherit the tests' fast-compile
  # settings (tests/conftest.py).
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]


def random_layer(mechanism: str, kw, length: int, *, heads: int,
                 features: int, seed: int = 0, **layer_kw):
  """A `StandaloneAttention` of `mechanism`, every parameter drawn at random
  (initial values plus noise, so that no scale is 1 and no bias 0), and an
  input `[3, length, features]`: (layer, variables, numpy input)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from lra_msmra.attention import standalone  # pylint: disable=g-import-not-at-top

  layer = standalone.StandaloneAttention(
      mechanism=mechanism, kw=kw, num_heads=heads, qkv_features=features,
      max_len=length, **layer_kw)
  x = jax.random.normal(jax.random.PRNGKey(seed), (3, length, features))
  params = layer.init(jax.random.PRNGKey(seed + 1), x)['params']
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 2), len(leaves))
  params = jax.tree_util.tree_unflatten(tree, [
      a + 0.3 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)])
  return layer, {'params': params}, np.array(x)


def run_attention_tiny(out, *args: str, heads: int, features: int
                       ) -> subprocess.CompletedProcess:
  """Runs the attention benchmark on tiny shapes (batch 2, 2 repeats, the
  tests' fast compiles); returns the finished process, whatever its status."""
  cmd = [sys.executable, '-m', 'lra_msmra_tools.benchmark.attention', '--batch',
         '2', '--features', str(features), '--heads', str(heads),
         '--repeats', '2', '--memory_budget_gb', '8', '--out', str(out),
         *args]
  env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS='1')
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                        timeout=900, env=env)


def assert_check_failed(done: subprocess.CompletedProcess, out,
                        message: str) -> None:
  """An official-code output check that failed did what it must: exit
  status 1 with `message` on stderr, the report still written, the check
  recorded as a mismatch and the official points not timed."""
  assert done.returncode == 1
  assert message in done.stderr
  report = json.loads((out / 'attention.json').read_text())
  check = next(iter(report['official_checks'].values()))
  assert check['status'] == 'mismatch'
  rec = next(r for r in report['records'] if r['backend'] == 'official')
  assert rec['status'] == 'skipped' and 'mismatch' in rec['reason']
