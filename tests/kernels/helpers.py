"""What the kernel tests share: the contract's padding patterns and biases.

The fused implementations are compared with 'xla' under the padding
patterns of tests/attention/test_contract.py, with every bias non-zero
(zero-initialised biases would hide a term left at padded rows).
"""

import jax
import jax.numpy as jnp
import numpy as np


def padding_mask(length: int) -> jax.Array:
  """bool `[4, length]`, one contract pattern per row: the last third padded
  (`_inputs`); then `_padded_rows_mask`'s leading run, an inner run with a
  trailing position, and an example with no real token."""
  mask = np.ones((4, length), bool)
  mask[0, length - length // 3:] = False
  mask[1, :5] = False
  mask[2, 4:9] = False
  mask[2, length - 1] = False
  mask[3] = False
  return jnp.asarray(mask)


def random_biases(tree, seed: int = 3):
  """`tree` with every leaf named 'bias' drawn from N(0, 1)."""
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: jnp.asarray(rng.standard_normal(leaf.shape),
                                     leaf.dtype)
      if getattr(path[-1], 'key', None) == 'bias' else leaf, tree)
