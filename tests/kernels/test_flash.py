"""The Pallas flash kernel over a key window and extra keys.

On the CPU the kernel runs in Pallas' interpreter; it must equal the plain
XLA formula (`flash.reference`) in its output and in the gradients of
queries, keys, values and extra keys and values, for every window kind and
extra rule, with padded keys, a query that sees no valid key and lengths
that are not multiples of the tile. Its forward and backward programs must
lower for `cuda` (Triton) and `tpu` (Mosaic) on this CPU-only machine.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.kernels import flash
from lra_msmra.kernels.combiner import GroupRule
from lra_msmra.kernels.combiner import Sides

pytestmark = pytest.mark.xdist_group('kernels-flash')

W, E = flash.Window, flash.Extra
# (id, window, extra rule or None)
CASES = [
    ('full', W('full'), None),
    ('full-causal', W('full', causal=True), None),
    ('segment', W('segment', size=8), None),
    ('segment-causal', W('segment', size=8, causal=True), None),
    ('segment-wide+extra-all', W('segment', size=8, left=4, right=4),
     E('all')),
    ('sliding+extra-earlier', W('sliding', left=7),
     E('earlier_group', key_group=2, query_group=16)),
    ('segment-causal+extra-other', W('segment', size=16, causal=True),
     E('other_group', key_group=1, query_group=16)),
    ('extra-only', None, E('all')),
    # Segments wider than the tile: interior tiles inside a segment.
    ('segment-32-causal', W('segment', size=32, left=16, causal=True),
     None),
]
BATCH, HEADS, LENGTH, EXTRA, DIM = 2, 2, 77, 37, 8
BLOCK = 16  # Several tiles of queries, keys and extra keys.


def _inputs(dtype=jnp.float32):
  ks = jax.random.split(jax.random.PRNGKey(0), 6)
  q = 0.5 * jax.random.normal(ks[0], (BATCH, HEADS, LENGTH, DIM), dtype)
  k, v = (jax.random.normal(s, (BATCH, HEADS, LENGTH, DIM), dtype)
          for s in ks[1:3])
  kx, vx = (jax.random.normal(s, (BATCH, HEADS, EXTRA, DIM), dtype)
            for s in ks[3:5])
  valid = np.ones((BATCH, LENGTH), bool)
  valid[0, 3:7] = False                     # an inner run,
  valid[1, LENGTH - LENGTH // 3:] = False   # trailing padding,
  valid[1, :2] = False                      # and row 1's first queries see
  x_valid = np.ones((BATCH, EXTRA), bool)   # no valid key in a causal window.
  x_valid[1, -2:] = False
  return q, k, v, jnp.asarray(valid), kx, vx, jnp.asarray(x_valid)


def _functions(window, rule):
  """(kernel, reference) as functions of (q, k, v, kx, vx)."""
  q, k, v, valid, kx, vx, x_valid = _inputs()
  del q, k, v, kx, vx

  def make(fn, **extra_kw):
    def f(q, k, v, kx, vx, **kw):
      return fn(q, k if window else None, v if window else None,
                valid if window else None, window=window,
                extra=(kx, vx, x_valid) if rule else None,
                extra_rule=rule or E(), **extra_kw, **kw)
    return f
  return make(flash.flash_attention, block=BLOCK), make(flash.reference)


@pytest.mark.parametrize('cid,window,rule', CASES, ids=[c[0] for c in CASES])
def test_kernel_equals_reference_with_gradients(cid, window, rule):
  del cid
  q, k, v, _, kx, vx, _ = _inputs()
  kernel, ref = _functions(window, rule)
  args = (q, k, v, kx, vx)
  out = jax.jit(kernel)(*args)
  expected = ref(*args)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  assert out.shape == (BATCH, HEADS, LENGTH, DIM)
  cot = jax.random.normal(jax.random.PRNGKey(1), out.shape)
  argnums = tuple(i for i, used in enumerate(
      (True, window is not None, window is not None, rule is not None,
       rule is not None)) if used)
  loss = lambda f: lambda *a: jnp.sum(f(*a) * cot)
  got = jax.jit(jax.grad(loss(kernel), argnums))(*args)
  want = jax.grad(loss(ref), argnums)(*args)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize('window,rule,t', [
    (W('segment', size=8), None, 16),
    (W('segment', size=8, causal=True), None, 16),
    (W('sliding', left=7), E('earlier_group', key_group=2, query_group=16),
     16),
    (W('full'), E('other_group', key_group=1, query_group=16), 32),
    (None, E('all'), 32),
])
def test_useful_share_counts_what_the_tiles_compute(window, rule, t):
  """`flash.useful_share` (which picks a call's tile) against a count of
  every query-key pair the rules allow, over the tiles the kernels visit
  (the work report's count)."""
  from lra_msmra_tools.benchmark import kernel_work  # pylint: disable=g-import-not-at-top
  nq, nk, nm = 77, 77, 37
  used = computed = 0
  for r, n in ((window, nk), (rule, nm)):
    if r is None:
      continue
    _, _, c, u = kernel_work._tile_work(r, t, nq, n,
                                        kernel_work.visible_of(r))
    used, computed = used + u, computed + c
  assert flash.useful_share(window, rule, t, nq, nk if window else 0,
                            nm if rule else 0) == pytest.approx(
                                used / computed)


def test_tiles_fit_the_pattern():
  fit = lambda w, e=None, n=2048, m=0, rows=64: flash.fitted_block(
      w, e, 64, n, n, m, rows)
  # CST's slices of 8: 16-token tiles use half of their scores, 64-token
  # tiles an eighth.
  assert fit(W('segment', size=8)) == 16
  assert flash.useful_share(W('segment', size=8), None, 64, 2048, 2048,
                            0) == 8 / 64
  # A full window keeps the largest tile; so does a short sequence's.
  assert fit(W('full')) == 64 and fit(W('full', causal=True)) == 64
  # Wider segments: the largest tile that uses half of its scores.
  assert fit(W('segment', size=16)) == 32
  assert fit(W('segment', size=32)) == 64
  # Nothing reaches half (a window of 3 keys): the best share, 16.
  assert fit(W('sliding', left=1, right=1)) == 16
  # A small grid takes smaller tiles to fill the GPU (MIN_PROGRAMS = 264):
  # 251 slice means of 32 (batch, head) rows are 128 programs at 64, 256 at
  # 32, 512 at 16; of 64 rows, 256 at 64 and 512 at 32.
  assert fit(W('full'), n=251, rows=32) == 16
  assert fit(W('full'), n=251, rows=64) == 32
  assert fit(W('full'), n=251, rows=128) == 64
  # None fills it: the most programs.
  assert fit(W('full'), n=251, rows=1) == 16
  # Called inside a trace: the choice is made from static shapes.
  jax.jit(lambda x: x * fit(W('segment', size=8)))(1.0)


# Every rule whose visible set is one interval per position, with an
# extra rule that is not ('other_group': no interior tiles).
FULL_RULES = [
    W('full'), W('full', causal=True), W('segment', size=8),
    W('segment', size=32, left=16, right=8),
    W('segment', size=32, left=16, causal=True), W('sliding', left=40),
    W('sliding', left=20, right=33), E('all'),
    E('earlier_group', key_group=4, query_group=16),
    E('other_group', key_group=4, query_group=16),
    GroupRule(48), GroupRule(48, relation='le'), GroupRule(40, relation='lt'),
    GroupRule(40, relation='gt'), GroupRule(40, relation='ne'),
    GroupRule(24, kinds=2), GroupRule(24, kinds=2, relation='lt'),
    Sides(80),  # Its 2 x 80 queries: the test's 160.
]


@pytest.mark.parametrize('rule', FULL_RULES, ids=str)
@pytest.mark.parametrize('t', [16, 32])
def test_interior_tiles_are_exactly_the_fully_visible_ones(rule, t):
  # An interior tile skips the mask, so it must hold only visible pairs;
  # and every fully visible tile inside the visited range is one (else
  # the split would be a no-op).
  n = 160
  i = np.arange(n)[:, None]
  j = np.arange(n)[None, :]
  with jax.ensure_compile_time_eval():
    mask = rule.mask(jnp.asarray(i), jnp.asarray(j))
    mask = np.ones((n, n), bool) if mask is None else np.asarray(mask)
    for a in range(n // t):
      rows = mask[a * t:(a + 1) * t]
      first, last = flash._full_tiles(rule, a * t, a * t + t - 1, n, t)
      for b in range(n // t):
        block = rows[:, b * t:(b + 1) * t]
        full = bool(first <= b < last)
        assert not full or block.all(), (a, b)
        if rule.intervals():
          assert full == block.all(), (a, b)
      # The key side: key tile a against query tiles.
      cols = mask[:, a * t:(a + 1) * t]
      first, last = flash._full_tiles(rule, a * t, a * t + t - 1, n, t,
                                      queries=True)
      for b in range(n // t):
        block = cols[b * t:(b + 1) * t]
        full = bool(first <= b < last)
        assert not full or block.all(), (a, b)
        if rule.intervals():
          assert full == block.all(), (a, b)


def test_valid_tiles_flag_only_tiles_of_valid_keys():
  valid = np.ones((2, 70), bool)
  valid[0, 20] = False
  valid[1, 50:] = False
  tiles = np.asarray(flash.valid_tiles(flash._flags(jnp.asarray(valid),
                                                    16)))
  assert tiles.shape == (2, 1, 5)
  # Row 0: tile 1 holds key 20; the last tile holds padding (64..79).
  np.testing.assert_array_equal(tiles[:, 0], [[1, 0, 1, 1, 0],
                                              [1, 1, 1, 0, 0]])


def test_query_chunks_fill_the_grid():
  assert flash.query_chunks(flash.MIN_PROGRAMS, 100) == (1, 100)
  assert flash.query_chunks(16, 1) == (1, 1)
  for programs, tiles in ((16, 256), (32, 32), (1, 7), (100, 3)):
    chunks, per = flash.query_chunks(programs, tiles)
    # Every query tile in exactly one chunk, none empty.
    assert (chunks - 1) * per < tiles <= chunks * per
    assert programs * chunks >= min(flash.MIN_PROGRAMS, programs * tiles)
  assert flash.query_chunks(16, 256) == (18, 15)


@pytest.mark.parametrize('cid,window,rule', [CASES[1], CASES[5], CASES[7]],
                         ids=[CASES[1][0], CASES[5][0], CASES[7][0]])
def test_dkv_over_query_chunks_equals_one_pass(monkeypatch, cid, window,
                                               rule):
  """The tests' grids are small, so their dK / dV passes run split over
  query chunks; with the split off (a grid deemed large enough) the
  gradients are the same."""
  del cid
  q, k, v, _, kx, vx, _ = _inputs()
  kernel, _ = _functions(window, rule)
  args = (q, k, v, kx, vx)
  assert flash.query_chunks(BATCH * HEADS, -(-LENGTH // BLOCK))[0] > 1
  cot = jax.random.normal(jax.random.PRNGKey(1), (BATCH, HEADS, LENGTH, DIM))
  argnums = (0, 1, 2, 3, 4) if window and rule else (
      (0, 1, 2) if window else (0, 3, 4))
  grad = lambda: jax.grad(lambda *a: jnp.sum(kernel(*a) * cot),
                          argnums)(*args)
  split = grad()
  monkeypatch.setattr(flash, 'MIN_PROGRAMS', 1)
  assert flash.query_chunks(BATCH * HEADS, 5) == (1, 5)
  whole = grad()
  for a, b in zip(split, whole):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('cid,window,rule', [CASES[3], CASES[5]],
                         ids=[CASES[3][0], CASES[5][0]])
def test_dropout_equals_reference_with_the_same_mask(cid, window, rule):
  del cid
  q, k, v, _, kx, vx, _ = _inputs()
  seed = jnp.int32(1234)
  kernel, ref = _functions(window, rule)
  drop = dict(dropout_rate=0.25, dropout_seed=seed)
  kernel_d = lambda *a: kernel(*a, **drop)
  ref_d = lambda *a: ref(*a, **drop)
  args = (q, k, v, kx, vx)
  out = jax.jit(kernel_d)(*args)
  np.testing.assert_allclose(out, ref_d(*args), rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(out - ref(*args)).max()) > 0.1  # Something dropped.
  other = jax.jit(lambda *a: kernel(*a, dropout_rate=0.25,
                                    dropout_seed=jnp.int32(99)))(*args)
  assert float(jnp.abs(out - other).max()) > 0.1  # Another seed, another mask.
  cot = jax.random.normal(jax.random.PRNGKey(1), out.shape)
  loss = lambda f: lambda *a: jnp.sum(f(*a) * cot)
  got = jax.jit(jax.grad(loss(kernel_d), (0, 1, 2, 3, 4)))(*args)
  want = jax.grad(loss(ref_d), (0, 1, 2, 3, 4))(*args)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


def test_keep_mask_of_a_query_column_and_key_row_is_the_tile_mask():
  """The kernels hash a query column and a key row (the query round once
  per row); the bits are those of the whole tile's indices."""
  i0, j0, t = 48, 16, 16
  full_i = jnp.arange(i0, i0 + t)[:, None] + jnp.zeros((1, t), jnp.int32)
  full_j = jnp.arange(j0, j0 + t)[None, :] + jnp.zeros((t, 1), jnp.int32)
  args = (jnp.int32(7), jnp.int32(1), jnp.int32(3))
  tile = flash.keep_mask(*args, full_i, full_j, flash.EXTRA_PART, 4, 0.3)
  narrow = flash.keep_mask(*args, jnp.arange(i0, i0 + t)[:, None],
                           jnp.arange(j0, j0 + t)[None, :],
                           flash.EXTRA_PART, 4, 0.3)
  transposed = flash.keep_mask(*args, jnp.arange(i0, i0 + t)[None, :],
                               jnp.arange(j0, j0 + t)[:, None],
                               flash.EXTRA_PART, 4, 0.3)
  assert narrow.shape == (t, t)
  np.testing.assert_array_equal(narrow, tile)
  np.testing.assert_array_equal(transposed, tile.T)


def test_keep_mask_rate_and_independence():
  b = jnp.arange(4)[:, None, None, None]
  h = jnp.arange(4)[None, :, None, None]
  i = jnp.arange(256)[:, None]
  j = jnp.arange(256)[None, :]
  keep = np.asarray(flash.keep_mask(jnp.uint32(7), b, h, i, j,
                                    flash.WINDOW_PART, 4, 0.1))
  assert abs(keep.mean() - 0.9) < 0.002
  # No structure along any axis: per-row, per-column and per-head rates.
  for axis in (0, 1, 2, 3):
    rates = keep.mean(axis=tuple(a for a in range(4) if a != axis))
    assert np.all(np.abs(rates - 0.9) < 0.03), axis
  extra = np.asarray(flash.keep_mask(jnp.uint32(7), b, h, i, j,
                                     flash.EXTRA_PART, 4, 0.1))
  assert 0.15 < (keep != extra).mean() < 0.2  # Parts draw independently.
  assert np.all(np.asarray(flash.keep_mask(jnp.uint32(7), b, h, i, j,
                                           flash.WINDOW_PART, 4, 0.0)))


def test_a_query_without_valid_keys_outputs_zero():
  q, k, v, valid, _, _, _ = _inputs()
  out = flash.flash_attention(q, k, v, valid,
                              window=W('segment', size=8, causal=True),
                              block=BLOCK)
  # Row 1's first two keys are padding: its first two queries see nothing.
  assert float(jnp.abs(out[1, :, :2]).max()) == 0.0
  assert float(jnp.abs(out[1, :, 2]).max()) > 0.0


@pytest.mark.parametrize('window,rule', [CASES[4][1:], CASES[6][1:]],
                         ids=['segment+extra', 'causal+extra-other'])
def test_bfloat16_tracks_float32(window, rule):
  kernel, ref = _functions(window, rule)
  args32 = tuple(_inputs()[i] for i in (0, 1, 2, 4, 5))
  args16 = tuple(a.astype(jnp.bfloat16) for a in args32)
  out = jax.jit(kernel)(*args16)
  assert out.dtype == jnp.bfloat16
  expected = ref(*args32)
  err = np.abs(np.asarray(out, np.float32) - np.asarray(expected))
  assert err.max() < 0.05, err.max()
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(kernel(*a).astype(
      jnp.float32)), (0, 1, 2, 3, 4)))(*args16)
  want = jax.grad(lambda *a: jnp.sum(ref(*a)), (0, 1, 2, 3, 4))(*args32)
  for g, w in zip(grads, want):
    assert g.dtype == jnp.bfloat16
    scale = float(jnp.abs(w).max())
    assert float(jnp.abs(g.astype(jnp.float32) - w).max()) < 0.05 * scale


def test_bad_arguments_are_named():
  q, k, v, valid, _, _, _ = _inputs()
  with pytest.raises(ValueError, match='Window kind'):
    flash.flash_attention(q, k, v, valid, window=W('diagonal'))
  with pytest.raises(ValueError, match='needs a window, extra keys'):
    flash.flash_attention(q, window=None)
  with pytest.raises(ValueError, match='needs a dropout_seed'):
    flash.flash_attention(q, k, v, valid, dropout_rate=0.1)
  with pytest.raises(ValueError, match='as many keys as queries'):
    flash.flash_attention(q, k[:, :, :10], v[:, :, :10], valid[:, :10],
                          window=W('full', causal=True))


def test_aligned_length_pads_for_every_call_at_once():
  # A multiple of 8 and of the one call's tile of 16.
  assert flash.aligned_length(37, 8, lambda n: [16]) == 48
  assert flash.aligned_length(48, 8, lambda n: [16]) == 48
  # Tiles that grow with the length: the length is aligned to the tiles
  # the calls take at the padded length.
  tiles = lambda n: [16] if n < 100 else [16, 64]
  assert flash.aligned_length(90, 1, tiles) == 96
  assert flash.aligned_length(120, 1, tiles) == 128
  # A call over pooled positions (e.g. slices of 8 in tiles of 16).
  assert flash.aligned_length(130, 8, lambda n: [16, 8 * 16]) == 256


def test_call_tile_is_the_tile_a_call_takes():
  window = flash.Window('segment', size=8)
  q = jnp.zeros((2, 3, 200, 32), jnp.bfloat16)
  t, *_ = flash._padded_operands(q, (q, q, jnp.ones((2, 200), bool)), None,
                                 flash.DEFAULT_BLOCK, rules=(window, None))
  assert t == flash.call_tile(200, 200, rules=(window, None), rows=6,
                              width=32, dtype=jnp.bfloat16)


def test_tile_sizes():
  assert flash.tile_size(5) == 16
  assert flash.tile_size(40) == 64
  assert flash.tile_size(4096) == 64
  assert flash.tile_size(4096, 128) == 128


@pytest.mark.parametrize('platform', ['cuda', 'tpu'])
@pytest.mark.parametrize('dtype,rate', [(jnp.float32, 0.0),
                                        (jnp.bfloat16, 0.1)],
                         ids=['float32', 'bfloat16-dropout'])
def test_forward_and_backward_lower(platform, dtype, rate):
  batch, heads, length, extra, dim = 2, 4, 1024, 32, 64
  window = W('segment', size=8, left=4, right=4)

  def grads(q, k, v, valid, kx, vx, x_valid):
    def loss(q, k, v, kx, vx):
      return jnp.sum(flash.flash_attention(
          q, k, v, valid, window=window, extra=(kx, vx, x_valid),
          dropout_rate=rate, dropout_seed=jnp.int32(3)).astype(
              jnp.float32))
    return jax.grad(loss, (0, 1, 2, 3, 4))(q, k, v, kx, vx)

  s = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
  args = (s(batch, heads, length, dim), s(batch, heads, length, dim),
          s(batch, heads, length, dim),
          jax.ShapeDtypeStruct((batch, length), bool),
          s(batch, heads, extra, dim), s(batch, heads, extra, dim),
          jax.ShapeDtypeStruct((batch, extra), bool))
  _, kernels = _exported(grads, platform, args)
  # Forward, dQ and two dK/dV kernels: every one is a real kernel call.
  assert kernels >= 4, kernels


def _exported(fn, platform: str, args) -> tuple[str, int]:
  """The StableHLO text of `fn` exported for `platform`, and its kernel
  calls (Triton or Mosaic custom calls)."""
  exported = jax.export.export(
      jax.jit(fn), platforms=(platform,),
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
          '__gpu$xla.gpu.triton')])(*args)
  text = exported.mlir_module()
  marker = '__gpu$xla.gpu.triton' if platform == 'cuda' else 'tpu_custom_call'
  return text, text.count(marker)


def test_extra_mass_and_small_head_dims():
  """The extra keys' share of each softmax; head and value widths that are
  neither powers of two nor 16 (padded inside for Triton)."""
  ks = jax.random.split(jax.random.PRNGKey(2), 5)
  q, k = (jax.random.normal(s, (2, 2, 40, 5)) for s in ks[:2])
  v = jax.random.normal(ks[2], (2, 2, 40, 3))
  kx = jax.random.normal(ks[3], (2, 2, 7, 5))
  vx = jax.random.normal(ks[4], (2, 2, 7, 3))
  valid = jnp.ones((2, 40), bool).at[1, 30:].set(False)
  x_valid = jnp.ones((2, 7), bool).at[1, 5:].set(False)
  window = W('segment', size=8, left=4, right=4)
  out, mass = flash.flash_attention(q, k, v, valid, window=window,
                                    extra=(kx, vx, x_valid), block=BLOCK,
                                    return_extra_mass=True)
  assert out.shape == (2, 2, 40, 3) and mass.shape == (2, 2, 40)
  np.testing.assert_allclose(out, flash.reference(
      q, k, v, valid, window=window, extra=(kx, vx, x_valid)), atol=2e-6)
  # The same share: attention with values 0 on the window and 1 on extras.
  share = flash.reference(q, k, jnp.zeros_like(v[..., :1]), valid,
                          window=window,
                          extra=(kx, jnp.ones_like(vx[..., :1]), x_valid))
  np.testing.assert_allclose(mass, share[..., 0], atol=1e-6)
  assert 0.05 < float(mass.mean()) < 0.95
  _, none = flash.flash_attention(q, k, v, valid, window=window,
                                  return_extra_mass=True)
  assert float(jnp.abs(none).max()) == 0.0


@pytest.fixture
def tpu_form(monkeypatch):
  """Runs the kernels in their TPU form (keys streamed from HBM through
  two-tile VMEM buffers, DMA semaphores) in Pallas' TPU interpreter."""
  monkeypatch.setattr(flash, 'INTERPRET_TPU_FORM', True)


@pytest.mark.parametrize('cid,window,rule', [CASES[0], CASES[5], CASES[6],
                                             CASES[7]],
                         ids=[CASES[i][0] for i in (0, 5, 6, 7)])
def test_tpu_form_equals_reference_with_gradients(tpu_form, cid, window,
                                                  rule):
  del tpu_form, cid
  _check_with_dropout_and_gradients(*_functions(window, rule), window, rule)


def _check_with_dropout_and_gradients(kernel, ref, window, rule):
  """`kernel` equals `ref` with attention dropout, output and gradients."""
  q, k, v, _, kx, vx, _ = _inputs()
  drop = dict(dropout_rate=0.25, dropout_seed=jnp.int32(5))
  args = (q, k, v, kx, vx)
  out = jax.jit(lambda *a: kernel(*a, **drop))(*args)
  np.testing.assert_allclose(out, ref(*args, **drop), rtol=1e-5, atol=1e-5)
  cot = jax.random.normal(jax.random.PRNGKey(1), out.shape)
  argnums = tuple(i for i, used in enumerate(
      (True, window is not None, window is not None, rule is not None,
       rule is not None)) if used)
  loss = lambda f: lambda *a: jnp.sum(f(*a, **drop) * cot)
  got = jax.jit(jax.grad(loss(kernel), argnums))(*args)
  want = jax.grad(loss(ref), argnums)(*args)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


def _bnhd(kernel):
  """`kernel` called in the 'bnhd' layout, as a function of 'bhnd'
  operands and output (the swaps are outside the kernels)."""
  swap = lambda a: jnp.swapaxes(a, 1, 2)

  def f(q, k, v, kx, vx, **kw):
    return swap(kernel(swap(q), swap(k), swap(v), swap(kx), swap(vx),
                       layout='bnhd', **kw))
  return f


@pytest.mark.parametrize('form', ['interpreter', 'tpu'])
@pytest.mark.parametrize('cid,window,rule', [CASES[4], CASES[5], CASES[6],
                                             CASES[7], CASES[8]],
                         ids=[CASES[i][0] for i in (4, 5, 6, 7, 8)])
def test_model_layout_equals_reference_with_gradients(monkeypatch, form, cid,
                                                      window, rule):
  """'bnhd' operands ([batch, n, heads, d], the model's layout) read
  through the BlockSpecs (transposed around the kernels in the TPU form),
  with dropout and the dK / dV passes split over query chunks."""
  del cid
  if form == 'tpu':
    monkeypatch.setattr(flash, 'INTERPRET_TPU_FORM', True)
  assert flash.query_chunks(BATCH * HEADS, -(-LENGTH // BLOCK))[0] > 1
  kernel, ref = _functions(window, rule)
  _check_with_dropout_and_gradients(_bnhd(kernel), ref, window, rule)


def test_model_layout_extra_mass_and_bad_layout():
  q, k, v, valid, kx, vx, x_valid = _inputs()
  swap = lambda a: jnp.swapaxes(a, 1, 2)
  window = W('segment', size=8, left=4, right=4)
  kw = dict(window=window, extra=(kx, vx, x_valid), block=BLOCK,
            return_extra_mass=True)
  out, mass = flash.flash_attention(q, k, v, valid, **kw)
  out2, mass2 = flash.flash_attention(
      swap(q), swap(k), swap(v), valid, window=window,
      extra=(swap(kx), swap(vx), x_valid), block=BLOCK,
      return_extra_mass=True, layout='bnhd')
  assert out2.shape == (BATCH, LENGTH, HEADS, DIM)
  assert mass2.shape == (BATCH, HEADS, LENGTH)
  np.testing.assert_allclose(swap(out2), out, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(mass2, mass, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="layout='nhbd'"):
    flash.flash_attention(q, k, v, valid, layout='nhbd')


@pytest.mark.parametrize('platform', ['cuda', 'tpu'])
def test_model_layout_lowers_without_transposes_on_gpu(platform):
  """On GPUs the 'bnhd' kernels read the model's layout: no transpose in
  the program; on TPUs the operands are transposed around them."""
  batch, heads, length, dim = 2, 4, 256, 32
  window = W('segment', size=8)

  def grads(q, k, v, valid):
    def loss(q, k, v):
      return jnp.sum(flash.flash_attention(
          q, k, v, valid, window=window, layout='bnhd').astype(jnp.float32))
    return jax.grad(loss, (0, 1, 2))(q, k, v)

  s = jax.ShapeDtypeStruct((batch, length, heads, dim), jnp.bfloat16)
  args = (s, s, s, jax.ShapeDtypeStruct((batch, length), bool))
  text, kernels = _exported(grads, platform, args)
  # The forward, and one backward kernel: slices of 8 are tile-local.
  assert kernels == 2, kernels
  transposes = text.count('stablehlo.transpose')
  assert (transposes == 0) if platform == 'cuda' else (transposes > 0)


def test_tile_local_windows():
  """Tile-local: each query tile sees window keys of its own tile only."""
  assert flash.tile_local(W('segment', size=8), 64, 64, 16)
  assert flash.tile_local(W('segment', size=16, causal=True), 64, 64, 16)
  assert not flash.tile_local(W('segment', size=32), 64, 64, 16)
  assert not flash.tile_local(W('segment', size=8, left=1), 64, 64, 16)
  assert not flash.tile_local(W('segment', size=8), 64, 32, 16)
  assert not flash.tile_local(W('sliding', left=3), 64, 64, 16)
  # One tile of queries and keys: any rule.
  assert flash.tile_local(W('sliding', left=3), 16, 16, 16)
  assert flash.tile_local(GroupRule(8, 2), 16, 16, 16)
  assert not flash.tile_local(None, 16, 16, 16)
  # Brute force: no (query, key) pair the rule lets through crosses tiles.
  n, t = 64, 16
  i, j = np.meshgrid(np.arange(n), np.arange(n), indexing='ij')
  for window in (W('segment', size=8), W('segment', size=4, causal=True),
                 W('segment', size=16)):
    seen = np.asarray(window.mask(jnp.asarray(i), jnp.asarray(j)))
    assert flash.tile_local(window, n, n, t)
    assert not np.any(seen & (i // t != j // t)), window


@pytest.mark.parametrize('head_dim,dtype,fused', [
    (128, jnp.float32, True), (256, jnp.float32, False),
    (256, jnp.bfloat16, True)])
def test_fused_backward_only_within_its_tile_budget(head_dim, dtype, fused):
  """Beyond `FUSED_TILE_ELEMENTS` (16 x 256 float32 tiles) the backward
  pass keeps the split dQ and dK / dV kernels."""
  shape = (1, 2, 64, head_dim)
  q = k = v = jnp.zeros(shape, dtype)
  valid = jnp.ones((1, 64), bool)
  loss = lambda q, k, v: jnp.sum(flash.flash_attention(
      q, k, v, valid, window=W('segment', size=8)).astype(jnp.float32))
  jaxpr = str(jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(q, k, v))
  assert ('flash_window_fused_bwd' in jaxpr) == fused
  assert ('flash_window_dkv' in jaxpr) == (not fused)


@pytest.mark.parametrize('form', ['interpreter', 'tpu'])
@pytest.mark.parametrize('cid,window,rule', [
    ('segment-causal', W('segment', size=8, causal=True), None),
    ('segment+extra-other', W('segment', size=16, causal=True),
     E('other_group', key_group=1, query_group=16)),
    ('one-tile-sliding', W('sliding', left=3), E('all')),
], ids=str)
def test_fused_backward_equals_the_split_passes(monkeypatch, form, cid,
                                                window, rule):
  """A tile-local window's dK / dV computed in the dQ kernel (one kernel,
  five products per tile) equal those of the separate dK / dV pass, with
  dropout, padded keys and the model's layout; the fused kernel is the one
  that runs."""
  del cid
  if form == 'tpu':
    monkeypatch.setattr(flash, 'INTERPRET_TPU_FORM', True)
  q, k, v, _, kx, vx, _ = _inputs()
  length = BLOCK if window.kind == 'sliding' else LENGTH
  q, k, v = (a[:, :, :length] for a in (q, k, v))
  kernel, _ = _functions(window, rule)
  if length == BLOCK:  # One tile: its own validity flags.
    valid = jnp.ones((BATCH, length), bool).at[0, 3].set(False)
    kernel = lambda q, k, v, kx, vx, **kw: flash.flash_attention(
        q, k, v, valid, window=window, extra=(kx, vx, jnp.ones(
            (BATCH, EXTRA), bool)), extra_rule=rule, block=BLOCK, **kw)
  f = _bnhd(kernel)
  drop = dict(dropout_rate=0.25, dropout_seed=jnp.int32(5))
  cot = jax.random.normal(jax.random.PRNGKey(1), q.shape)
  loss = lambda *a: jnp.sum(f(*a, **drop) * cot)
  args = (q, k, v, kx, vx)
  argnums = (0, 1, 2, 3, 4) if rule is not None else (0, 1, 2)
  jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums))(*args))
  assert 'flash_window_fused_bwd' in jaxpr
  # The extra keys' dK / dV keep their own pass.
  assert ('flash_window_dkv' in jaxpr) == (rule is not None)
  fused = jax.jit(jax.grad(loss, argnums))(*args)
  monkeypatch.setattr(flash, 'FUSED_BACKWARD', False)
  split = jax.jit(jax.grad(loss, argnums))(*args)
  assert 'flash_window_fused_bwd' not in str(
      jax.make_jaxpr(jax.grad(loss, argnums))(*args))
  for a, b in zip(fused, split):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_wide_float32_dkv_tiles_run_8_warps():
  """The dK / dV kernels of float32 tiles of WIDE_FLOAT32_TILE elements
  (16 x 256) run 8 warps on GPUs (4 spilled registers on an H200); other
  tiles keep `triton_warps`."""
  assert flash._wide_float32_warps(jnp.float32, 16, 256) == 8  # pylint: disable=protected-access
  assert flash._wide_float32_warps(jnp.float32, 16, 128) is None  # pylint: disable=protected-access
  assert flash._wide_float32_warps(jnp.bfloat16, 32, 256) is None  # pylint: disable=protected-access
