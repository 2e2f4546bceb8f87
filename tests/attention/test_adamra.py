"""AdaMRA: the invariants of docs/mechanisms/adamra.md §8 against references.

The references below are written from the paper's equations with explicit
loops and O(N m) (or O(N^2)) weight matrices in float64 numpy; they share no
code with `lra_msmra.attention.adamra` beyond reading its parameters.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import models
from lra_msmra import steps
from lra_msmra.attention import adamra

FEATURES, SUBHEADS = 16, 2


def _module(**kw):
  kw.setdefault('num_heads', SUBHEADS)
  kw.setdefault('qkv_features', FEATURES)
  return adamra.AdaMRAAttention(**kw)


def _inputs(batch, length, seed=0, features=FEATURES):
  return jax.random.normal(jax.random.PRNGKey(seed),
                           (batch, length, features))


@functools.partial(jax.jit, static_argnames=('module',))
def _init(module, x, mask, seed=0):
  # Jitted: eager op-by-op dispatch compiles every op and is slower on CPU.
  return module.init(jax.random.PRNGKey(seed), x, padding_mask=mask)


@functools.partial(jax.jit, static_argnames=('module', 'mutable'))
def _run(module, variables, x, mask, mutable=False):
  """`module.apply` under jit, compiled once per module and shapes."""
  return module.apply(variables, x, padding_mask=mask, mutable=mutable)


def _run_fresh(module, variables, x, mask):
  """`module.apply` traced afresh, so that an active interceptor applies."""
  return jax.jit(lambda v, a, m: module.apply(v, a, padding_mask=m))(
      variables, x, mask)


def _feature(a, feature_map):
  if feature_map == 'relu':
    return np.maximum(a, 0.0)
  return np.where(a > 0, a + 1.0, np.exp(a))


def reference(params, x, mask, *, rates, projections, segment_means,
              router_gate, feature_map='relu', eps=1e-6, mixture=False,
              keep_empty_segments=False):
  """AdaMRA from the paper's equations, with explicit landmark weights.

  `mixture=True` replaces the routed head by the router-weighted sum of all
  heads (the function whose gradient `'straight_through'` passes back).
  `keep_empty_segments=True` keeps a segment without a real token as a
  landmark with zero mean key and value (a Nystromformer-style mean; the
  module leaves such segments out).

  Returns (output [B, N, out], per-head weights [B, N_pad, m_h, S] and the
  matching landmark validity [B, m_h]).
  """
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  mask = np.asarray(mask, bool)
  batch, length, _ = x.shape
  seg = [round(1 / c) for c in rates]
  padded = -(-length // math.lcm(*seg)) * math.lcm(*seg)
  x = np.pad(x, [(0, 0), (0, padded - length), (0, 0)])
  mask = np.pad(mask, [(0, 0), (0, padded - length)])

  def dense(name, a):
    kernel = p[name]['kernel']
    if name == 'out':  # [S, d, out]
      kernel = kernel.reshape(-1, kernel.shape[-1])
    y = a @ kernel.reshape(kernel.shape[0], -1)
    if 'bias' in p[name]:
      y = y + p[name]['bias'].reshape(-1)
    return y

  q, k, v = dense('query', x), dense('key', x), dense('value', x)
  logits = q @ p['router']['kernel']
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  choice = probs.argmax(-1)
  gate = (np.take_along_axis(probs, choice[..., None], -1)[..., 0]
          if router_gate == 'prob' else np.ones(choice.shape))[..., None]

  def sub(name, a, h):
    if projections == 'single':
      return a.reshape(a.shape[:-1] + (SUBHEADS, -1))
    kernel = p[name]['kernel']
    bias = p[name].get('bias')
    if projections == 'stacked':
      kernel = kernel[h]
      bias = None if bias is None else bias[h]
    y = np.einsum('...e,esd->...sd', a, kernel)
    return y if bias is None else y + bias

  heads, all_weights = [], []
  for h, k_len in enumerate(seg):
    m = padded // k_len
    k_t = np.zeros((batch, m, k.shape[-1]))
    v_t = np.zeros_like(k_t)
    valid = np.zeros((batch, m), bool)
    for b in range(batch):
      for j in range(m):
        idx = slice(j * k_len, (j + 1) * k_len)
        real = mask[b, idx]
        if not real.any():
          valid[b, j] = keep_empty_segments
          continue
        valid[b, j] = True
        if segment_means == 'masked':
          k_t[b, j] = k[b, idx][real].mean(0)
          v_t[b, j] = v[b, idx][real].mean(0)
        else:
          k_t[b, j] = (k[b, idx] * real[:, None]).sum(0) / k_len
          v_t[b, j] = (v[b, idx] * real[:, None]).sum(0) / k_len
    phi_q = _feature(sub('subhead_query', q, h), feature_map)
    phi_k = _feature(sub('subhead_key', k_t, h), feature_map)
    v_h = sub('subhead_value', v_t, h)
    scores = np.einsum('bnsd,bmsd->bnms', phi_q, phi_k)
    scores = scores * valid[:, None, :, None]
    weights = scores / (scores.sum(2, keepdims=True) + eps)
    all_weights.append((weights, valid))
    heads.append(np.einsum('bnms,bmsd->bnsd', weights, v_h))
  heads = np.stack(heads, 2)  # [B, N, H, S, d]
  routed = np.take_along_axis(
      heads, choice[:, :, None, None, None], 2)[:, :, 0]
  if mixture:
    routed, gate = np.einsum('bnhsd,bnh->bnsd', heads, probs), 1.0
  y = gate * routed.reshape(batch, padded, -1)
  y = dense('out', y)
  y = np.where(mask[..., None], y, 0.0)
  return y[:, :length], all_weights


REFERENCE_CASES = [
    dict(projections='stacked', segment_means='masked', router_gate='prob'),
    dict(projections='stacked_shared', segment_means='unmasked',
         router_gate='hard'),
    dict(projections='single', segment_means='masked',
         router_gate='straight_through', feature_map='elu_plus_one'),
]


@pytest.mark.parametrize('case', REFERENCE_CASES,
                         ids=[c['projections'] for c in REFERENCE_CASES])
def test_matches_explicit_landmark_reference(case):
  rates = (1, 1 / 2, 1 / 4)
  module = _module(compression_rates=rates, use_bias=True,
                   bias_init=nn.initializers.normal(0.5), **case)
  x = _inputs(2, 13)
  mask = jnp.ones((2, 13), bool).at[1, 9:].set(False).at[0, 5].set(False)
  variables = _init(module, x, mask)
  y = _run(module, variables, x, mask)
  y_ref, weights = reference(variables['params'], x, mask, rates=rates, **case)
  np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-5)
  # Kernel weights over landmarks: non-negative, zero on landmarks without a
  # real token, and summing to 1 unless phi(q) . phi(k~) vanishes for every
  # landmark (then they are all ~0 and the output is 0).
  for w, valid in weights:
    assert w.min() >= 0.0
    assert np.all(w[~np.broadcast_to(valid[:, None, :, None], w.shape)] == 0)
    totals = w.sum(2)
    assert np.mean(totals > 1 - 1e-4) > 0.5
    assert np.all((np.abs(totals - 1) < 1e-4) | (totals < 1e-3))


def _directional_check(module, variables, x, mask, rates, case, only=None,
                       mixture=False, seed=0):
  """<grad of sum(w * y), d> against central differences of `reference`.

  The loss is linear in y, so for `mixture=True` the finite difference of the
  router-weighted mixture is exactly what `'straight_through'` passes back to
  the router. `only` restricts the direction to one parameter group.
  """
  params = variables['params']
  rng = np.random.RandomState(seed)
  y0 = np.asarray(_run(module, variables, x, mask))
  w = rng.standard_normal(y0.shape)
  d = jax.tree_util.tree_map_with_path(
      lambda path, a: (rng.standard_normal(a.shape)
                       if only is None or path[0].key == only
                       else np.zeros(a.shape)), params)
  grads = jax.jit(jax.grad(lambda p: jnp.sum(
      w * module.apply({'params': p}, x, padding_mask=mask))))(params)
  analytic = sum(float(np.sum(np.asarray(g, np.float64) * e)) for g, e in
                 zip(jax.tree.leaves(grads), jax.tree.leaves(d)))

  def loss(t):
    shifted = jax.tree.map(lambda a, e: np.asarray(a, np.float64) + t * e,
                           params, d)
    y, _ = reference(shifted, x, mask, rates=rates, mixture=mixture, **case)
    return float(np.sum(w * y))
  step = 1e-5
  numeric = (loss(step) - loss(-step)) / (2 * step)
  np.testing.assert_allclose(analytic, numeric, rtol=2e-3, atol=1e-3)
  return grads


@pytest.mark.parametrize('case', REFERENCE_CASES[:2] + [
    dict(projections='single', segment_means='masked', router_gate='prob',
         feature_map='elu_plus_one')], ids=['stacked', 'stacked_shared',
                                           'single'])
def test_gradients_match_finite_differences_of_reference(case):
  """Every parameter's gradient (routed-head layout, custom ReLU derivative)."""
  rates = (1, 1 / 2, 1 / 4)
  module = _module(compression_rates=rates, use_bias=True,
                   bias_init=nn.initializers.normal(0.5), **case)
  x = _inputs(2, 13, seed=3)
  mask = jnp.ones((2, 13), bool).at[1, 9:].set(False).at[0, 5].set(False)
  variables = _init(module, x, mask)
  _directional_check(module, variables, x, mask, rates, case)


