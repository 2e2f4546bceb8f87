"""Combiner's fused fixed and axial variants (`implementation='pallas'`).

On the CPU the flash kernels run in Pallas' interpreter. The layer must
equal the 'xla' layer with the same variables, in its output and the
gradients of its parameters and input, for Combiner-Fixed and every axial
plan, LM and MLM, under the padding patterns of the contract tests, in
float32 and bfloat16. Attention dropout must drop every effective weight
exactly once (direct weights after the joint softmax, span members inside
their local expectation), and the joint softmax over several flash calls
must equal its plain-XLA formula with the kernels' keep masks, gradients
included. `GroupRule`'s tile ranges must cover its mask. Forward and
backward programs must lower for `cuda` (Triton) and `tpu` (Mosaic) at a
realistic size.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import sharding
from lra_msmra.attention import combiner
from lra_msmra.kernels import combiner as fused
from lra_msmra.kernels import flash
from lra_msmra.kernels import mesh as mesh_lib
from tests.kernels import helpers

# pylint: disable=protected-access

pytestmark = pytest.mark.xdist_group('kernels-combiner')

FEATURES, HEADS, QKV = 16, 2, 16
LENGTH = 40
BLOCK = 16  # Several query and key tiles at LENGTH.

# (id, knobs, causal): the LRA configs' settings (fixed at the default
# block size; axial vertical, with a CLS prefix as on Image) in both forms,
# and every other plan, mode and abstraction in one of them.
CASES = [
    ('fixed-mlm', dict(variant='fixed'), False),
    ('fixed-s3-deepset-mean-lm', dict(variant='fixed', block_size=3,
                                      abstraction='deepset-mean'), True),
    ('vertical-prefix-mlm', dict(variant='axial', axial_plan='vertical',
                                 num_prefix_tokens=1), False),
    ('vertical-prefix-lm', dict(variant='axial', axial_plan='vertical',
                                num_prefix_tokens=1), True),
    ('horizontal-deepset-max-lm', dict(
        variant='axial', axial_plan='horizontal', row_length=6,
        abstraction='deepset-max'), True),
    ('rowmajor-mlm', dict(variant='axial', axial_plan='rowmajor'), False),
    # 'average' is the mean of a vertical and a horizontal joint softmax.
    ('mixture-joint-m3-mean-mlm', dict(
        variant='mixture', mixture_mode='joint_softmax', row_length=3,
        abstraction='mean'), False),
]


@pytest.fixture(autouse=True)
def _small_tiles(monkeypatch):
  monkeypatch.setattr(fused, 'BLOCK', BLOCK)


def _layer(implementation, causal, dtype=jnp.float32, **kw):
  return combiner.CombinerAttention(
      num_heads=HEADS, qkv_features=QKV, causal=causal, dtype=dtype,
      use_bias=True, implementation=implementation, **kw)


def _value_and_grads(layer, params, x, mask, cot):
  def loss(params, x):
    y = layer.apply({'params': params}, x, padding_mask=mask,
                    deterministic=True)
    return jnp.sum(y.astype(jnp.float32) * cot), y
  (_, y), grads = jax.value_and_grad(loss, (0, 1), has_aux=True)(params, x)
  return y, grads


def _setup(kw, causal):
  x = jax.random.normal(jax.random.PRNGKey(0), (4, LENGTH, FEATURES))
  mask = helpers.padding_mask(LENGTH)
  params = _layer('xla', causal, **kw).init(
      jax.random.PRNGKey(1), x, padding_mask=mask)['params']
  cot = jax.random.normal(jax.random.PRNGKey(2), (4, LENGTH, FEATURES))
  return helpers.random_biases(params), x, mask, cot


@pytest.mark.parametrize('cid,kw,causal', CASES, ids=[c[0] for c in CASES])
def test_layer_equals_xla_with_gradients(cid, kw, causal):
  del cid
  params, x, mask, cot = _setup(kw, causal)
  run = lambda impl: jax.jit(lambda p, a: _value_and_grads(
      _layer(impl, causal, **kw), p, a, mask, cot))(params, x)
  y, grads = run('pallas')
  y_ref, grads_ref = run('xla')
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  # The example without a real token, and padded rows, are zero.
  assert float(jnp.abs(y[3]).max()) == 0.0
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


def test_grid_of_three_tiles_equals_xla_with_gradients():
  """100 tokens in rows of 3: 34 rows padded to 48 (three 16-row tiles,
  not a power of two), 3 columns padded to a 16-column tile; both span
  directions in one call and the span pools along 48-position lines."""
  kw, causal, length = dict(variant='mixture', row_length=3,
                            mixture_mode='joint_softmax'), False, 100
  x = jax.random.normal(jax.random.PRNGKey(0), (2, length, FEATURES))
  mask = helpers.padding_mask(length)[:2]
  params = helpers.random_biases(_layer('xla', causal, **kw).init(
      jax.random.PRNGKey(1), x, padding_mask=mask)['params'])
  cot = jax.random.normal(jax.random.PRNGKey(2), (2, length, FEATURES))
  assert fused.grid_shape(length, row_length=3, offset=0, widths=(8,),
                          dtype=jnp.float32) == (48, 16)
  run = lambda impl: jax.jit(lambda p, a: _value_and_grads(
      _layer(impl, causal, **kw), p, a, mask, cot))(params, x)
  (y, grads), (y_ref, grads_ref) = run('pallas'), run('xla')
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize('cid,kw,causal', [CASES[0], CASES[3]],
                         ids=[CASES[0][0], CASES[3][0]])
def test_bfloat16_tracks_float32(cid, kw, causal):
  del cid
  params, x, mask, cot = _setup(kw, causal)
  y, grads = jax.jit(lambda p, a: _value_and_grads(
      _layer('pallas', causal, jnp.bfloat16, **kw), p, a, mask,
      cot))(params, x)
  y_ref, grads_ref = jax.jit(lambda p, a: _value_and_grads(
      _layer('xla', causal, **kw), p, a, mask, cot))(params, x)
  assert y.dtype == jnp.bfloat16
  scale = float(jnp.abs(y_ref).max())
  assert float(jnp.abs(y.astype(jnp.float32) - y_ref).max()) < 0.05 * scale
  # A leaf's own scale, and the largest one's: the key bias's gradient is 0
  # in exact arithmetic (softmax ignores a shift shared by every key) and
  # only bfloat16 noise here, as with 'xla' in bfloat16.
  top = max(float(jnp.abs(w).max()) for w in jax.tree.leaves(grads_ref))
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
    assert got.dtype == want.dtype
    err = float(jnp.abs(got - want).max())
    assert err < 0.05 * float(jnp.abs(want).max()) + 0.01 * top, err


def test_mixture_average_is_the_mean_of_the_two_plans():
  ks = jax.random.split(jax.random.PRNGKey(6), 3)
  q, k, v = (jax.random.normal(s, (2, 30, HEADS, 8)) for s in ks)
  real = helpers.padding_mask(30)[1:3]

  def run(plan, **kw):
    return fused.axial(q, k, v, q, k, real, plan=plan, row_length=5,
                       offset=2, causal=False, pool='max', **kw)
  mixture, vertical, horizontal = jax.jit(lambda: (
      run('mixture', mixture_mode='average'), run('vertical'),
      run('horizontal')))()
  np.testing.assert_allclose(mixture, 0.5 * (vertical + horizontal),
                             rtol=1e-6, atol=1e-6)


# -- dropout -----------------------------------------------------------------


def _one_hot_outputs(kw, causal, length, rate, seed):
  """Effective attention `[B, H, N, N]` of the fused variant (one-hot
  values), with and without dropout."""
  # Head dim = length: flash's kernels take values as wide as queries.
  ks = jax.random.split(jax.random.PRNGKey(4), 2)
  q = 0.3 * jax.random.normal(ks[0], (2, length, HEADS, length))
  k = jax.random.normal(ks[1], (2, length, HEADS, length))
  v = jnp.broadcast_to(jnp.eye(length)[None, :, None, :],
                       (2, length, HEADS, length))
  real = np.ones((2, length), bool)
  real[1, 3:7] = False
  real[1, -3:] = False
  real = jnp.asarray(real)

  def run(rate):
    common = dict(causal=causal, pool='max', dropout_rate=rate,
                  dropout_seed=jnp.uint32(seed))
    if kw['variant'] == 'fixed':
      out = fused.fixed(q, k, v, q, k, real, block_size=kw['block_size'],
                        **common)
    else:
      out = fused.axial(q, k, v, q, k, real, plan=kw['axial_plan'],
                        row_length=kw['row_length'], offset=0, **common)
    return jnp.swapaxes(out * real[:, :, None, None], 1, 2)
  return jax.jit(lambda: (run(0.0), run(rate)))(), real


@pytest.mark.parametrize('kw,causal', [
    (dict(variant='fixed', block_size=6), False),  # A partial last block.
    (dict(variant='axial', axial_plan='vertical', row_length=5), False),
    (dict(variant='axial', axial_plan='horizontal', row_length=5), True)],
    ids=['fixed-mlm', 'vertical-mlm', 'horizontal-lm'])
def test_dropout_drops_every_effective_weight_once(kw, causal):
  """E_dropped(i, j) / E(i, j) is 0 or 1 / (1 - rate): one keep mask per
  effective weight (two would give 1 / (1 - rate)^2 or a mix); in Fixed, a
  span member's mask is shared by every query that reads the span's
  summary."""
  rate = 0.3
  (exact, dropped), real = _one_hot_outputs(kw, causal, 20, rate, seed=7)
  exact, dropped = np.asarray(exact), np.asarray(dropped)
  support = exact > 1e-6
  ratio = dropped[support] / exact[support]
  kept = np.abs(ratio - 1 / (1 - rate)) < 1e-4
  zero = np.abs(ratio) < 1e-6
  assert np.all(kept | zero)
  assert 0.5 < kept.mean() < 0.9, kept.mean()
  assert np.all(np.abs(dropped[~support]) < 1e-6)
  if kw['variant'] == 'fixed':
    # Key j's weight for the queries outside its block is a span member's:
    # one mask for all of them.
    s = kw['block_size']
    ratio = np.where(support, dropped / np.where(support, exact, 1.0), np.nan)
    for b, h, j in itertools.product(*map(range, ratio.shape[:2]),
                                     range(ratio.shape[-1])):
      outside = np.ones(ratio.shape[2], bool)
      outside[j // s * s:(j // s + 1) * s] = False
      r = ratio[b, h, outside, j]
      r = r[np.isfinite(r)]
      assert r.size == 0 or np.ptp(r) < 1e-4


def _dense_joint(queries, keys, rate, seed):
  """`fused._joint` in plain XLA on the grid `[B, n, m, H, d]`: every
  pass's scores, one softmax, flash's keep masks on the direct keys (the
  calls' seeds drawn in `_joint`'s order; a row pass's batch row is b * n
  + r and its query the column c, a column pass's b * m + c and r)."""
  seeds = fused.Seeds(seed)
  batch, n, m, heads = next(iter(queries.values())).shape[:4]
  idx = lambda size, axis: jnp.arange(size).reshape(
      [size if a == axis else 1 for a in range(5)])
  b, r, c, h = idx(batch, 0), idx(n, 1), idx(m, 2), idx(heads, 3)
  logits, valid, apply, keeps = [], [], [], []
  for layout in ('rows', 'cols'):
    sets = keys.get(layout, [])
    order = [[s for s in sets if s.direct], [s for s in sets if not s.direct]]
    for group in order:
      if not group:
        continue
      pass_seed = seeds.next() if group[0].direct else None
      for part, s in enumerate(group):
        q = queries[layout]
        if layout == 'rows':  # Keys s.k[b, r, j].
          size = s.k.shape[2]
          j = idx(size, 4)
          logits.append(jnp.einsum('brchd,brjhd->brchj', q, s.k))
          valid.append(s.rule.mask(c, j) & s.valid[:, :, None, None, :])
          apply.append(lambda p, s=s: jnp.einsum('brchj,brjhd->brchd', p,
                                                  s.v))
          line_row, query = b * n + r, c
        else:  # Keys s.k[b, j, c].
          size = s.k.shape[1]
          j = idx(size, 4)
          logits.append(jnp.einsum('brchd,bjchd->brchj', q, s.k))
          valid.append(s.rule.mask(r, j)
                       & jnp.swapaxes(s.valid, 1, 2)[:, None, :, None, :])
          apply.append(lambda p, s=s: jnp.einsum('brchj,bjchd->brchd', p,
                                                  s.v))
          line_row, query = b * m + c, r
        keeps.append(
            flash.keep_mask(pass_seed, line_row, h, query, j, part, HEADS,
                            rate) if pass_seed is not None else None)
  shapes = [l.shape for l in logits]
  valid = [jnp.broadcast_to(v, sh) for v, sh in zip(valid, shapes)]
  s = jnp.concatenate(logits, -1)
  ok = jnp.concatenate(valid, -1)
  top = jax.lax.stop_gradient(jnp.max(jnp.where(ok, s, -jnp.inf), -1,
                                      keepdims=True))
  p = jnp.where(ok, jnp.exp(s - jnp.where(jnp.isfinite(top), top, 0.0)), 0.0)
  p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
  out, start = 0.0, 0
  for sh, kp, f in zip(shapes, keeps, apply):
    part = p[..., start:start + sh[-1]]
    start += sh[-1]
    if kp is not None:
      part = jnp.where(jnp.broadcast_to(kp, sh), part / (1 - rate), 0.0)
    out = out + f(part)
  return out


@pytest.mark.parametrize('form', ['interpreter', 'tpu'])
def test_joint_with_dropout_equals_dense_formula_with_gradients(
    form, monkeypatch):
  """Rows pass: direct row keys (dropped) and two kinds of summaries per
  row (not dropped); columns pass: the column without the query (dropped)
  and one summary kind (not dropped). Lines of 5 and 6 positions: each
  pass pads its lines to its tile. In the kernels' plain interpreted form
  (the one Triton runs), which reads the columns through its BlockSpecs,
  and in their TPU form, which gets them transposed (`flash._relaid`)."""
  monkeypatch.setattr(flash, 'INTERPRET_TPU_FORM', form == 'tpu')
  n, m, d = 6, 5, 8
  ks = iter(jax.random.split(jax.random.PRNGKey(5), 12))
  rnd = lambda *shape: jax.random.normal(next(ks), shape)
  real = np.ones((2, n * m), bool)
  real[1, 7:13] = False
  real[0, -4:] = False
  real = jnp.asarray(real.reshape(2, n, m))
  has = np.random.RandomState(0).rand(2, n, 2 * m) > 0.3
  q_grid = 0.5 * rnd(2, n, m, HEADS, d)
  grid = lambda *lines: rnd(2, *lines, HEADS, d)
  arrays = [grid(n, m), grid(n, m), grid(n, 2 * m), grid(n, 2 * m),
            grid(n, m), grid(n, m), grid(n, m), grid(n, m)]

  def keys(a):
    G = fused.GroupRule
    return {'rows': [fused.Keys(a[0], a[1], real, G(m, 1, 'all')),
                     fused.Keys(a[2], a[3], jnp.asarray(has), G(m, 2, 'ne'),
                                direct=False)],
            'cols': [fused.Keys(a[4], a[5], real, G(n, 1, 'ne')),
                     fused.Keys(a[6], a[7], jnp.asarray(has[:, :, :m]),
                                G(n, 1, 'lt'), direct=False)]}

  rate, seed = 0.25, jnp.uint32(11)
  kernel = lambda q, *a: fused._joint({'rows': q, 'cols': q}, keys(a), BLOCK,
                                      rate, fused.Seeds(seed))
  dense = lambda q, *a: _dense_joint({'rows': q, 'cols': q}, keys(a), rate,
                                     seed)
  out = jax.jit(kernel)(q_grid, *arrays)
  want = dense(q_grid, *arrays)
  assert float(jnp.abs(want).max()) > 0.1
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  cot = rnd(*out.shape)
  argnums = tuple(range(9))
  loss = lambda f: lambda *a: jnp.sum(f(*a) * cot)
  got = jax.jit(jax.grad(loss(kernel), argnums))(q_grid, *arrays)
  want = jax.grad(loss(dense), argnums)(q_grid, *arrays)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


def test_layer_dropout_runs_and_repeats():
  kw = dict(variant='fixed', block_size=5)
  layer = combiner.CombinerAttention(num_heads=HEADS, qkv_features=QKV,
                                     dropout_rate=0.2,
                                     implementation='pallas', **kw)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 24, FEATURES))
  mask = helpers.padding_mask(24)[:2]
  variables = layer.init(jax.random.PRNGKey(1), x, padding_mask=mask)

  @jax.jit
  def run(rng):
    def loss(params):
      y = layer.apply({'params': params}, x, padding_mask=mask,
                      deterministic=False, rngs={'dropout': rng})
      return jnp.sum(y ** 2), y
    return jax.value_and_grad(loss, has_aux=True)(variables['params'])
  (_, y1), g1 = run(jax.random.PRNGKey(5))
  (_, y2), _ = run(jax.random.PRNGKey(5))
  (_, y3), _ = run(jax.random.PRNGKey(6))
  np.testing.assert_array_equal(y1, y2)
  assert float(jnp.abs(y1 - y3).max()) > 1e-3
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(g1))


