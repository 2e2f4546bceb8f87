"""The kernel work report counts what the kernels compute."""

import jax
import jax.numpy as jnp
import pytest

from lra_msmra.kernels import flash
from lra_msmra_tools.benchmark import kernel_work
from tests import helpers


def test_tile_work_of_segments_full_and_sliding_windows():
  # Segments of 8 in 64-key tiles: one tile per query tile, 8 of 64 keys
  # used by each query.
  seg = flash.Window('segment', size=8)
  visited, needed, computed, used = kernel_work._tile_work(
      seg, 64, 256, 256, kernel_work.visible_of(seg))
  assert (visited, needed) == (4, 4)
  assert used == 256 * 8 and computed == 4 * 64 * 64
  # A full window over 100 keys padded to 128: every tile, 100 keys a row.
  full = flash.Window('full')
  visited, needed, computed, used = kernel_work._tile_work(
      full, 64, 64, 100, kernel_work.visible_of(full))
  assert (visited, needed, used) == (2, 2, 64 * 100)
  # A causal full window: the tiles above the diagonal are skipped.
  causal = flash.Window('full', causal=True)
  visited, needed, _, used = kernel_work._tile_work(
      causal, 16, 64, 64, kernel_work.visible_of(causal))
  assert visited == needed == 1 + 2 + 3 + 4
  assert used == 64 * 65 // 2
  # A sliding window of +-4 keys in 16-key tiles straddles 2 or 3 tiles.
  sliding = flash.Window('sliding', left=4, right=4)
  visited, needed, _, used = kernel_work._tile_work(
      sliding, 16, 64, 64, kernel_work.visible_of(sliding))
  assert visited == needed == 2 + 3 + 3 + 2
  assert used == sum(min(i + 4, 63) - max(i - 4, 0) + 1 for i in range(64))


def test_a_cst_layer_reports_its_kernels_grid_and_shares():
  case = kernel_work.Case(variant='cst', task='listops', length=256,
                          heads=2, head_dim=32, batch=2,
                          knobs={'slice_length': 8})
  r = kernel_work.measure(case)
  # Local and global attention: one forward kernel each. In the backward
  # the local pass, whose slices of 8 fill its 16-token tiles whole, is one
  # fused kernel of 5 products per tile; the global pass dQ and dK/dV, 3 + 4.
  assert (r['kernels_forward'], r['kernels_backward']) == (2, 3)
  assert r['dots_forward'] == 2 and r['dots_backward'] == 7
  assert r['dots_backward_fused'] == 5
  # The tiles fit the pattern and, the grid being small, take the most
  # programs: the local pass's 16-token tiles hold two slices of 8 (half
  # of their scores used), the global pass's 32 slice means two full tiles.
  shares = dict(enumerate(s for _, s in r['flash']['useful_shares']))
  assert shares[0] == 8 / 16 and shares[1] == 1.0
  assert r['flash']['tiles_visited'] == r['flash']['tiles_needed']
  # Grids are (batch, heads, tiles): the global pass's 2 query tiles.
  assert r['min_programs'] == 2 * 2 * 2
  # cst reads the model's layout: no transpose of activations around its
  # kernels; the projections' weight gradients are transposed as their
  # weights are (small arrays, counted apart).
  assert r['glue']['transpose'] == 0 and r['glue']['small'] > 0
  assert r['glue_total'] == sum(r['glue'][op] for op in kernel_work.XLA_GLUE)
  # exp2 everywhere; every flash kernel splits interior tiles off.
  assert r['exp2_kernels'] == r['exp_kernels'] == 5
  assert r['split_kernels'] == r['flash_kernels'] == 5
  assert kernel_work.FUSED_KERNEL in {
      k['name'] for k in kernel_work.kernels_of(jax.make_jaxpr(jax.grad(
          lambda q: flash.flash_attention(
              q, q, q, jnp.ones((1, 64), bool),
              window=flash.Window('segment', size=8)).sum())
      )(jnp.ones((1, 1, 64, 8))).jaxpr)}


