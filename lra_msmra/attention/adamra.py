"""Adaptive Multi-Resolution Attention (AdaMRA), registry entry `adamra`.

Paper: Y. Zhang, Y. Ma, T. Seidl, V. Tresp, "Adaptive Multi-Resolution
Attention with Linear Complexity", arXiv:2108.04962. No official code has
been released; this module is written from the paper alone.
docs/mechanisms/adamra.md §2, §3, §5, §7 and §8 give, in that order, the
equations, every choice made where the paper is silent, padding and
lengths, the layout of the computation and the invariants the tests check;
equation numbers below are the paper's.

1. Q, K, V = X W^Q, X W^K, X W^V (Eq. 1).
2. The router, softmax(Q W_r) `[B, N, H]` (Eq. 6), sends each query to one
   of the H = len(`compression_rates`) resolution heads (the argmax);
   `router_gate` decides how the router gets a gradient.
3. Head h averages K and V over segments of 1 / c_h tokens
   (`segment_means`, masked by default; a segment without a real token is
   left out). N is padded internally to a multiple of every segment length
   and cropped back.
4. Each head has S = `num_heads` subheads of width d = qkv_features / S with
   their own second-stage maps (Eq. 9; `projections` chooses how they are
   stored) and computes kernel linear attention (Eq. 7, φ = `feature_map`,
   ReLU by default):
   φ(q) . Σ_j φ(k_j) v_jᵀ / (φ(q) . Σ_j φ(k_j) + epsilon).
5. The routed head's subheads are concatenated, gated and projected by W^O
   (Eq. 8); `base.Attention` zeroes padded positions.

Layout (the function is that of computing every head for every query and
masking by the gate): the key side gives each head's small summaries
`[B, S, d, d]` and `[B, S, d]`; the query side is a scan over the heads
(`_routed`) that keeps each query's routed head by a select, so query-side
arrays are `[B, N, S, d]` and only one head's are alive at a time. ReLU
features differentiate from their output (`_relu`). `'straight_through'`
adds the unrouted heads' share of the router gradient in the backward pass
(`_tap_gate_gradient`). Dropout drops landmarks, in the numerator only.

Time and memory are linear in N; no array has two axes of size ~N. The
router, the segment sums and the kernel attention run in float32 under
bfloat16. The fraction of real tokens routed to each head is sown into
`metrics` (`route_fraction/head_{h}`), `router_probs` and `gate` into
`intermediates`. There is no causal form: `causal=True` raises
`NotImplementedError`.

`implementation='pallas'` computes the query side (the routed head's map,
features, summaries, normalisation and gate, forward and backward) as fused
Pallas kernels (`lra_msmra.kernels.adamra`), every knob value included; the
parameters, the router, the key-side summaries and the output projection
are the same code (docs/mechanisms/adamra.md §11).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base
from lra_msmra.kernels import adamra as routed_kernels
from lra_msmra.kernels import sequence_sums

Array = jax.Array

ROUTER_GATES = ('prob', 'hard', 'straight_through')
SEGMENT_MEANS = ('masked', 'unmasked')
PROJECTIONS = ('stacked', 'stacked_shared', 'single')
FEATURE_MAPS = ('relu', 'elu_plus_one')


def segment_lengths(compression_rates: Sequence[float]) -> tuple[int, ...]:
  """Returns k_h = 1 / c_h for each rate; raises ValueError if not integers."""
  rates = tuple(compression_rates)
  if not rates:
    raise ValueError('compression_rates is empty; give one rate per '
                     'resolution head, e.g. (1/2, 1/8, 1/32).')
  lengths = []
  for c in rates:
    if not 0.0 < float(c) <= 1.0:
      raise ValueError(f'compression rate {c} is not in (0, 1]; use rates '
                       '1/k with integer k >= 1.')
    k = round(1.0 / float(c))
    if abs(1.0 / float(c) - k) > 1e-6 * k:
      raise ValueError(f'compression rate {c}: 1/c = {1.0 / float(c):g} is '
                       'not an integer; use rates 1/k with integer k.')
    lengths.append(k)
  return tuple(lengths)


def segment_means(x: Array, padding_mask: Array, segment_length: int,
                  mode: str = 'masked') -> tuple[Array, Array]:
  """Means over non-overlapping segments of the length axis.

  Args:
    x: `[batch, length, ...]`; length must be a multiple of `segment_length`.
    padding_mask: bool `[batch, length]`, True = real token.
    segment_length: tokens per segment (k_h).
    mode: `'masked'` divides by the number of real tokens of the segment,
      `'unmasked'` zeroes padded tokens and divides by `segment_length`
      (Nystromformer).

  Returns:
    float32 means `[batch, length // segment_length, ...]` (zero for segments
    without a real token) and bool `valid` `[batch, length // segment_length]`
    (the segment has a real token).
  """
  if mode not in SEGMENT_MEANS:
    raise ValueError(f'segment_means={mode!r}; valid: {SEGMENT_MEANS}.')
  batch, length = x.shape[:2]
  if length % segment_length:
    raise ValueError(f'length {length} is not a multiple of segment length '
                     f'{segment_length}; pad first.')
  num = length // segment_length
  m = padding_mask.astype(jnp.float32).reshape(batch, num, segment_length)
  seg = x.astype(jnp.float32).reshape(
      (batch, num, segment_length) + x.shape[2:])
  m_b = m.reshape(m.shape + (1,) * (x.ndim - 2))
  sums = jnp.sum(seg * m_b, axis=2)
  count = jnp.sum(m, axis=2)
  if mode == 'masked':
    denom = jnp.maximum(count, 1.0)
  else:
    denom = jnp.full_like(count, float(segment_length))
  means = sums / denom.reshape(denom.shape + (1,) * (x.ndim - 2))
  return means, count > 0


@jax.custom_jvp
def _relu(x: Array) -> Array:
  """`jax.nn.relu` whose derivative reads the output, not the input.

  Same values and derivative (1 where x > 0, else 0, as `jax.nn.relu`), but
  the backward pass keeps only the features, which it needs anyway, instead
  of the pre-activations as well.
  """
  return jnp.maximum(x, 0)


@_relu.defjvp
def _relu_jvp(primals, tangents):
  y = _relu(primals[0])
  return y, jnp.where(y > 0, tangents[0], jnp.zeros_like(tangents[0]))


def _feature(x: Array, feature_map: str) -> Array:
  if feature_map == 'relu':
    return _relu(x)
  return jax.nn.elu(x) + 1.0


def _routed(choice: Array, fn: Callable[..., Any], per_head: Any,
            init: Any) -> Any:
  """`fn(per_head[h])` at the queries routed to h, one head at a time.

  A scan over the heads: step h computes `fn` of head h's slice of
  `per_head` for all queries and keeps it where `choice == h`. The result is
  exactly the routed head's value (a select, no arithmetic), the cotangent
  reaches the routed head only (as masking by a one-hot gate gives), and the
  scan keeps a single head's `[b, n, ...]` arrays alive at a time in both
  passes, where unrolled heads let XLA schedule all H of them together.

  Args:
    choice: int `[b, n]`, the routed head of each query.
    fn: maps one head's slice of `per_head` to a pytree of `[b, n, ...]`
      arrays with the structure and shapes of `init`.
    per_head: pytree of arrays with a leading axis H.
    init: pytree of `[b, n, ...]` arrays (overwritten at every query).

  Returns:
    The pytree of `init`, holding `fn(per_head[choice[b, n]])[b, n, ...]`.
  """
  def step(acc, head):
    h, params = head
    out = fn(params)
    pick = choice == h
    return jax.tree.map(
        lambda new, old: jnp.where(
            pick.reshape(pick.shape + (1,) * (new.ndim - 2)), new, old),
        out, acc), None
  num_heads = jax.tree.leaves(per_head)[0].shape[0]
  out, _ = jax.lax.scan(step, init, (jnp.arange(num_heads), per_head))
  return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _tap_gate_gradient(y: Array, gate: Array,
                       terms: tuple[tuple[Array, Array], ...],
                       epsilon: float) -> Array:
  """Identity on `y`; the backward pass gives `gate` the head outputs' share.

  With `terms[h]` = (num_h `[b, n, S, d]`, den_h `[b, n, S]`), the cotangent
  of `gate[..., h]` is sum_s (sum_v num_h dy) / (den_h + eps), what
  `y = sum_h num_h gate_h / (den_h + eps)` would give it; `terms` get none.
  """
  del gate, terms, epsilon
  return y


def _tap_gate_gradient_fwd(y, gate, terms, epsilon):
  del gate, epsilon
  return y, terms


def _tap_gate_gradient_bwd(epsilon, terms, g):
  d_gate = jnp.stack(
      [jnp.sum(jnp.einsum('bnsv,bnsv->bns', num, g) / (den + epsilon), -1)
       for num, den in terms], axis=-1)
  return g, d_gate, jax.tree.map(jnp.zeros_like, terms)


_tap_gate_gradient.defvjp(_tap_gate_gradient_fwd, _tap_gate_gradient_bwd)


def _stacked_init(init: Callable[..., Array], leading: int
                  ) -> Callable[..., Array]:
  """Initialises `[*lead, in, ...out]` as independent 2-D `[in, prod(out)]`.

  Matches how `nn.DenseGeneral` initialises a kernel with several output
  axes, once per head when `leading` is 1.
  """
  def f(key, shape, dtype=jnp.float32):
    lead, rest = shape[:leading], shape[leading:]
    flat = (rest[0], math.prod(rest[1:]))
    keys = jax.random.split(key, max(math.prod(lead), 1))
    mats = [init(k, flat, dtype).reshape(rest) for k in keys]
    return jnp.stack(mats).reshape(shape)
  return f


class SubheadProjection(nn.Module):
  """Eq. 9's second-stage maps `[..., in] -> [..., (H,) S, head_dim]`.

  Attributes:
    num_resolution_heads: H for per-head maps, None for maps shared by heads.
    num_subheads: S.
    head_dim: d_k = d_v.
  """
  num_resolution_heads: Optional[int]
  num_subheads: int
  head_dim: int
  use_bias: bool
  kernel_init: Callable[..., Array]
  bias_init: Callable[..., Array]
  dtype: Any

  @nn.compact
  def __call__(self, x: Array, head: Optional[int] = None,
               choice: Optional[Array] = None, weights: bool = False) -> Any:
    """Projects `x` with every head's map, with one head's, or per query.

    Args:
      x: `[..., in]`; `[b, n, in]` with `choice`.
      head: use head `head`'s map (per-head maps only).
      choice: int `[b, n]`; project each query with its routed head's map
        (per-head maps only; see `_routed`).
      weights: return the maps instead, for a fused kernel to apply.

    Returns:
      `[..., H, S, head_dim]` for all heads of per-head maps, else
      `[..., S, head_dim]`; with `weights`, the kernel `[(H,) in, S,
      head_dim]` and the bias `[(H,) S, head_dim]` (or None) in `dtype`.
    """
    out = (self.num_subheads, self.head_dim)
    lead = () if self.num_resolution_heads is None else (
        self.num_resolution_heads,)
    kernel = self.param('kernel', _stacked_init(self.kernel_init, len(lead)),
                        lead + (x.shape[-1],) + out, jnp.float32)
    bias = (self.param('bias', self.bias_init, lead + out, jnp.float32)
            if self.use_bias else None)
    kernel = kernel.astype(self.dtype)
    if weights:
      return kernel, None if bias is None else bias.astype(self.dtype)
    x = x.astype(self.dtype)
    if lead and choice is not None:
      def project(params):
        k, b = params
        y = jnp.einsum('...d,dsk->...sk', x, k)
        return y if b is None else y + b.astype(self.dtype)
      init = jnp.zeros(x.shape[:-1] + kernel.shape[-2:], self.dtype)
      return _routed(choice, project, (kernel, bias), init)
    if lead and head is not None:
      kernel = kernel[head]
      bias = None if bias is None else bias[head]
    if kernel.ndim == 4:
      y = jnp.einsum('...d,hdsk->...hsk', x, kernel)
    else:
      y = jnp.einsum('...d,dsk->...sk', x, kernel)
    if bias is not None:
      y = y + bias.astype(self.dtype)
    return y


class AdaMRAAttention(base.Attention):
  """Routed multi-resolution ReLU-kernel attention (see module docstring).

  Attributes:
    compression_rates: c_h of each resolution head (H = its length); 1 / c_h
      is the segment length of head h. The paper's Table 1 setting is
      (1/2, 1/8, 1/32).
    router_gate: `'prob'` (output scaled by the router probability, so the
      router learns), `'hard'` (paper's literal masking; no router gradient)
      or `'straight_through'` (hard forward, soft gradient).
    segment_means: `'masked'` (divide by real tokens) or `'unmasked'`
      (Nystromformer: divide by the segment length).
    projections: `'stacked'` (paper: per-head, per-subhead second-stage
      maps), `'stacked_shared'` (second-stage maps shared by heads) or
      `'single'` (one Q/K/V projection; parameter count of softmax attention
      plus the router).
    feature_map: `'relu'` (paper) or `'elu_plus_one'` (its ablation).
    epsilon: added to the kernel-attention denominator.
  """

  # Knob settings that reach each code path at a few tokens (the
  # contract tests run every one, bidirectional and causal).
  EXAMPLES = (
      ('default', {}),
      ('single_unmasked_st', {
          'projections': 'single', 'segment_means': 'unmasked',
          'router_gate': 'straight_through', 'compression_rates': (1, 0.25)}),
  )

  compression_rates: Sequence[float] = (1 / 2, 1 / 8, 1 / 32)
  router_gate: str = 'prob'
  segment_means: str = 'masked'
  projections: str = 'stacked'
  feature_map: str = 'relu'
  epsilon: float = 1e-6

  def check_knobs(self) -> None:
    segment_lengths(self.compression_rates)
    for field, value, valid in (
        ('router_gate', self.router_gate, ROUTER_GATES),
        ('segment_means', self.segment_means, SEGMENT_MEANS),
        ('projections', self.projections, PROJECTIONS),
        ('feature_map', self.feature_map, FEATURE_MAPS)):
      if value not in valid:
        raise ValueError(f'AdaMRAAttention: {field}={value!r}; valid: '
                         f'{valid}.')
    if not self.epsilon > 0:
      raise ValueError(f'AdaMRAAttention: epsilon={self.epsilon} must be > 0 '
                       '(ReLU features can make the denominator 0).')
    if self.causal:
      raise NotImplementedError(
          'AdaMRA has no causal form: the paper defines only bidirectional '
          'attention, and segment means of unfinished segments would leak '
          'future tokens. Use causal=False, or another mechanism for causal '
          'models.')

  def _dense(self, features: int, name: str) -> nn.Module:
    return nn.DenseGeneral(
        features=features, use_bias=self.use_bias,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        dtype=self.dtype, param_dtype=jnp.float32, name=name)

  def _subhead(self, head_dim: int, name: str) -> nn.Module:
    per_head = self.projections == 'stacked'
    return SubheadProjection(
        num_resolution_heads=len(self.compression_rates) if per_head else None,
        num_subheads=self.num_heads, head_dim=head_dim, use_bias=self.use_bias,
        kernel_init=self.kernel_init, bias_init=self.bias_init,
        dtype=self.dtype, name=name)

  def _route(self, q: Array, padding_mask: Array) -> tuple[Array, Array]:
    """Router (Eq. 6).

    Returns:
      The routed head of each query (int `[batch, length]`, the argmax) and
      the gate `[batch, length, H]` (float32; zero but for the routed head).
    """
    num_res = len(self.compression_rates)
    logits = nn.Dense(num_res, use_bias=False, kernel_init=self.kernel_init,
                      dtype=jnp.float32, param_dtype=jnp.float32,
                      name='router')(q.astype(jnp.float32))
    probs = jax.nn.softmax(logits, axis=-1)
    choice = jnp.argmax(probs, axis=-1)
    hard = jax.nn.one_hot(choice, num_res, dtype=jnp.float32)
    if self.router_gate == 'hard':
      gate = hard
    elif self.router_gate == 'prob':
      gate = hard * probs
    else:
      # Forward value is exactly `hard`; the gradient is that of `probs`.
      gate = hard + (probs - jax.lax.stop_gradient(probs))
    if not self.is_initializing():
      # For inspection (apply with mutable=['intermediates']) and the logs.
      self.sow('intermediates', 'router_probs', probs)
      self.sow('intermediates', 'gate', gate)
      real = padding_mask.astype(jnp.float32)
      total = jnp.maximum(jnp.sum(real), 1.0)
      for h in range(num_res):
        self.sow('metrics', f'route_fraction/head_{h}',
                 jnp.sum(hard[..., h] * real) / total)
    return choice, gate

  def _straight_through_term(
      self, y: Array, choice: Array, gate: Array,
      head_query: Callable[[int], Array],
      kernel_attention: Callable[[Array, int], tuple[Array, Array]],
      phi_q: Array) -> Array:
    """Adds the `'straight_through'` router gradient of the unrouted heads.

    With the soft gradient, every head's router probability gets
    <y_h, dy> = sum_s (sum_v num_h dy) / (den_h + eps), routed or not, where
    num_h, den_h are what head h computes for the query. The routed head's
    share comes with the selected output; `_tap_gate_gradient` adds the
    others in the backward pass, leaving the forward value of `y` untouched.
    The head outputs it reads are those dense-and-mask multiplies by a gate of
    value 0, which receive no gradient there either. Keeping them for the
    backward pass makes this gate cost H `[b, n, S, d]` arrays more memory
    than the other two.

    Args:
      y: the output `[b, n, S, d]` (float32).
      choice: routed head `[b, n]`.
      gate: `[b, n, H]`.
      head_query: h -> subhead queries of head h, `[b, n, S, d]`.
      kernel_attention: (phi(q), h) -> numerator and denominator of head h.
      phi_q: features of the routed head's queries `[b, n, S, d]`.

    Returns:
      `y`, unchanged in value.
    """
    terms = []
    for h in range(gate.shape[-1]):
      phi_h = phi_q
      if self.projections == 'stacked':
        # Head h's own queries; phi_q holds the routed head's.
        phi_h = _feature(head_query(h).astype(jnp.float32), self.feature_map)
      terms.append(jax.lax.stop_gradient(kernel_attention(phi_h, h)))
    unrouted = jnp.where(choice[..., None] == jnp.arange(gate.shape[-1]),
                         0.0, gate)
    return _tap_gate_gradient(y, unrouted, tuple(terms), self.epsilon)

  def _landmark_dropout(self, phi_k: Array, deterministic: bool,
                        drawn: int) -> Array:
    """Drops landmarks `[batch, m, S]`, shared by all queries; the mask is
    drawn for the first `drawn` segments (those beyond hold padding only,
    their features zero)."""
    if deterministic or self.dropout_rate == 0.0:
      return phi_k
    keep = 1.0 - self.dropout_rate
    batch, m, subheads = phi_k.shape[:3]
    mask = jax.random.bernoulli(self.make_rng('dropout'), keep,
                                (batch, drawn, subheads))
    mask = jnp.pad(mask, [(0, 0), (0, m - drawn), (0, 0)])
    return jnp.where(mask[..., None], phi_k / keep, 0.0)

  def _query_side_xla(self, q: Array, choice: Array, gate: Array,
                      kv: list[Array], z: list[Array],
                      head_query: Callable[[int], Array],
                      sub_q: Optional[nn.Module]) -> Array:
    """Each query against its routed head's summaries `kv`, `z`, gated.

    Only the routed head, selected per query (see the module docstring),
    so these arrays are `[b, n, S, d]` rather than `[b, n, H, ...]`.
    `sub_q` is the stacked subhead map (None otherwise).
    """
    if sub_q is not None:
      q_sel = sub_q(q, choice=choice)
    else:
      q_sel = head_query(0)  # The same for every head.
    phi_q = _feature(q_sel.astype(jnp.float32), self.feature_map)
    num, den = _routed(
        choice,
        lambda kv_z: (jnp.einsum('bnsk,bskv->bnsv', phi_q, kv_z[0]),
                      jnp.einsum('bnsk,bsk->bns', phi_q, kv_z[1])),
        (jnp.stack(kv), jnp.stack(z)),
        (jnp.zeros_like(phi_q), jnp.zeros(phi_q.shape[:-1], jnp.float32)))
    gate_sel = jnp.take_along_axis(gate, choice[..., None], axis=-1)[..., 0]
    # As dense-and-mask computes it: gate / (den + eps), times the numerator.
    y = num * (gate_sel[..., None] / (den + self.epsilon))[..., None]
    if self.router_gate == 'straight_through':

      def kernel_attention(phi: Array, h: int) -> tuple[Array, Array]:
        """Numerator `[b, n, S, d]` and denominator `[b, n, S]` of head
        h."""
        return (jnp.einsum('bnsk,bskv->bnsv', phi, kv[h]),
                jnp.einsum('bnsk,bsk->bns', phi, z[h]))

      y = self._straight_through_term(y, choice, gate, head_query,
                                      kernel_attention, phi_q)
    return y

  def _query_side_pallas(self, q: Array, choice: Array, gate: Array,
                         kv: list[Array], z: list[Array],
                         head_query: Callable[[int], Array],
                         sub_q: Optional[nn.Module]) -> Array:
    """The query side as fused kernels.

    `lra_msmra.kernels.adamra.routed_attention`: per tile of queries, the
    routed head's map (`'stacked'`), features, summaries, normalisation and
    gate, and its backward pass; the same function as `_query_side_xla`,
    straight-through router gradient included.
    """
    if sub_q is not None:
      weight, bias = sub_q(q, weights=True)
      q_in = q
    else:
      weight = bias = None
      q_in = head_query(0)  # The same for every head.
    return routed_kernels.routed_attention(
        q_in, jnp.stack(kv, axis=1), jnp.stack(z, axis=1), choice, gate,
        weight=weight, bias=bias, feature_map=self.feature_map,
        epsilon=self.epsilon,
        all_gate_gradients=self.router_gate == 'straight_through')

  def _length_xla(self, x: Array, multiple: int) -> int:
    """The padded length: whole segments of every head."""
    return -(-x.shape[1] // multiple) * multiple

  def _length_pallas(self, x: Array, multiple: int) -> int:
    """The padded length: whole segments and whole query tiles
    (`lra_msmra.kernels.adamra.padded_length`)."""
    return routed_kernels.padded_length(
        x.shape[1], multiple, head_dim=self.head_dims(x).head_dim,
        dtype=self.dtype)

  def _weighted_sums_xla(self, w: Array, x: Array) -> Array:
    """`[b, m, S, k]` features of `[b, m, S, v]` values -> `[b, S, k, v]`,
    summed over the segments."""
    return jnp.einsum('bmsk,bmsv->bskv', w, x)

  def _weighted_sums_pallas(self, w: Array, x: Array) -> Array:
    """The same sums in the GPU's form: a fused multiply-reduce, without
    the transposed copies a matrix product makes in the model's layout
    (`lra_msmra.kernels.sequence_sums`)."""
    return sequence_sums.weighted_sums(w, x)

  # The kernel switch (`base.Attention.KERNELS`).
  KERNELS = {'xla': {'query_side': _query_side_xla,
                     'length': _length_xla,
                     'weighted_sums': _weighted_sums_xla},
             'pallas': {'query_side': _query_side_pallas,
                        'length': _length_pallas,
                        'weighted_sums': _weighted_sums_pallas}}

  @nn.compact
  def attend(self, x: Array, *, padding_mask: Array,
             deterministic: bool) -> Array:
    """Applies AdaMRA; see `base.Attention.attend`.

    `deterministic` disables landmark dropout.
    """
    qkv, head_dim, out_features = self.head_dims(x)
    lengths = segment_lengths(self.compression_rates)
    multiple = math.lcm(*lengths)
    length = x.shape[1]
    # Padded once for the whole layer: to whole segments of every head,
    # and for the kernels to their query tile too.
    x, mask = base.pad_to_length(x, padding_mask,
                                 self.kernel('length')(x, multiple))
    # Landmark dropout draws for the segments of whole segments only, so
    # that both implementations drop the same landmarks.
    drawn = -(-length // multiple) * multiple
    x = x.astype(self.dtype)
    batch, padded_len = x.shape[:2]

    # First stage (Eq. 1); with 'single' it is the only stage.
    if self.projections == 'single':
      q, k, v = self.project_qkv(x)  # [b, n, S, d]
      router_in = q.reshape(batch, padded_len, qkv)
    else:
      q = self._dense(qkv, 'query')(x)  # [b, n, qkv]
      k = self._dense(qkv, 'key')(x)
      v = self._dense(qkv, 'value')(x)
      router_in = q
    choice, gate = self._route(router_in, mask)  # [b, n], [b, n, H]

    # Key side: every head's summaries sum_j phi(k~_j) v~_j^T and
    # sum_j phi(k~_j), small arrays without a length axis.
    if self.projections != 'single':
      sub_q = self._subhead(head_dim, 'subhead_query')
      sub_k = self._subhead(head_dim, 'subhead_key')
      sub_v = self._subhead(head_dim, 'subhead_value')
    kv, z = [], []
    for h, seg_len in enumerate(lengths):
      k_h, valid = segment_means(k, mask, seg_len, self.segment_means)
      v_h, _ = segment_means(v, mask, seg_len, self.segment_means)
      k_h, v_h = k_h.astype(self.dtype), v_h.astype(self.dtype)
      if self.projections != 'single':
        head = h if self.projections == 'stacked' else None
        k_h, v_h = sub_k(k_h, head), sub_v(v_h, head)  # [b, m, S, d]
      phi_k = _feature(k_h.astype(jnp.float32), self.feature_map)
      # Segments without a real token take no part (also for ELU + 1).
      phi_k = jnp.where(valid[:, :, None, None], phi_k, 0.0)
      v_h = jnp.where(valid[:, :, None, None], v_h, 0)
      z.append(jnp.sum(phi_k, axis=1))  # [b, S, d]
      phi_k_num = self._landmark_dropout(phi_k, deterministic,
                                         drawn // seg_len)
      kv.append(self.kernel('weighted_sums')(
          phi_k_num, v_h.astype(jnp.float32)))  # [b, S, d, d]

    def head_query(h: int) -> Array:
      """Subhead queries of head h, `[b, n, S, d]`."""
      if self.projections == 'single':
        return q
      return sub_q(q, h if self.projections == 'stacked' else None)

    y = self.kernel('query_side')(
        q, choice, gate, kv, z, head_query,
        sub_q if self.projections == 'stacked' else None)
    y = y.astype(self.dtype)
    y = self.output_projection(out_features)(y)
    return y[:, :length]