def test_batch_shards_give_the_unsplit_batch_with_its_dropout_masks():
  """Inside a data mesh every kernel call runs on one device's rows
  (`mesh.batch_parallel`), with the masks of the unsplit batch."""
  mesh = sharding.create_mesh(jax.devices()[:4])
  layer = combiner.CombinerAttention(
      num_heads=HEADS, qkv_features=QKV, dropout_rate=0.2,
      implementation='pallas', variant='axial', axial_plan='vertical')
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 24, FEATURES))
  mask = helpers.padding_mask(24)
  params = layer.init(jax.random.PRNGKey(1), x, padding_mask=mask)['params']

  def run(params, x, mask, rng):
    def loss(params):
      y = layer.apply({'params': params}, x, padding_mask=mask,
                      deterministic=False, rngs={'dropout': rng})
      return jnp.sum(y ** 2), y
    return jax.value_and_grad(loss, has_aux=True)(params)
  rng = jax.random.PRNGKey(5)
  want = jax.jit(run)(params, x, mask, rng)
  rows, same = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  got = jax.jit(mesh_lib.under_mesh(run, mesh),
                in_shardings=(same, rows, rows, same))(params, x, mask, rng)
  with mesh_lib.mesh_context(mesh):
    assert 'shard_map' in str(jax.make_jaxpr(run)(params, x, mask, rng))
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    scale = float(np.abs(np.asarray(w)).max())
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 + 5e-5 * scale)


