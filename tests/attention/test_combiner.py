"""Combiner: the invariants of docs/mechanisms/combiner.md §8.

They are checked on the effective attention E. E is read from the layer itself
(`CombinerAttention.effective_attention` runs the layer's code path with one-hot
values) and checked against

* a dense reference written here from the paper's definitions: every query's
  partition is enumerated explicitly as index sets, abstractions pool the
  real members of each set, and the joint and per-span softmaxes are plain
  numpy (float64);
* the structural invariants: E >= 0, rows sum to 1 over the support, full
  support, no leakage (also through summaries, by Jacobian), exact coverage
  of the supports (twice for `joint_softmax`), rank-1 spans, reductions to
  softmax attention, logsparse coverage for awkward lengths, padding.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra.attention import combiner
from lra_msmra.attention import softmax

FEATURES, HEADS, QKV = 16, 2, 16

CASES = {
    'fixed': dict(variant='fixed'),
    'fixed-s3-deepset-max': dict(variant='fixed', block_size=3,
                                 abstraction='deepset-max'),
    'logsparse': dict(variant='logsparse'),
    'logsparse-mean': dict(variant='logsparse', abstraction='mean'),
    'axial-vertical': dict(variant='axial', axial_plan='vertical'),
    'axial-vertical-prefix-deepset-mean': dict(
        variant='axial', axial_plan='vertical', num_prefix_tokens=1,
        abstraction='deepset-mean'),
    'axial-horizontal': dict(variant='axial', axial_plan='horizontal'),
    'axial-rowmajor': dict(variant='axial', axial_plan='rowmajor'),
    'mixture-average': dict(variant='mixture', mixture_mode='average'),
    'mixture-joint': dict(variant='mixture', mixture_mode='joint_softmax',
                          row_length=3),
}


def _inputs(length, seed=0, hole=True):
  """Two sequences: all real, and one with an interior hole and a padded tail.

  For length 13 the hole is positions 4..7: a whole block of 4 (fixed), a
  whole grid row (axial with m = 4) and whole dyadic spans (logsparse).
  """
  x = jax.random.normal(jax.random.PRNGKey(seed), (2, length, FEATURES))
  real = np.ones((2, length), bool)
  if hole:
    real[1, 4:8] = False
  real[1, length - 2:] = False
  return x, real


def _layer(causal, **kw):
  return combiner.CombinerAttention(num_heads=HEADS, qkv_features=QKV,
                                    causal=causal, **kw)


# Everything runs under jit: one compile per graph is much cheaper on CPU than
# eager dispatch of the layer's many small ops.
def _init(layer, x, real=None):
  return jax.jit(layer.init)(jax.random.PRNGKey(1), x, padding_mask=real)


def _apply(layer, variables, x, real):
  return jax.jit(lambda v, a, m: layer.apply(v, a, padding_mask=m))(
      variables, x, real)


def _probe_all(layer, variables, x, real):
  """(E, coverage counts, layer output) from one compiled function."""
  def run(v, a, m):
    probe = lambda p: layer.apply(v, a, padding_mask=m, probe=p,
                                  method='effective_attention')
    return (probe('weights'), probe('coverage'),
            layer.apply(v, a, padding_mask=m))
  e, count, y = jax.jit(run)(variables, x, jnp.asarray(real))
  return np.asarray(e, np.float64), np.asarray(count), y


def _effective(layer, variables, x, real, probe='weights'):
  fn = jax.jit(lambda v, a, m: layer.apply(
      v, a, padding_mask=m, method='effective_attention', probe=probe))
  return np.asarray(fn(variables, x, jnp.asarray(real)), np.float64)


def _support(real, causal):
  """Omega_i as bool `[batch, 1, N, N]`: real queries, real keys (j <= i)."""
  n = real.shape[1]
  s = real[:, None, :, None] & real[:, None, None, :]
  if causal:
    s = s & np.tril(np.ones((n, n), bool))[None, None]
  return s


# -------------------------------------------- reference from the definitions


def _fixed_partition(n, causal, size):
  def partition(i):
    block = i // size
    direct = [j for j in range(block * size, min(n, (block + 1) * size))
              if not causal or j <= i]
    others = range(block) if causal else [
        r for r in range(-(-n // size)) if r != block]
    spans = [(list(range(r * size, min(n, (r + 1) * size))), None)
             for r in others]
    return direct, spans
  return partition


def _logsparse_partition(n, causal):
  levels = (n - 1).bit_length()  # ceil(log2 n)

  def partition(i):
    direct = [i] + ([i - 1] if i % 2 else [])
    if not causal and i % 2 == 0 and i + 1 < n:
      direct.append(i + 1)
    spans = []
    for level in range(1, levels):
      own = i >> level
      if own % 2:  # bit `level` of i is set: the block just before.
        spans.append(range((own - 1) << level, own << level))
      elif not causal and (own + 1) << level < n:  # the block just after.
        spans.append(range((own + 1) << level, min(n, (own + 2) << level)))
    return direct, [(list(s), None) for s in spans]
  return partition


def _axial_partition(n, causal, width, prefix, plan):
  """Plans 'vertical', 'horizontal', 'rowmajor' and 'joint' (both plans)."""
  offset = (-prefix) % width  # leading tokens end an extra first row.
  cell = {p: divmod(p + offset, width) for p in range(n)}
  rows = -(-(n + offset) // width)

  def partition(i):
    row, col = cell[i]
    own_row = [j for j in range(n) if cell[j][0] == row
               and (not causal or cell[j][1] <= col)]
    other_rows = [r for r in range(rows) if r < row or (not causal and r > row)]
    if plan == 'rowmajor':
      return own_row, [([j for j in range(n) if cell[j][0] == r], (r, col))
                       for r in other_rows]
    own_col = [j for j in range(n) if cell[j][1] == col
               and cell[j][0] in other_rows]
    spans = []
    if plan in ('vertical', 'joint'):
      for c in range(width):
        if c == col:
          continue
        spans.append([j for j in range(n) if cell[j][1] == c
                      and cell[j][0] < row])
        if not causal:
          spans.append([j for j in range(n) if cell[j][1] == c
                        and cell[j][0] > row])
    if plan in ('horizontal', 'joint'):
      for r in other_rows:
        spans.append([j for j in range(n) if cell[j][0] == r
                      and cell[j][1] < col])
        spans.append([j for j in range(n) if cell[j][0] == r
                      and cell[j][1] > col])
    return own_row + own_col, [(s, None) for s in spans]
  return partition, cell, offset


def _partitions(kw, n, causal):
  """The list of partition plans of a case (two for an averaged mixture)."""
  variant = kw['variant']
  if variant == 'fixed':
    size = kw.get('block_size') or combiner.default_block_size(n)
    return [_fixed_partition(n, causal, size)]
  if variant == 'logsparse':
    return [_logsparse_partition(n, causal)]
  width = kw.get('row_length') or combiner.default_block_size(n)
  prefix = kw.get('num_prefix_tokens', 0)
  if variant == 'mixture':
    if kw.get('mixture_mode') == 'joint_softmax':
      plans = ['joint']
    else:
      plans = ['vertical', 'horizontal']
  else:
    plans = [kw.get('axial_plan') or 'rowmajor']
  return [_axial_partition(n, causal, width, prefix, p)[0] for p in plans]


def _softmax(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max())
  return e / e.sum()


def reference_effective_attention(variables, x, real, causal, kw):
  """E `[batch, heads, N, N]` by explicit enumeration (float64 numpy)."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64),
                             variables['params'])
  x0 = np.asarray(x, np.float64) * real[..., None]
  batch, n, _ = x0.shape
  d = QKV // HEADS
  q = np.einsum('bnf,fhd->bnhd', x0, p['query']['kernel']) / math.sqrt(d)
  k = np.einsum('bnf,fhd->bnhd', x0, p['key']['kernel'])
  v = np.einsum('bnf,fhd->bnhd', x0, p['value']['kernel'])
  abstraction = kw.get('abstraction') or 'max'
  pq, pk = q, k
  if abstraction.startswith('deepset'):
    pq = np.maximum(q @ p['deepset_query']['kernel'], 0.0)
    pk = np.maximum(k @ p['deepset_key']['kernel'], 0.0)
  pool = {'max': np.max, 'mean': np.mean}[abstraction.split('-')[-1]]

  plans = _partitions(kw, n, causal)
  if kw['variant'] == 'axial' and (kw.get('axial_plan') or 'rowmajor') == (
      'rowmajor'):
    width = kw.get('row_length') or combiner.default_block_size(n)
    offset = (-kw.get('num_prefix_tokens', 0)) % width
    row_summary = _rowmajor_summaries(p, x0, q, k, v, real, width, offset)

  e = np.zeros((batch, HEADS, n, n))
  for partition in plans:
    for b in range(batch):
      for i in range(n):
        if not real[b, i]:
          continue
        direct, spans = partition(i)
        for h in range(HEADS):
          logits, parts = [], []
          for j in direct:
            if real[b, j]:
              logits.append(q[b, i, h] @ k[b, j, h])
              parts.append(([j], np.ones(1)))
          for members, cell in spans:
            members = [j for j in members if real[b, j]]
            if not members:
              continue
            if cell is None:
              q_span = pool(pq[b, members, h], axis=0)
              k_span = pool(pk[b, members, h], axis=0)
            else:
              q_span, k_span = row_summary(b, h, cell)
            logits.append(q[b, i, h] @ k_span)
            parts.append((members, _softmax(k[b, members, h] @ q_span)))
          for w, (members, inner) in zip(_softmax(logits), parts):
            e[b, h, i, members] += w * inner / len(plans)
  return e