@pytest.mark.parametrize('projections', ['stacked', 'single'])
def test_straight_through_gradients(projections):
  """Router: the soft mixture's gradient; other weights: the hard gate's."""
  rates = (1, 1 / 2, 1 / 4)
  case = dict(projections=projections, segment_means='masked',
              router_gate='straight_through')
  module = _module(compression_rates=rates, **case)
  x = _inputs(2, 12, seed=4)
  mask = jnp.ones((2, 12), bool).at[1, 8:].set(False)
  variables = _init(module, x, mask)
  st = _directional_check(module, variables, x, mask, rates, case,
                          only='router', mixture=True)
  hard = _module(compression_rates=rates, projections=projections,
                 router_gate='hard')
  rng = np.random.RandomState(0)
  w = rng.standard_normal((2, 12, FEATURES))
  hard_grads = jax.grad(lambda p: jnp.sum(
      w * hard.apply({'params': p}, x, padding_mask=mask)))(
          variables['params'])
  st_grads = jax.grad(lambda p: jnp.sum(
      w * module.apply({'params': p}, x, padding_mask=mask)))(
          variables['params'])
  for name in st_grads:
    if name not in ('router', 'query'):  # The router reads the queries.
      jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5,
                                     atol=1e-6),
                   st_grads[name], hard_grads[name])
  assert np.abs(np.asarray(st['router']['kernel'])).sum() > 0