# -- the mask rule, knobs, lowering ------------------------------------------


@pytest.mark.parametrize('queries,kinds,relation', [
    (5, 1, 'all'), (5, 1, 'le'), (7, 1, 'lt'), (6, 1, 'gt'), (5, 1, 'ne'),
    (5, 2, 'ne'), (3, 3, 'lt'), (20, 1, 'lt')])
def test_group_rule_ranges_cover_its_mask(queries, kinds, relation):
  rule = fused.GroupRule(queries, kinds, relation)
  nq = 4 * queries + 3
  nk = 4 * queries * kinds + 3 * kinds
  i = np.arange(nq)[:, None]
  j = np.arange(nk)[None, :]
  dense = np.asarray(rule.mask(jnp.asarray(i), jnp.asarray(j)))
  # The rule by its definition.
  gi, ci = i // queries, i % queries
  gj, cj = j // (kinds * queries), (j % (kinds * queries)) % queries
  rel = {'all': cj == cj, 'le': cj <= ci, 'lt': cj < ci, 'gt': cj > ci,
         'ne': cj != ci}[relation]
  np.testing.assert_array_equal(dense, (gi == gj) & rel)
  t = 4  # Tiles of 4 queries (keys): every tile's range at once.
  for ranges, n, seen in ((rule.key_range, nk, dense),
                          (rule.query_range, nq, dense.T)):
    starts = np.arange(0, seen.shape[0], t)
    lo, hi = map(np.asarray, ranges(jnp.asarray(starts),
                                    jnp.asarray(starts + t - 1), n))
    for start, a, b in zip(starts, lo, hi):
      hits = np.nonzero(seen[start:start + t].any(0))[0]
      assert hits.size == 0 or (a <= hits.min() and hits.max() < b)
  valid = np.random.RandomState(1).rand(2, 4 * queries * kinds) > 0.6
  for keys in (4 * queries * kinds, 4 * queries * kinds - 2):
    got = rule.any_key(jnp.asarray(valid[:, :keys]), nq)
    want = (dense[None, :, :keys] & valid[:, None, :keys]).any(-1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize('line', [5, 16, 23])
def test_sides_rule_is_a_prefix_then_a_suffix_and_its_ranges_cover_it(line):
  rule = fused.Sides(line)
  i = np.arange(2 * line)[:, None]
  j = np.arange(line)[None, :]
  dense = np.asarray(rule.mask(jnp.asarray(i), jnp.asarray(j)))
  c = i % line
  np.testing.assert_array_equal(dense, np.where(i < line, j < c, j > c))
  np.testing.assert_array_equal(
      np.asarray(rule.visible_counts(jnp.arange(2 * line), line)),
      dense.sum(1))
  for t in (1, 4, 16):  # Tiles of t queries (keys): their ranges cover.
    for ranges, n, seen in ((rule.key_range, line, dense),
                            (rule.query_range, 2 * line, dense.T)):
      for start in range(0, seen.shape[0], t):
        end = min(start + t, seen.shape[0])
        lo, hi = map(int, ranges(jnp.int32(start), jnp.int32(end - 1), n))
        hits = np.nonzero(seen[start:end].any(0))[0]
        assert hits.size == 0 or (lo <= hits.min() and hits.max() < hi)
        if t == 1:  # A single position's range is exactly its set.
          assert list(range(lo, hi)) == list(hits), (start, lo, hi, hits)


def test_logsparse_is_refused_at_construction():
  with pytest.raises(ValueError, match="variant='logsparse': use "
                     "implementation='xla'"):
    combiner.CombinerAttention(variant='logsparse', implementation='pallas')


@pytest.mark.parametrize('platform', ['cuda', 'tpu'])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16],
                         ids=['float32', 'bfloat16'])
