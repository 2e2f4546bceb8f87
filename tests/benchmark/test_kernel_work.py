"""The kernel work report counts what the kernels compute."""

import numpy as np

from lra_msmra.kernels import flash
from lra_msmra_tools.benchmark import kernel_work


def _visible(rule):
  def visible(i, j):
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    m = rule.mask(jnp.asarray(i), jnp.asarray(j))
    return (np.ones(np.broadcast_shapes(i.shape, j.shape), bool)
            if m is None else np.asarray(m))
  return visible


def test_tile_work_of_segments_full_and_sliding_windows():
  # Segments of 8 in 64-key tiles: one tile per query tile, 8 of 64 keys
  # used by each query.
  seg = flash.Window('segment', size=8)
  visited, needed, computed, used = kernel_work._tile_work(
      seg, 64, 256, 256, _visible(seg))
  assert (visited, needed) == (4, 4)
  assert used == 256 * 8 and computed == 4 * 64 * 64
  # A full window over 100 keys padded to 128: every tile, 100 keys a row.
  full = flash.Window('full')
  visited, needed, computed, used = kernel_work._tile_work(
      full, 64, 64, 100, _visible(full))
  assert (visited, needed, used) == (2, 2, 64 * 100)
  # A causal full window: the tiles above the diagonal are skipped.
  causal = flash.Window('full', causal=True)
  visited, needed, _, used = kernel_work._tile_work(
      causal, 16, 64, 64, _visible(causal))
  assert visited == needed == 1 + 2 + 3 + 4
  assert used == 64 * 65 // 2
  # A sliding window of +-4 keys in 16-key tiles straddles 2 or 3 tiles.
  sliding = flash.Window('sliding', left=4, right=4)
  visited, needed, _, used = kernel_work._tile_work(
      sliding, 16, 64, 64, _visible(sliding))
  assert visited == needed == 2 + 3 + 3 + 2
  assert used == sum(min(i + 4, 63) - max(i - 4, 0) + 1 for i in range(64))


def test_a_cst_layer_reports_its_kernels_grid_and_shares():
  case = kernel_work.Case(variant='cst', task='listops', length=256,
                          heads=2, head_dim=32, batch=2,
                          knobs={'slice_length': 8})
  r = kernel_work.measure(case)
  # Local and global attention: one forward kernel each; dQ and dK/dV each
  # in the backward.
  assert (r['kernels_forward'], r['kernels_backward']) == (2, 4)
  assert r['dots_forward'] == 2 and r['dots_backward'] == 7
  # The local pass's queries use 8 of the 64 keys of their one key tile;
  # the global pass (32 slice means, a 32-key tile) uses them all.
  shares = dict(enumerate(s for _, s in r['flash']['useful_shares']))
  assert shares[0] == 8 / 64 and shares[1] == 1.0
  assert r['flash']['tiles_visited'] == r['flash']['tiles_needed']
  # Grids are (batch, heads, tiles): the global pass's single query tile.
  assert r['min_programs'] == 2 * 2 * 1
  assert r['glue_total'] == sum(r['glue'].values()) > 0


def test_the_table_marks_small_grids():
  record = {'variant': 'x', 'task': 'listops', 'length': 100,
            'kernels_forward': 1, 'kernels_backward': 2,
            'glue': dict.fromkeys(kernel_work.XLA_GLUE, 1), 'glue_total': 5,
            'min_programs': 100, 'smallest_grid': 'k', 'dots_forward': 2,
            'dots_backward': 5, 'flash': None}
  text = kernel_work.table([record, dict(record, min_programs=264)])
  rows = text.splitlines()[2:]
  assert '100 ✗ (k)' in rows[0] and '264 (k)' in rows[1]
  assert rows[0].endswith('| - | - |')