def test_h1_c1_is_plain_relu_linear_attention():
  """H = 1, c = 1: no compression, no router effect.

  An invariant of docs/mechanisms/adamra.md §8.
  """
  x = _inputs(2, 10, seed=1)
  mask = jnp.ones((2, 10), bool).at[1, 7:].set(False)
  outs = []
  for gate in adamra.ROUTER_GATES:
    module = _module(compression_rates=(1,), router_gate=gate)
    variables = _init(module, x, mask)
    outs.append(_run(module, variables, x, mask))
  np.testing.assert_array_equal(outs[0], outs[1])
  np.testing.assert_array_equal(outs[0], outs[2])

  p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['params'])
  xs, m = np.asarray(x, np.float64), np.asarray(mask)
  q = xs @ p['query']['kernel']
  k = xs @ p['key']['kernel']
  v = xs @ p['value']['kernel']
  heads = []
  for s in range(SUBHEADS):
    qs = np.maximum(q @ p['subhead_query']['kernel'][0, :, s], 0)
    ks = np.maximum(k @ p['subhead_key']['kernel'][0, :, s], 0)
    vs = v @ p['subhead_value']['kernel'][0, :, s]
    scores = np.einsum('bid,bjd->bij', qs, ks) * m[:, None, :]  # O(N^2).
    heads.append(np.einsum('bij,bjd->bid', scores, vs)
                 / (scores.sum(-1, keepdims=True) + 1e-6))
  y = (np.stack(heads, 2).reshape(2, 10, FEATURES)
       @ p['out']['kernel'].reshape(FEATURES, -1))
  y = np.where(m[..., None], y, 0)
  np.testing.assert_allclose(outs[0], y, rtol=1e-4, atol=1e-5)