def test_forward_and_backward_lower(platform, dtype, monkeypatch):
  """Fixed (LM) and axial vertical (MLM) at head_dim 64, N = 1024."""
  monkeypatch.setattr(fused, 'BLOCK', flash.DEFAULT_BLOCK)
  batch, heads, length, dim = 1, 2, 1024, 64

  def grads(q, k, v, real):
    def loss(q, k, v):
      a = fused.fixed(q, k, v, q, k, real, block_size=32, causal=True,
                      pool='max')
      b = fused.axial(q, k, v, q, k, real, plan='vertical', row_length=32,
                      offset=0, causal=False, pool='max')
      return jnp.sum((a + b).astype(jnp.float32))
    return jax.grad(loss, (0, 1, 2))(q, k, v)

  s = jax.ShapeDtypeStruct((batch, length, heads, dim), dtype)
  exported = jax.export.export(
      jax.jit(grads), platforms=(platform,),
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
          '__gpu$xla.gpu.triton')])(
              s, s, s, jax.ShapeDtypeStruct((batch, length), bool))
  text = exported.mlir_module()
  marker = '__gpu$xla.gpu.triton' if platform == 'cuda' else 'tpu_custom_call'
  # Forward: fixed 1, vertical 1 for both spans + 2 passes; backward:
  # fixed dq + 2 dK/dV, spans dq + dK/dV, rows pass dq + 2 dK/dV, columns
  # pass dq + dK/dV. On GPUs the span pools too, forward and backward
  # (TPUs pool in XLA: `span_pools`).
  want = 16 if platform == 'cuda' else 14
  assert text.count(marker) == want, text.count(marker)
