"""The unrolled CPU Threefry lowering draws exactly the default's bits and
leaves the TPU and GPU lowerings alone."""

import subprocess
import sys

import numpy as np

DRAW = r'''
import sys
import jax, numpy as np
if sys.argv[1] == 'unrolled':
  from lra_msmra import cpu_rng
  assert cpu_rng.use_unrolled_threefry()
key = jax.random.PRNGKey(7)
out = [jax.jit(lambda k: jax.random.bits(k, (3, 1001)))(key),
       jax.jit(lambda k: jax.random.bernoulli(k, 0.9, (2, 5, 77)))(
           jax.random.fold_in(key, 3)),
       jax.jit(lambda k: jax.random.uniform(k, (513,)))(
           jax.random.split(key)[1])]
np.savez(sys.argv[2], *[np.asarray(o) for o in out])
# What TPUs and GPUs would run: the same program either way.
lowered = jax.jit(lambda k: jax.random.bernoulli(k, 0.9, (2, 5, 77))).trace(
    key).lower(lowering_platforms=('tpu', 'cuda')).as_text()
with open(sys.argv[2] + '.tpu_cuda.mlir', 'w') as f:
  f.write(lowered)
'''


def _draw(form, path):
  subprocess.run([sys.executable, '-c', DRAW, form, str(path)], check=True)
  with np.load(path) as f:
    return [f[k] for k in sorted(f.files)]


def test_unrolled_threefry_gives_identical_bits(tmp_path):
  default = _draw('default', tmp_path / 'default.npz')
  unrolled = _draw('unrolled', tmp_path / 'unrolled.npz')
  for a, b in zip(default, unrolled):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)
  # The draws are not degenerate (a broken hash returning zeros would agree).
  assert len(np.unique(default[0])) > 2900
  # The TPU and GPU lowerings are left alone.
  texts = [(tmp_path / f'{form}.npz.tpu_cuda.mlir').read_text()
           for form in ('default', 'unrolled')]
  assert texts[0] == texts[1] and 'stablehlo' in texts[0]


def test_idempotent():
  from lra_msmra import cpu_rng
  assert cpu_rng.use_unrolled_threefry()
  assert cpu_rng.use_unrolled_threefry()
  assert cpu_rng.in_effect()