def test_each_real_query_uses_exactly_one_head():
  """Only the routed head's value maps influence a query's output."""
  module = _module(compression_rates=(1 / 2, 1 / 4, 1 / 8))
  x = _inputs(1, 16, seed=2)
  mask = jnp.ones((1, 16), bool).at[0, 12:].set(False)
  variables = _init(module, x, mask)
  _, state = _run(module, variables, x, mask, mutable=('intermediates',))
  probs = np.asarray(state['intermediates']['router_probs'][0])[0]
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)

  def output(value_kernel):
    params = dict(variables['params'])
    params['subhead_value'] = {'kernel': value_kernel}
    return _run(module, {'params': params}, x, mask)[0]
  kernel = variables['params']['subhead_value']['kernel']
  jac = jax.jit(jax.jacrev(output))(kernel)  # [N, out, H, qkv, S, d]
  influence = np.abs(np.asarray(jac)).sum(axis=(1, 3, 4, 5))  # [N, H]
  real = np.asarray(mask[0])
  used = influence > 0
  assert np.all(used[real].sum(-1) == 1)
  np.testing.assert_array_equal(used[real].argmax(-1),
                                probs[real].argmax(-1))
  assert not used[~real].any()
  # Routing is not degenerate here, so the test separates heads.
  assert len(set(probs[real].argmax(-1))) > 1


def _forced(head):
  """Intercepts the router so that every query picks `head`."""
  def interceptor(next_fun, args, kwargs, context):
    if context.module.name == 'router' and context.method_name == '__call__':
      logits = next_fun(*args, **kwargs)
      return jnp.where(jnp.arange(logits.shape[-1]) == head, 100.0, 0.0
                       ) * jnp.ones_like(logits)
    return next_fun(*args, **kwargs)
  return nn.intercept_methods(interceptor)


@pytest.mark.parametrize('gate', ['prob', 'hard'])
def test_forcing_the_router_reproduces_that_head_alone(gate):
  rates = (1 / 2, 1 / 4, 1 / 8)
  module = _module(compression_rates=rates, router_gate=gate, use_bias=True,
                   bias_init=nn.initializers.normal(0.5))
  x = _inputs(2, 14, seed=3)
  mask = jnp.ones((2, 14), bool).at[1, 10:].set(False)
  variables = _init(module, x, mask)
  for h, rate in enumerate(rates):
    with _forced(h):
      y = _run_fresh(module, variables, x, mask)
    single = _module(compression_rates=(rate,), router_gate=gate,
                     use_bias=True)
    params = dict(variables['params'])
    for name in ('subhead_query', 'subhead_key', 'subhead_value'):
      params[name] = jax.tree.map(lambda a: a[h:h + 1], params[name])
    params['router'] = {'kernel': params['router']['kernel'][:, h:h + 1]}
    y_single = _run(single, {'params': params}, x, mask)
    np.testing.assert_allclose(y, y_single, rtol=1e-5, atol=1e-6)


