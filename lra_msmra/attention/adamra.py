"""Adaptive Multi-Resolution Attention (AdaMRA), registry entry `adamra`.

Paper: Y. Zhang, Y. Ma, T. Seidl, V. Tresp, "Adaptive Multi-Resolution
Attention with Linear Complexity", arXiv:2108.04962. No official code has been
released, so this module is the reference implementation of the project and
every choice the paper leaves open is listed below.

The mechanism (paper §3.2, Eqs. 1 and 6-9):

1. Q = X W^Q, K = X W^K, V = X W^V.
2. A router P = softmax(Q W_r) `[batch, length, H]` sends every query to the
   one resolution head with the highest probability.
3. Resolution head h compresses K and V by means over non-overlapping segments
   of k_h = 1 / c_h tokens (its compression rate c_h), leaving N c_h landmarks.
4. Each head has S subheads with their own projections W^Q_{h,s}, W^K_{h,s},
   W^V_{h,s} (width d = qkv / S) and computes ReLU-kernel linear attention
   (Eq. 7): out(i) = phi(q_i) . sum_j phi(k~_j) v~_j^T /
   (phi(q_i) . sum_j phi(k~_j) + eps), phi = ReLU.
5. The subheads are concatenated, the routed head's output is kept, and W^O
   projects it back.

Time and memory are linear in N: no array has two axes of size ~N (the
largest are `[batch, length, S, head_dim]`, the size of an activation).

Choices where the paper is silent, or where we depart from it
(docs/mechanisms/adamra.md §3):

* Heads. `num_heads` (the contract field) is S, the number of subheads per
  resolution head, so `head_dim = qkv_features / num_heads` = d_k = d_v as in
  the paper (S d_k = S d_v = d). The number of resolution heads H is
  `len(compression_rates)`. S is not reported; the `xiong` configs use S = 2,
  d = 32 (the 2 x 32 heads of that protocol).
* Rates. `compression_rates` are the c_h; each 1 / c_h must be an integer.
  Equal rates are allowed (ablation rows 9-10 of the paper's Table 4).
* Projections (`projections`), since Eq. 1 followed by Eq. 9 stacks two maps:
  - `'stacked'` (default, the paper as written): W^Q, W^K, W^V, then a
    separate W^{Q,K,V}_{h,s} for every head and subhead. Attention parameters
    (biases aside): (4 + 3H) D^2 + D H, i.e. 13 D^2 for H = 3, against 4 D^2
    for softmax attention.
  - `'stacked_shared'`: the second-stage maps W^{Q,K,V}_s are shared by all
    resolution heads (the reference's `share_subhead_proj_across_heads`);
    7 D^2 + D H.
  - `'single'`: one Q, K, V projection split into S subheads. With shared
    second-stage maps the two stacked linear maps compose into one, so this is
    `'stacked_shared'` with the product folded into a single matrix (the same
    function class, fewer parameters): 4 D^2 + D H, the softmax count plus the
    router. The LRA-protocol configs use it where the stacked forms exceed
    110% of the LRA Transformer's parameter count.
  With unequal widths the first stage maps features -> qkv_features, the
  second qkv_features -> S x head_dim, and W^O qkv_features -> out_features.
* Router. It reads the projected query Q (the paper's "token representation
  q_i"; with `'single'` the concatenated subhead queries), is linear without
  bias (Eq. 6), uses `kernel_init`, and runs in float32. Ties of the argmax go
  to the lowest head index. No load-balancing loss is added (none in the
  paper); the fraction of real tokens routed to each head is sown into the
  `metrics` collection as `route_fraction/head_{h}` so head collapse shows in
  the training logs.
* Router gradient (`router_gate`). The paper masks out tokens not routed to a
  head, which gives W_r no gradient, yet learned routing beats random routing
  in its Table 5. `'prob'` (default, Switch-Transformer style) scales the
  routed head's output by its router probability; `'hard'` is the literal
  mask (the router does not learn); `'straight_through'` uses the hard mask
  forward and the gradient of `'prob'`'s soft weights backward.
* Evaluation (layout only; the function is that of computing every head for
  every query and masking by the gate). The key side gives every head's small
  summaries sum_j phi(k~_j) v~_j^T `[b, S, d, d]` and sum_j phi(k~_j)
  `[b, S, d]`. The query side keeps only the routed head: a scan over the
  heads (`_routed`) projects all queries with head h's map (`'stacked'`),
  then applies head h's summaries to the routed features, and keeps the
  result where the query chose h, by a select. So the query-side arrays are
  `[b, n, S, d]`, not `[b, n, H, S, d]`, and only one head's are alive at a
  time in either pass; the work is still H times that of the routed queries
  alone (static shapes, no gather or scatter). The cotangent reaches only the
  routed head, as the one-hot mask gives. ReLU features differentiate from
  their output (`_relu`), so the backward pass keeps phi(q) and not q as
  well. `'straight_through'` also gives the router the outputs of the
  unrouted heads, so it keeps H more `[b, n, S, d]` arrays for the backward
  pass (`_tap_gate_gradient`).
* Segment means (`segment_means`). `'masked'` (default) divides by the number
  of real tokens in the segment. `'unmasked'` reproduces the Nystromformer
  code the paper cites: keys and values are multiplied by the padding mask
  and divided by the full segment length, so padding dilutes the means (we
  zero V as well as K, otherwise padded tokens would leak into real outputs).
  In both modes a segment without a real token is excluded: its phi(k~) and
  v~ are zero, so it adds nothing to the numerator or the denominator.
* Order. Segment means are taken of the first-stage K, V and the subhead maps
  are applied to the landmarks: means commute with affine maps (bias
  included, masked mode), and m_h < N makes this the cheaper order.
* Kernel. phi = ReLU (`feature_map='relu'`; `'elu_plus_one'` is the paper's
  ELU + 1 ablation). No 1 / sqrt(d) scaling (ReLU is positively homogeneous,
  so it would cancel). `epsilon` = 1e-6 is added to the denominator (not in
  the paper) because ReLU can make it exactly 0; such a query outputs 0.
* Lengths. N is right-padded internally to a multiple of lcm(k_h) (the paper:
  "we can pad inputs"), the added positions are masked, and the output is
  cropped back.
* Padded queries. Their outputs are zeroed (after W^O, bias included).
* Dropout. No attention matrix exists, so `dropout_rate` drops landmarks: the
  kernel weight of landmark j (per example, subhead and head, shared by all
  queries) is zeroed with probability `dropout_rate` and the survivors are
  scaled by 1 / keep, in the numerator only, as dropout on softmax
  probabilities does after normalisation.
* Causal. The paper defines no causal form; `causal=True` raises
  `NotImplementedError`.
* Initialisation is not stated: `kernel_init` / `bias_init` of the contract,
  applied to each head's second-stage map as one [in, S x head_dim] matrix
  (like `nn.DenseGeneral`). `use_bias` applies to every projection except the
  router.
* Numerics. Parameters are float32. With dtype=bfloat16 the projections run
  in bfloat16, while the router softmax, the segment sums and the kernel
  attention itself (features, sum_j phi(k~_j) v~_j^T, the normaliser, the
  numerator and the denominator) run in float32, the role softmax plays in
  the other mechanisms (the CPU backend also lacks bf16 x bf16 -> f32 dots).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lra_msmra.attention import base

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
               choice: Optional[Array] = None) -> Array:
    """Projects `x` with every head's map, with one head's, or per query.

    Args:
      x: `[..., in]`; `[b, n, in]` with `choice`.
      head: use head `head`'s map (per-head maps only).
      choice: int `[b, n]`; project each query with its routed head's map
        (per-head maps only; see `_routed`).

    Returns:
      `[..., H, S, head_dim]` for all heads of per-head maps, else
      `[..., S, head_dim]`.
    """
    out = (self.num_subheads, self.head_dim)
    lead = () if self.num_resolution_heads is None else (
        self.num_resolution_heads,)
    kernel = self.param('kernel', _stacked_init(self.kernel_init, len(lead)),
                        lead + (x.shape[-1],) + out, jnp.float32)
    bias = (self.param('bias', self.bias_init, lead + out, jnp.float32)
            if self.use_bias else None)
    kernel = kernel.astype(self.dtype)
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
  compression_rates: Sequence[float] = (1 / 2, 1 / 8, 1 / 32)
  router_gate: str = 'prob'
  segment_means: str = 'masked'
  projections: str = 'stacked'
  feature_map: str = 'relu'
  epsilon: float = 1e-6

  def __post_init__(self):
    super().__post_init__()
    # Checked at construction so that config validation reports bad knobs.
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

  def _landmark_dropout(self, phi_k: Array, deterministic: bool) -> Array:
    """Drops landmarks `[batch, m, S]`, shared by all queries."""
    if deterministic or self.dropout_rate == 0.0:
      return phi_k
    keep = 1.0 - self.dropout_rate
    mask = jax.random.bernoulli(self.make_rng('dropout'), keep,
                                phi_k.shape[:3])
    return jnp.where(mask[..., None], phi_k / keep, 0.0)

  @nn.compact
  def __call__(self, x: Array, *, padding_mask: Optional[Array] = None,
               deterministic: bool = True) -> Array:
    """Applies AdaMRA.

    Args:
      x: `[batch, length, features]`.
      padding_mask: bool `[batch, length]`, True = real token; None = all real.
      deterministic: disables landmark dropout.

    Returns:
      `[batch, length, out_features]`, zero at padded positions.
    """
    padding_mask = base.default_padding_mask(x, padding_mask)
    qkv, head_dim, out_features = self.head_dims(x)
    lengths = segment_lengths(self.compression_rates)
    x, mask, length = base.pad_to_multiple(x, padding_mask,
                                           math.lcm(*lengths))
    x = x.astype(self.dtype)
    batch, padded_len = x.shape[:2]

    # First stage (Eq. 1); with 'single' it is the only stage.
    if self.projections == 'single':
      q = self.projection(head_dim, 'query')(x)  # [b, n, S, d]
      k = self.projection(head_dim, 'key')(x)
      v = self.projection(head_dim, 'value')(x)
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
      phi_k_num = self._landmark_dropout(phi_k, deterministic)
      kv.append(jnp.einsum('bmsk,bmsv->bskv', phi_k_num,
                           v_h.astype(jnp.float32)))  # [b, S, d, d]

    def head_query(h: int) -> Array:
      """Subhead queries of head h, `[b, n, S, d]`."""
      if self.projections == 'single':
        return q
      return sub_q(q, h if self.projections == 'stacked' else None)

    def kernel_attention(phi_q: Array, h: int) -> tuple[Array, Array]:
      """Numerator `[b, n, S, d]` and denominator `[b, n, S]` of head h."""
      return (jnp.einsum('bnsk,bskv->bnsv', phi_q, kv[h]),
              jnp.einsum('bnsk,bsk->bns', phi_q, z[h]))

    # Query side: only the routed head, selected per query (see the module
    # docstring), so these arrays are [b, n, S, d] rather than [b, n, H, ...].
    if self.projections == 'stacked':
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
      y = self._straight_through_term(
          y, choice, gate, head_query, kernel_attention, phi_q)
    y = y.astype(self.dtype)
    y = self.output_projection(out_features)(y)
    y = jnp.where(mask[..., None], y, 0).astype(self.dtype)
    return y[:, :length]