def _rowmajor_summaries(p, x0, q, k, v, real, width, offset):
  """Official rowmajor: query at (r, c), key = Dense(LN(x + Dense(out)))."""
  n = x0.shape[1]

  def summary(b, h, cell):
    pos = cell[0] * width + cell[1] - offset
    inside = 0 <= pos < n
    x_cell = x0[b, pos] if inside else np.zeros(x0.shape[-1])
    q_cell = q[b, pos] if inside else np.zeros(q.shape[2:])
    members = [j for j in range(n)
               if (j + offset) // width == cell[0] and real[b, j]]
    out = np.stack([_softmax(k[b, members, g] @ q_cell[g]) @ v[b, members, g]
                    for g in range(HEADS)])
    z = x_cell + np.einsum('hd,hdf->f', out, p['row_summary_out']['kernel'])
    z = (z - z.mean()) / np.sqrt(z.var() + 1e-6)
    z = z * p['row_summary_norm']['scale'] + p['row_summary_norm']['bias']
    key = np.einsum('f,fhd->hd', z, p['row_summary_key']['kernel'])
    return q_cell[h], key[h]
  return summary


def _coverage(partition, n, real_row):
  """count[i, j]: the number of terms of query i containing real key j."""
  count = np.zeros((n, n))
  for i in range(n):
    if not real_row[i]:
      continue
    direct, spans = partition(i)
    for j in direct:
      count[i, j] += real_row[j]
    for members, _ in spans:
      for j in members:
        count[i, j] += real_row[j]
  return count


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize('causal', [False, True], ids=['mlm', 'lm'])
@pytest.mark.parametrize('case', sorted(CASES))
def test_effective_attention_matches_reference_and_invariants(case, causal):
  kw = CASES[case]
  x, real = _inputs(13)
  layer = _layer(causal, **kw)
  variables = _init(layer, x, real)
  e, count, y_layer = _probe_all(layer, variables, x, real)

  # Numerics: the dense reference from the definitions.
  np.testing.assert_allclose(
      e, reference_effective_attention(variables, x, real, causal, kw),
      rtol=1e-4, atol=1e-6)

  # E is the layer's mixing matrix: y = out(E v), with zeroed padded inputs.
  p = variables['params']
  v = jnp.einsum('bnf,fhd->bnhd', x * real[..., None], p['value']['kernel'])
  y = jnp.einsum('bhij,bjhd,hdf->bif', e, v, p['out']['kernel'])
  np.testing.assert_allclose(y_layer, y, rtol=1e-4, atol=1e-5)

  # Non-negative, normalised, full support, nothing outside it (LM: no
  # future key, no padded key; padded query rows are zero).
  support = np.broadcast_to(_support(real, causal), e.shape)
  assert e.min() >= 0.0
  assert e[support].min() > 0.0
  assert np.all(e[~support] == 0.0)
  rows = np.broadcast_to(real[:, None, :], e.shape[:3])
  np.testing.assert_allclose(e.sum(-1)[rows], 1.0, rtol=1e-5)
  assert np.all(e.sum(-1)[~rows] == 0.0)

  # Coverage: the paper forms' terms are disjoint and cover Omega_i exactly
  # once (for 'average', each of the two plans does); joint_softmax covers
  # the query's own row and column once and every other position twice.
  expected = support.astype(float)
  if kw.get('mixture_mode') == 'joint_softmax':
    cell = np.array([divmod(j, kw['row_length']) for j in range(13)])
    on_axis = ((cell[:, None, 0] == cell[None, :, 0])
               | (cell[:, None, 1] == cell[None, :, 1]))
    expected = expected * np.where(on_axis, 1.0, 2.0)
    assert expected.max() == 2.0
  np.testing.assert_array_equal(count, expected)
  # ... and the counts are those of the reference partition.
  plans = _partitions(kw, 13, causal)
  for b in range(2):
    reference = sum(_coverage(plan, 13, real[b]) for plan in plans)
    np.testing.assert_array_equal(count[b, 0] * len(plans), reference)


@pytest.mark.parametrize('causal', [False, True], ids=['mlm', 'lm'])
@pytest.mark.parametrize('length', [5, 8, 12, 13, 16, 17, 31, 100])
def test_logsparse_coverage_and_term_count(length, causal):
  """Exact coverage for every N (17 and 5 catch the JAX off-by-one)."""
  layer = combiner.CombinerAttention(num_heads=1, qkv_features=4,
                                     causal=causal, variant='logsparse')
  x = jax.random.normal(jax.random.PRNGKey(0), (1, length, 4))
  real = np.ones((1, length), bool)
  variables = _init(layer, x)

  def run(v):
    count = layer.apply(v, x, method='effective_attention', probe='coverage')
    # With zero queries every logit is 0, so the joint softmax is uniform
    # over the T_i terms and the direct self weight E(i, i) is 1 / T_i.
    v = jax.tree_util.tree_map(lambda a: a, v)
    v['params']['query']['kernel'] = jnp.zeros_like(
        v['params']['query']['kernel'])
    return count, layer.apply(v, x, method='effective_attention')
  count, e = jax.jit(run)(variables)
  np.testing.assert_array_equal(count[0, 0], _support(real, causal)[0, 0])
  terms = 1.0 / np.diag(np.asarray(e[0, 0], np.float64))
  partition = _logsparse_partition(length, causal)
  expected = [len(partition(i)[0]) + len(partition(i)[1])
              for i in range(length)]
  np.testing.assert_allclose(terms, expected, rtol=1e-5)
  assert terms.max() <= 2 + math.ceil(math.log2(length)) + 1e-4


def _rank(block):
  s = np.linalg.svd(block, compute_uv=False)
  return int(np.sum(s > 1e-6 * s[0]))


def test_rank_one_inside_spans():
  """Queries sharing a span weight its members proportionally (rank 1)."""
  x, real = _inputs(16, hole=False)
  real[:] = True
  # Fixed MLM, s = 4: block 1 (keys 4..7) is one span for queries outside it.
  layer = _layer(False, variant='fixed')
  e = _effective(layer, _init(layer, x), x, real)[0, 0]
  outside = [i for i in range(16) if i // 4 != 1]
  assert _rank(e[np.ix_(outside, range(4, 8))]) == 1
  assert _rank(e[np.ix_(range(4, 8), range(4, 8))]) > 1  # direct: full rank.
  # Logsparse LM: queries 8..15 reach keys 0..7 through one level-3 span.
  layer = _layer(True, variant='logsparse')
  e = _effective(layer, _init(layer, x), x, real)[0, 0]
  assert _rank(e[8:16, 0:8]) == 1
  # Axial-vertical LM (4 x 4): queries in row 3, columns != 0, reach column 0
  # above them (keys 0, 4, 8) through one span.
  layer = _layer(True, variant='axial', axial_plan='vertical')
  e = _effective(layer, _init(layer, x), x, real)[0, 0]
  assert _rank(e[np.ix_([13, 14, 15], [0, 4, 8])]) == 1


@pytest.mark.parametrize('causal', [False, True], ids=['mlm', 'lm'])
@pytest.mark.parametrize('block_size', [13, 1])
def test_fixed_reduces_to_softmax_attention(block_size, causal):
  """s = N: one block, all direct. s = 1: every span is a single token."""
  x, real = _inputs(13)
  layer = _layer(causal, variant='fixed', block_size=block_size)
  variables = _init(layer, x, real)
  reference = softmax.SoftmaxAttention(num_heads=HEADS, qkv_features=QKV,
                                       causal=causal)
  y = _apply(layer, variables, x, real)
  y_ref = _apply(reference, variables, x, real)
  np.testing.assert_allclose(np.asarray(y)[real], np.asarray(y_ref)[real],
                             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('abstraction', ['mean', 'deepset-max',
                                         'deepset-mean'])
@pytest.mark.parametrize('variant', [dict(variant='fixed'),
                                     dict(variant='axial',
                                          axial_plan='horizontal')],
                         ids=['fixed', 'horizontal'])
def test_padding_all_abstractions(variant, abstraction):
  """Fully padded spans: finite values and grads, padded content inert."""
  x, real = _inputs(13)
  layer = _layer(False, abstraction=abstraction, **variant)
  variables = _init(layer, x, real)
  apply = jax.jit(lambda v, a: layer.apply(v, a, padding_mask=real))
  y = apply(variables, x)
  noise = 10.0 * jax.random.normal(jax.random.PRNGKey(5), x.shape)
  y2 = apply(variables, jnp.where(real[..., None], x, noise))
  np.testing.assert_allclose(np.asarray(y2)[real], np.asarray(y)[real],
                             rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(y)[~real] == 0.0)  # no bias: zeroed queries.
  grads = jax.jit(jax.grad(lambda v, a: jnp.sum(
      layer.apply(v, a, padding_mask=real) ** 2), argnums=(0, 1)))(
          variables, x)
  for g in jax.tree_util.tree_leaves(grads):
    assert bool(jnp.all(jnp.isfinite(g)))
  deepset = variables['params'].get('deepset_key')
  assert (deepset is not None) == abstraction.startswith('deepset')


@pytest.mark.parametrize('case', ['fixed-s3-deepset-max', 'logsparse-mean',
                                  'axial-vertical-prefix-deepset-mean',
                                  'mixture-joint'])
def test_no_leakage_through_summaries(case):
  """LM: d y_i / d x_j = 0 for j > i, pooled abstractions included."""
  x, real = _inputs(13)
  layer = _layer(True, **CASES[case])
  variables = _init(layer, x, real)
  jac = jax.jit(jax.jacrev(lambda a: layer.apply(
      variables, a[None], padding_mask=real[1:])[0]))(x[1])
  influence = np.abs(np.asarray(jac)).sum(axis=(1, 3))  # [i, j]
  future = np.triu(np.ones((13, 13), bool), k=1)
  assert influence[future].max() == 0.0
  assert influence[~future].max() > 0.0


def test_prefix_tokens_put_image_rows_on_grid_rows():
  """With CLS first, pixel (r, c) of a 4-wide image sits at grid (r + 1, c)."""
  _, cell, offset = _axial_partition(17, False, 4, 1, 'vertical')
  assert offset == 3 and cell[0] == (0, 3)
  for r in range(4):
    for c in range(4):
      assert cell[1 + 4 * r + c] == (r + 1, c)


def test_default_block_size():
  sizes = {1: 1, 13: 4, 16: 4, 101: 8, 1024: 32, 1025: 32, 1001: 32,
           2001: 32, 4000: 64, 16384: 128}
  for length, size in sizes.items():
    assert combiner.default_block_size(length) == size, length


def test_knobs_are_checked():
  with pytest.raises(NotImplementedError, match='learnable'):
    _layer(False, variant='learnable')
  with pytest.raises(ValueError, match='variant'):
    _layer(False, variant='sqrt')
  with pytest.raises(ValueError, match='block_size'):
    _layer(False, variant='axial', block_size=4)
  with pytest.raises(ValueError, match='row_length'):
    _layer(False, variant='fixed', row_length=4)
  with pytest.raises(ValueError, match='axial_plan'):
    _layer(False, variant='mixture', axial_plan='vertical')
  with pytest.raises(ValueError, match='mixture_mode'):
    _layer(False, variant='axial', mixture_mode='average')
  with pytest.raises(ValueError, match='num_prefix_tokens'):
    _layer(False, variant='logsparse', num_prefix_tokens=1)
  with pytest.raises(ValueError, match='rowmajor'):
    _layer(False, variant='axial', abstraction='mean')
  with pytest.raises(ValueError, match='abstraction'):
    _layer(False, variant='fixed', abstraction='min')
  with pytest.raises(ValueError, match='probe'):
    layer = _layer(False)
    x, real = _inputs(8, hole=False)
    layer.apply({}, x, method='effective_attention', probe='rank')


@pytest.mark.parametrize('causal', [False, True], ids=['mlm', 'lm'])
@pytest.mark.parametrize('pool,deepset', [('max', False), ('max', True),
                                          ('mean', True)])
def test_fixed_per_head_path_matches_all_heads(pool, deepset, causal):
  """The one-head-at-a-time, rematerialised path: same values and grads."""
  keys = jax.random.split(jax.random.PRNGKey(3), 5)
  shape = (2, 4, 3, HEADS, 5)  # [batch, blocks, block, heads, dim]
  q, k, v, pq, pk = (jax.random.normal(key, shape) for key in keys)
  real = np.ones(shape[:3], bool)
  real[1, 1] = False  # a fully padded block
  real[1, 3, 1:] = False
  ctx = combiner._Ctx(causal=causal, pool=pool, probe=None,
                      dropout=lambda w: w, stochastic=False)
  attend = lambda g: combiner._joint(combiner._fixed_terms(g, ctx), ctx)

  def run(per_head, q, k, v, pq, pk):
    if not deepset:
      pq, pk = q, k
    g = combiner._Grid(q=q, k=k, v=v, values=v, pq=pq, pk=pk, real=real)
    out = combiner._per_head(attend, g) if per_head else attend(g)
    return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape)))

  args = (q, k, v, pq, pk)
  for value, ref in zip(
      jax.jit(jax.value_and_grad(lambda *a: run(True, *a),
                                 argnums=range(5)))(*args),
      jax.jit(jax.value_and_grad(lambda *a: run(False, *a),
                                 argnums=range(5)))(*args)):
    for a, b in zip(jax.tree_util.tree_leaves(value),
                    jax.tree_util.tree_leaves(ref)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                                 atol=1e-6)