def test_segment_means_commute_with_affine_maps():
  x = _inputs(2, 16, seed=4, features=5)
  mask = jnp.asarray(np.random.RandomState(0).rand(2, 16) > 0.4)
  mask = mask.at[0, 8:12].set(False)  # One segment of 4 entirely padded.
  w = jax.random.normal(jax.random.PRNGKey(5), (5, 3))
  b = jax.random.normal(jax.random.PRNGKey(6), (3,))
  means_of = jax.jit(adamra.segment_means, static_argnums=(2, 3))
  for seg_len in (1, 2, 4, 8):
    lhs, valid = means_of(x @ w + b, mask, seg_len, 'masked')
    rhs, valid2 = means_of(x, mask, seg_len, 'masked')
    np.testing.assert_array_equal(valid, valid2)
    np.testing.assert_allclose(lhs[valid], (rhs @ w + b)[valid], rtol=1e-5,
                               atol=1e-5)
    assert bool(jnp.all(lhs[~valid] == 0))
    # Nystromformer means divide by the full length: linear maps commute.
    lhs, _ = means_of(x @ w, mask, seg_len, 'unmasked')
    rhs, _ = means_of(x, mask, seg_len, 'unmasked')
    np.testing.assert_allclose(lhs, rhs @ w, rtol=1e-5, atol=1e-5)
  _, valid = means_of(x, mask, 4, 'masked')
  assert not bool(valid[0, 2])


@pytest.mark.parametrize('head,perm_len,invariant', [
    (1, 4, True), (2, 8, True), (2, 4, True), (0, 8, False)])
def test_permutation_within_a_segment(head, perm_len, invariant):
  """Shuffling tokens inside head h's segments leaves its memory unchanged.

  Queries move with their tokens, so y(x[pi]) = y(x)[pi]. Shuffling inside
  segments longer than head h's changes its landmarks (negative control).
  """
  rates = (1 / 2, 1 / 4, 1 / 8)
  module = _module(compression_rates=rates, router_gate='hard')
  x = _inputs(1, 16, seed=7)
  mask = jnp.ones((1, 16), bool)
  variables = _init(module, x, mask)
  rng = np.random.RandomState(head)
  perm = np.concatenate([j + rng.permutation(perm_len)
                         for j in range(0, 16, perm_len)])
  with _forced(head):
    apply = jax.jit(lambda a: module.apply(variables, a, padding_mask=mask))
    y, y_perm = apply(x), apply(x[:, perm])
  close = np.allclose(y_perm, y[:, perm], rtol=1e-5, atol=1e-5)
  assert close == invariant


