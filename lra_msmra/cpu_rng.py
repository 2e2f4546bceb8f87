"""Faster dropout masks on the CPU backend, bit for bit the same masks.

JAX lowers its Threefry-2x32 hash (behind every `jax.random` call, so every
dropout mask) in two forms with identical integer results: five unrolled
groups of rounds, one elementwise kernel (GPU, TPU), or a five-iteration
`while` loop (CPU, to keep compile times short). On the CPU the loop makes
five passes over the whole counter array. For the dropout masks of the
Xiong et al. ListOps model ([32, 2048, 128] and friends) that loop was about a
fifth of a training step on a 2-core machine, and the unrolled form draws the
same mask about 5x faster.

`use_unrolled_threefry()` registers the unrolled form for the CPU platform,
for the rest of the process. Nothing registers it by default: the main
command does with `--cpu_unrolled_threefry` (results.json then records it,
`in_effect()`), the benchmarks and `lra_msmra.scaling` do for their CPU
timings. It changes no value (the hash is integer arithmetic in both forms;
`tests/test_cpu_rng.py` compares bits drawn with and without it) and leaves
other platforms alone. It reaches into JAX internals, so where they are
missing (another JAX version) it does nothing and returns False.
"""

from __future__ import annotations

_applied = False


def use_unrolled_threefry() -> bool:
  """Lowers Threefry-2x32 unrolled on CPU; returns whether it is in effect."""
  global _applied
  if _applied:
    return True
  try:
    # pylint: disable=g-import-not-at-top
    from jax._src.interpreters import mlir
    from jax._src.random import threefry2x32
    rule = threefry2x32._threefry2x32_lowering_rule  # pylint: disable=protected-access
    primitive = threefry2x32.threefry2x32_p
  except (ImportError, AttributeError):
    return False
  mlir.register_lowering(primitive, rule, platform='cpu')
  _applied = True
  return True


def in_effect() -> bool:
  """Whether `use_unrolled_threefry()` has registered the unrolled form."""
  return _applied