@pytest.mark.parametrize('variant,knobs', [
    ('cst', {'slice_length': 8}),
    ('long_short', {'window_size': 8, 'num_landmarks': 8}),
    ('combiner_fixed', {'variant': 'fixed', 'block_size': 8}),
    ('adamra', {'compression_rates': (1, 1 / 4)}),
])
def test_a_layer_pads_its_length_once(variant, knobs):
  # 195 tokens: 25 slices or blocks of 8, a multiple of no tile. The
  # layer pads its input once, for every kernel call's tile, and no call
  # pads again; the gradient crops that pad and pads the cropped output's
  # cotangent.
  case = kernel_work.Case(variant=variant, task='listops', length=195,
                          heads=2, head_dim=32, batch=2, knobs=knobs)
  r = kernel_work.measure(case)
  assert r['glue']['pad'] == 2 and r['glue']['crop'] == 1


def test_the_table_marks_small_grids():
  record = {'variant': 'x', 'task': 'listops', 'length': 100,
            'kernels_forward': 1, 'kernels_backward': 2,
            'glue': dict.fromkeys(kernel_work.XLA_GLUE, 1), 'glue_total': 5,
            'min_programs': 100, 'smallest_grid': 'k', 'dots_forward': 2,
            'dots_backward': 5, 'flash': None}
  text = kernel_work.table([record, dict(record, min_programs=264,
                                          dots_backward_fused=5)])
  rows = text.splitlines()[2:]
  assert '100 ✗ (k)' in rows[0] and '264 (k)' in rows[1]
  assert '| 2 / 5 |' in rows[0] and '| 2 / 5 fused, 5 split |' in rows[1]
  assert rows[0].endswith('| - | - |')


HLO = """HloModule jit_loss

%fused_computation (p: f32[4,64]) -> f32[64,4] {
  %p = f32[4,64]{1,0} parameter(0)
  ROOT %t = f32[64,4]{1,0} transpose(f32[4,64]{1,0} %p), dimensions={1,0}
}

ENTRY %main (a: bf16[2,128,4,32], b: f32[4,64]) -> bf16[2,4,128,32] {
  %a = bf16[2,128,4,32]{3,2,1,0} parameter(0)
  %b = f32[4,64]{1,0} parameter(1)
  %input_transpose_fusion.1 = bf16[2,4,128,32]{3,2,1,0} fusion(%a), kind=kInput
  %wrapped_transpose = f32[64,4]{1,0} fusion(%b), kind=kLoop
  %loop_pad_fusion = (bf16[2,136,4,32]{3,2,1,0}, f32[8]{0}) fusion(%a), kind=kLoop
  %copy.3 = bf16[2,128,4,32]{2,3,1,0} copy(%a)
  %loop_add_fusion = bf16[2,128,4,32]{3,2,1,0} fusion(%a), kind=kLoop
  ROOT %pad.2 = bf16[2,4,128,40]{3,2,1,0} pad(%input_transpose_fusion.1), padding=0_0x0_0x0_0x0_8
}
"""


def test_hlo_glue_counts_the_entry_transposes_and_pads_by_size():
  # 2 x 128 x 32 = 8,192 elements: activation-sized. The transpose inside
  # a fused computation is not at the top level.
  counts = kernel_work.hlo_glue(HLO, 2 * 128 * 32)
  assert counts == {'transpose': 2, 'pad': 2, 'small': 1}


@pytest.mark.extras
@pytest.mark.skipif(helpers.COMPILE_EXTRAS_MISSING,
                    reason=helpers.COMPILE_EXTRAS_REASON)
def test_a_layer_compiled_for_an_h200_is_counted():
  case = kernel_work.Case(variant='cst', task='listops', length=195,
                          heads=2, head_dim=32, batch=2,
                          knobs={'slice_length': 8})
  counts = kernel_work.compiled_glue(case, 'h200')
  assert counts['target'] == 'h200'
  # cst reads the model's layout and pads once: no transposed activation
  # in the compiled program, the layer's one pad.
  assert counts['transpose'] == 0 and counts['pad'] == 1