@pytest.mark.parametrize('feature_map', adamra.FEATURE_MAPS)
@pytest.mark.parametrize('mode', adamra.SEGMENT_MEANS)
def test_padding(mode, feature_map):
  module = _module(segment_means=mode, feature_map=feature_map, use_bias=True,
                   bias_init=nn.initializers.normal(0.5))
  x = _inputs(2, 40, seed=8)
  mask = jnp.arange(40)[None, :] < jnp.array([[9], [9]])
  variables = _init(module, x, mask)
  y = _run(module, variables, x, mask)
  # Padded queries are zero, even with output biases.
  assert bool(jnp.all(y[:, 9:] == 0))
  # Pad embeddings do not matter.
  x2 = jnp.where(mask[..., None], x, 50.0 * _inputs(2, 40, seed=9))
  np.testing.assert_allclose(_run(module, variables, x2, mask),
                             y, rtol=1e-5, atol=1e-6)
  # 40 tokens pad internally to 64, 9 tokens to 32: the extra segments hold
  # no real token and must add nothing.
  y_short = _run(module, variables, x[:, :9], mask[:, :9])
  np.testing.assert_allclose(y[:, :9], y_short, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('feature_map', adamra.FEATURE_MAPS)
def test_segments_of_internal_padding_are_left_out(feature_map):
  """'unmasked' means with no user padding: internal padding adds nothing.

  Rates (1, 1/4) pad 13 real tokens to 16, so the k = 1 head has three
  segments made only of internal padding. A Nystromformer-style mean keeps
  them as landmarks with zero key and value: harmless under ReLU (phi(0) =
  0), but under ELU + 1 phi(0) = 1 adds to every query's denominator, so the
  output would depend on how far the input was padded. The module leaves
  them out.
  """
  rates = (1, 1 / 4)
  case = dict(projections='stacked', segment_means='unmasked',
              router_gate='prob', feature_map=feature_map)
  module = _module(compression_rates=rates, **case)
  x = _inputs(2, 13, seed=12)
  mask = jnp.ones((2, 13), bool)
  variables = _init(module, x, mask)
  y = np.asarray(_run(module, variables, x, mask))
  left_out, _ = reference(variables['params'], x, mask, rates=rates, **case)
  kept, _ = reference(variables['params'], x, mask, rates=rates,
                      keep_empty_segments=True, **case)
  np.testing.assert_allclose(y, left_out, rtol=1e-4, atol=1e-5)
  gap = np.abs(kept - left_out).max()
  if feature_map == 'relu':
    assert gap < 1e-6
  else:
    assert gap > 1e-2  # the choice matters: queries routed to k = 1 see it.


def test_masked_and_unmasked_means_differ_only_with_partial_segments():
  x = _inputs(2, 16, seed=10)
  full = jnp.ones((2, 16), bool)
  partial = full.at[:, 13:].set(False)
  # Rates that tile 16 tokens, so a full mask leaves no internal padding.
  masked = _module(compression_rates=(1 / 2, 1 / 4))
  unmasked = _module(compression_rates=(1 / 2, 1 / 4),
                     segment_means='unmasked')
  variables = _init(masked, x, full)
  np.testing.assert_allclose(_run(masked, variables, x, full),
                             _run(unmasked, variables, x, full),
                             rtol=1e-5, atol=1e-6)
  assert not np.allclose(_run(masked, variables, x, partial),
                         _run(unmasked, variables, x, partial),
                         atol=1e-4)


def test_router_gradient_by_gate():
  x = _inputs(2, 16, seed=11)
  mask = jnp.ones((2, 16), bool).at[1, 12:].set(False)
  variables = _init(_module(), x, mask)
  outs, grads = {}, {}
  for gate in adamra.ROUTER_GATES:
    module = _module(router_gate=gate)

    def loss(params, module=module):
      y = module.apply({'params': params}, x, padding_mask=mask)
      return jnp.sum(jnp.sin(y)), y
    g, outs[gate] = jax.jit(jax.grad(loss, has_aux=True))(variables['params'])
    grads[gate] = np.abs(np.asarray(g['router']['kernel'])).sum()
    assert all(bool(jnp.all(jnp.isfinite(a)))
               for a in jax.tree_util.tree_leaves(g))
  assert grads['prob'] > 0
  assert grads['straight_through'] > 0
  assert grads['hard'] == 0
  np.testing.assert_array_equal(outs['straight_through'], outs['hard'])
  assert not np.allclose(outs['prob'], outs['hard'])


def _max_long_axes(jaxpr, n):
  """Largest number of axes of size >= n over every intermediate array."""
  worst = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      shape = getattr(var.aval, 'shape', ())
      worst = max(worst, sum(d >= n for d in shape))
    for param in eqn.params.values():
      subs = param if isinstance(param, (tuple, list)) else (param,)
      for sub in subs:
        if isinstance(sub, jex.core.ClosedJaxpr):
          worst = max(worst, _max_long_axes(sub.jaxpr, n))
        elif isinstance(sub, jex.core.Jaxpr):
          worst = max(worst, _max_long_axes(sub, n))
  return worst


@pytest.mark.parametrize('rates', [(1 / 2, 1 / 8, 1 / 32), (1, 1 / 2)])
def test_memory_is_linear_in_length(rates):
  n = 64
  x = _inputs(2, n, seed=12)
  mask = jnp.ones((2, n), bool).at[1, 40:].set(False)
  module = _module(compression_rates=rates, dropout_rate=0.1)
  variables = _init(module, x, mask)

  def loss(params, a):
    y = module.apply({'params': params}, a, padding_mask=mask,
                     deterministic=False,
                     rngs={'dropout': jax.random.PRNGKey(0)})
    return jnp.sum(y ** 2)
  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(
      variables['params'], x)
  assert _max_long_axes(jaxpr.jaxpr, n) == 1
  # The check does see an N x N array (softmax attention, same harness).
  dense = jax.make_jaxpr(lambda a: jnp.einsum('bnd,bmd->bnm', a, a))(x)
  assert _max_long_axes(dense.jaxpr, n) == 2


def test_route_fractions_are_sown_as_metrics():
  module = _module()
  x = _inputs(2, 24, seed=13)
  mask = jnp.ones((2, 24), bool).at[1, 10:].set(False)
  variables = _init(module, x, mask)
  assert set(variables) == {'params'}  # Nothing sown at init.
  _, state = _run(module, variables, x, mask,
                  mutable=('metrics', 'intermediates'))
  gate = np.asarray(state['intermediates']['gate'][0])[:, :24]  # Crop.
  real = np.asarray(mask)
  expected = [(gate[..., h] != 0)[real].mean() for h in range(3)]
  got = [float(state['metrics'][f'route_fraction/head_{h}'][0])
         for h in range(3)]
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  assert abs(sum(got) - 1) < 1e-6

  # Through the encoder, the trainer finds them per layer.
  encoder = models.Encoder(vocab_size=10, max_len=24, num_layers=2,
                           emb_dim=16, num_heads=2, qkv_dim=16, mlp_dim=16,
                           attention='adamra')
  ids = jnp.where(mask, 3, 0).astype(jnp.int32)
  params = jax.jit(lambda i: encoder.init(jax.random.PRNGKey(0), i,
                                          deterministic=True))(ids)
  _, sown = jax.jit(lambda p, i: encoder.apply(
      p, i, deterministic=True, mutable=['metrics']))(params, ids)
  # What the trainer logs. pylint: disable-next=protected-access
  logged = steps._sown_means(sown['metrics'])
  for layer in range(2):
    for h in range(3):
      assert f'block_{layer}/attention/route_fraction/head_{h}' in logged


def test_landmark_dropout_is_unbiased_and_keyed():
  module = _module(dropout_rate=0.3)
  x = _inputs(1, 32, seed=14)
  mask = jnp.ones((1, 32), bool).at[0, 28:].set(False)
  variables = _init(module, x, mask)
  y_det = _run(module, variables, x, mask)

  def sample(key):
    return module.apply(variables, x, padding_mask=mask, deterministic=False,
                        rngs={'dropout': key})
  keys = jax.random.split(jax.random.PRNGKey(0), 400)
  samples = jax.jit(jax.vmap(sample))(keys)
  assert not np.allclose(samples[0], y_det, atol=1e-4)
  assert not np.allclose(samples[0], samples[1], atol=1e-4)
  # Dropout acts on the numerator only, so outputs are unbiased.
  err = np.abs(np.asarray(samples.mean(0) - y_det)).mean()
  assert err < 0.1 * np.abs(np.asarray(y_det)).mean()
  assert bool(jnp.all(samples[:, :, 28:] == 0))


def test_parameter_counts_of_projection_layouts():
  x = _inputs(1, 8)
  d, h = FEATURES, 3
  expected = {'stacked': (4 + 3 * h) * d * d + d * h,
              'stacked_shared': 7 * d * d + d * h,
              'single': 4 * d * d + d * h}
  for layout, count in expected.items():
    variables = _init(_module(projections=layout), x, None)
    assert models.count_params(variables['params']) == count, layout


def test_causal_raises():
  with pytest.raises(NotImplementedError, match='causal=False'):
    _module(causal=True)


@pytest.mark.parametrize('kw', [
    dict(compression_rates=()), dict(compression_rates=(1 / 3.5,)),
    dict(compression_rates=(0.0,)), dict(compression_rates=(2,)),
    dict(router_gate='soft'), dict(segment_means='nystrom'),
    dict(projections='folded'), dict(feature_map='elu'),
    dict(epsilon=0.0)])
def test_bad_knobs_raise(kw):
  with pytest.raises(ValueError):
    _module(**kw)
