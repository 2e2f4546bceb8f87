"""Straightforward PyTorch versions of the mechanisms, for speed comparison.

Optional: PyTorch is not a dependency of the project. The attention
benchmark imports this module only in its PyTorch worker processes, and
skips the comparison with a note when `import torch` fails.

Each function computes the same thing as the JAX layer of the same name with
the same parameters (bidirectional, float32, no dropout, biases off as in the
LRA configs), written the plain way: `torch.einsum` for every product, a
masked softmax, reshapes for slices/blocks/segments. The benchmark checks
this at a short length on every run (the output of both on the same weights
and a partly padded batch; `max_abs_diff` in the report), so a speed
comparison never compares different computations.

Only the knobs needed for the mechanisms' default settings and their main
size knobs are covered; `build` raises `NotImplementedError` naming the knob
otherwise, and the benchmark records the comparison as unsupported.
Lengths must be multiples of the slice/segment/block sizes (the JAX layers
pad internally; these do not).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

Tensor = torch.Tensor
Fn = Callable[[Tensor, Tensor], Tensor]

# Logit of a masked entry in the LRA softmax baseline.
_LRA_MASK_BIAS = -1e10


def safe_softmax(logits: Tensor, valid: Tensor, dim: int = -1) -> Tensor:
  """Softmax over valid entries; rows without one give zeros."""
  masked = logits.masked_fill(~valid, float('-inf'))
  row_max = masked.amax(dim, keepdim=True)
  row_max = torch.where(torch.isfinite(row_max), row_max,
                        torch.zeros_like(row_max)).detach()
  unnorm = torch.exp(masked - row_max)
  total = unnorm.sum(dim, keepdim=True)
  return unnorm / torch.where(total > 0, total, torch.ones_like(total))


def _require(n: int, multiple: int, what: str) -> None:
  if n % multiple:
    raise NotImplementedError(
        f'The PyTorch reference needs the length ({n}) to be a multiple of '
        f'the {what} ({multiple}); the JAX layer pads internally.')


def _check_knobs(name: str, kw: Mapping[str, Any],
                 allowed: Mapping[str, Any]) -> dict[str, Any]:
  """Returns knobs with defaults; raises on knobs the reference lacks.

  `allowed` maps a knob to its default, or to a tuple ('only', values...)
  when the reference supports only those values.
  """
  out = {}
  for key, value in kw.items():
    if key not in allowed:
      raise NotImplementedError(
          f'The PyTorch reference of {name} does not implement knob {key!r}.')
  for key, spec in allowed.items():
    if isinstance(spec, tuple) and spec and spec[0] == 'only':
      value = kw.get(key, spec[1])
      if value not in spec[1:]:
        raise NotImplementedError(
            f'The PyTorch reference of {name} supports {key} in '
            f'{list(spec[1:])}, not {value!r}.')
      out[key] = value
    else:
      out[key] = kw.get(key, spec)
  return out


def _proj(x: Tensor, kernel: Tensor) -> Tensor:
  """`[..., features] x [features, heads, head_dim]`."""
  return torch.einsum('...f,fhd->...hd', x, kernel)


def _out(y: Tensor, kernel: Tensor) -> Tensor:
  """`[..., heads, head_dim] x [heads, head_dim, features]`."""
  return torch.einsum('...hd,hdf->...f', y, kernel)


# ---------------------------------------------------------------- softmax


def _softmax(p: Mapping[str, Tensor]) -> Fn:
  def fn(x, mask):
    head_dim = p['query'].shape[-1]
    q = _proj(x, p['query']) / math.sqrt(head_dim)
    k, v = _proj(x, p['key']), _proj(x, p['value'])
    logits = torch.einsum('bqhd,bkhd->bhqk', q, k)
    valid = mask[:, None, :, None] & mask[:, None, None, :]
    probs = torch.softmax(logits.masked_fill(~valid, _LRA_MASK_BIAS), -1)
    return _out(torch.einsum('bhqk,bkhd->bqhd', probs, v), p['out'])
  return fn


# -------------------------------------------------------------------- cst


def _extend(t: Tensor, width: int) -> Tensor:
  """`[B, n, L, ...]` -> `[B, n, L + 2 width, ...]`, zeros at the ends."""
  if width == 0:
    return t
  zeros = torch.zeros_like(t[:, :1, :width])
  left = torch.cat([zeros, t[:, :-1, t.shape[2] - width:]], 1)
  right = torch.cat([t[:, 1:, :width], zeros], 1)
  return torch.cat([left, t, right], 2)


def _cst(p: Mapping[str, Tensor], shared: Mapping[str, Tensor],
         kw: Mapping[str, Any]) -> Fn:
  size, alpha = kw['slice_length'], kw['alpha']
  width = (alpha - 1) * size // 2

  def fn(x, mask):
    batch, length, features = x.shape
    _require(length, size, 'slice length')
    slices = length // size
    head_dim = p['query'].shape[-1]
    scale = math.sqrt(head_dim)
    xs = x.reshape(batch, slices, size, features)
    ms = mask.reshape(batch, slices, size)
    # Local attention inside (extended) slices; tables on Q and K inputs.
    pos = shared['local']
    q = _proj(xs, p['query']) + _proj(pos[width:width + size], p['query'])
    k = _extend(_proj(xs, p['key']), width) + _proj(pos, p['key'])
    v = _extend(_proj(xs, p['value']), width)
    key_mask = _extend(ms, width)
    logits = torch.einsum('bsqhd,bskhd->bshqk', q / scale, k)
    probs = safe_softmax(logits, key_mask[:, :, None, None, :])
    y_local = _out(torch.einsum('bshqk,bskhd->bsqhd', probs, v), p['out'])
    # Masked slice means, then attention among them.
    m = ms[..., None].to(x.dtype)
    emb = (y_local * m).sum(2) / m.sum(2).clamp(min=1.0)
    qk_in = emb + shared['global'][:slices]
    gq = _proj(qk_in, p['query']) / scale
    gk, gv = _proj(qk_in, p['key']), _proj(emb, p['value'])
    glogits = torch.einsum('bqhd,bkhd->bhqk', gq, gk)
    gprobs = safe_softmax(glogits, ms.any(-1)[:, None, None, :])
    y_global = _out(torch.einsum('bhqk,bkhd->bqhd', gprobs, gv), p['out'])
    y = (y_local + y_global[:, :, None]).reshape(batch, length, features)
    return y * mask[..., None].to(y.dtype)
  return fn


# ------------------------------------------------------------- long_short


def _tiles(a: Tensor, size: int, ext: int, fill: float) -> Tensor:
  """`[B, G * size, ...]` -> `[B, G, size + 2 ext, ...]` overlapping tiles."""
  batch, length = a.shape[:2]
  blocks = a.reshape((batch, length // size, size) + tuple(a.shape[2:]))
  edge = torch.full((batch, 1, ext) + tuple(a.shape[2:]), fill,
                    dtype=a.dtype)
  left = torch.cat([edge, blocks[:, :-1, size - ext:]], 1)
  right = torch.cat([blocks[:, 1:, :ext], edge], 1)
  return torch.cat([left, blocks, right], 2)


def _long_short(p: Mapping[str, Tensor], kw: Mapping[str, Any]) -> Fn:
  w, r = kw['window_size'], kw['num_landmarks']
  if w < 1 or r < 1:
    raise NotImplementedError('The PyTorch reference of long_short needs '
                              'window_size >= 1 and num_landmarks >= 1.')
  ext = max(w // 2, 1)

  def ln(t, name):
    return F.layer_norm(t, t.shape[-2:], p[name + '/scale'],
                        p[name + '/bias'], eps=1e-5)

  def fn(x, mask):
    batch, length, _ = x.shape
    _require(length, w, 'window size')
    heads, head_dim = p['query'].shape[1:]
    q = _proj(x, p['query']) / math.sqrt(head_dim)
    k = ln(_proj(x, p['key']), 'ln_local')
    v = ln(_proj(x, p['value']), 'ln_local')
    # Dynamic projection: softmax over the sequence axis.
    scores = torch.einsum('bnf,fhr->bnhr', x, p['landmark_scores'])
    proj = safe_softmax(scores, mask[:, :, None, None], dim=1)
    k_bar = ln(torch.einsum('bnhr,bnhd->brhd', proj, k), 'ln_global')
    v_bar = ln(torch.einsum('bnhr,bnhd->brhd', proj, v), 'ln_global')
    long_logits = torch.einsum('bnhd,brhd->bhnr', q, k_bar)
    # Segment-wise window of w + 2 ext keys.
    groups, slots = length // w, w + 2 * ext
    q_tiles = q.reshape(batch, groups, w, heads, head_dim)
    k_tiles, v_tiles = _tiles(k, w, ext, 0.0), _tiles(v, w, ext, 0.0)
    m_tiles = _tiles(mask, w, ext, False)
    win = torch.einsum('bgqhd,bgkhd->bhgqk', q_tiles, k_tiles)
    win = win.reshape(batch, heads, length, slots)
    win_valid = m_tiles[:, None, :, None, :].expand(
        batch, 1, groups, w, slots).reshape(batch, 1, length, slots)
    valid = torch.cat([torch.ones(batch, 1, length, r, dtype=torch.bool),
                       win_valid], -1)
    probs = safe_softmax(torch.cat([long_logits, win], -1), valid)
    probs = probs * mask[:, None, :, None].to(probs.dtype)
    out = torch.einsum('bhnr,brhd->bnhd', probs[..., :r], v_bar)
    win_probs = probs[..., r:].reshape(batch, heads, groups, w, slots)
    out = out + torch.einsum('bhgqk,bgkhd->bgqhd', win_probs,
                             v_tiles).reshape(batch, length, heads, head_dim)
    y = _out(out, p['out'])
    return y * mask[..., None].to(y.dtype)
  return fn


# ----------------------------------------------------------------- adamra


def _adamra(p: Mapping[str, Tensor], kw: Mapping[str, Any]) -> Fn:
  lengths = [round(1.0 / float(c)) for c in kw['compression_rates']]
  gate_mode, eps = kw['router_gate'], kw['epsilon']

  def fn(x, mask):
    batch, length, _ = x.shape
    _require(length, math.lcm(*lengths), 'segment lengths\' lcm')
    q = x @ p['query']
    k = x @ p['key']
    v = x @ p['value']
    probs = torch.softmax(q @ p['router'], -1)
    hard = F.one_hot(probs.argmax(-1), len(lengths)).to(x.dtype)
    gate = hard * probs if gate_mode == 'prob' else hard
    phi_q = torch.relu(torch.einsum('bnd,hdsk->bnhsk', q,
                                    p['subhead_query']))
    kv, z = [], []
    for h, seg in enumerate(lengths):
      m = mask.reshape(batch, length // seg, seg).to(x.dtype)
      count = m.sum(2)
      valid = (count > 0).to(x.dtype)[..., None, None]

      def means(t, m=m, count=count, seg=seg):
        t = t.reshape(batch, length // seg, seg, t.shape[-1])
        return (t * m[..., None]).sum(2) / count.clamp(min=1.0)[..., None]
      k_h = torch.einsum('bmd,dsk->bmsk', means(k), p['subhead_key'][h])
      v_h = torch.einsum('bmd,dsk->bmsk', means(v), p['subhead_value'][h])
      phi_k = torch.relu(k_h) * valid
      v_h = v_h * valid
      z.append(phi_k.sum(1))
      kv.append(torch.einsum('bmsk,bmsv->bskv', phi_k, v_h))
    kv, z = torch.stack(kv, 1), torch.stack(z, 1)
    num = torch.einsum('bnhsk,bhskv->bnhsv', phi_q, kv)
    den = torch.einsum('bnhsk,bhsk->bnhs', phi_q, z)
    y = torch.einsum('bnhsv,bnhs->bnsv', num, gate[..., None] / (den + eps))
    y = _out(y, p['out'])
    return y * mask[..., None].to(y.dtype)
  return fn


# --------------------------------------------------------------- combiner


def _default_block_size(length: int) -> int:
  if length <= 1:
    return 1
  return 1 << int(math.floor(0.5 * math.log2(length) + 0.5))


def _masked_max(t: Tensor, member: Tensor, dim: int) -> tuple[Tensor, Tensor]:
  has = member.any(dim)
  pooled = t.masked_fill(~member, float('-inf')).amax(dim)
  return torch.where(has, pooled, torch.zeros_like(pooled)), has


def _combiner_fixed(p: Mapping[str, Tensor], kw: Mapping[str, Any]) -> Fn:
  def fn(x, mask):
    batch, length, _ = x.shape
    size = kw['block_size'] or _default_block_size(length)
    _require(length, size, 'block size')
    blocks = length // size
    heads, head_dim = p['query'].shape[1:]
    x = x * mask[..., None].to(x.dtype)
    grid = lambda t: t.reshape(batch, blocks, size, heads, head_dim)
    q = grid(_proj(x, p['query']) / math.sqrt(head_dim))
    k, v = grid(_proj(x, p['key'])), grid(_proj(x, p['value']))
    real = mask.reshape(batch, blocks, size)
    member = real[..., None, None].expand_as(q)
    q_span, _ = _masked_max(q, member, 2)
    k_span, has = _masked_max(k, member, 2)
    has = has[..., 0, 0]
    # Local expectation of every block with its max-pooled query.
    w = safe_softmax(torch.einsum('brhd,brkhd->brhk', q_span, k),
                     real[:, :, None, :])
    span_values = torch.einsum('brhk,brkhd->brhd', w, v)
    # One softmax over the own block and the other blocks' abstractions.
    direct = torch.einsum('brchd,brkhd->brchk', q, k)
    spans = torch.einsum('brchd,bshd->brchs', q, k_span)
    other = ~torch.eye(blocks, dtype=torch.bool)
    valid = torch.cat([
        real[:, :, None, None, :].expand(batch, blocks, size, heads, size),
        (has[:, None, None, None, :] & other[None, :, None, None, :]).expand(
            batch, blocks, size, heads, blocks)], -1)
    weights = safe_softmax(torch.cat([direct, spans], -1), valid)
    out = torch.einsum('brchk,brkhd->brchd', weights[..., :size], v)
    out = out + torch.einsum('brchs,bshd->brchd', weights[..., size:],
                             span_values)
    out = out.reshape(batch, length, heads, head_dim)
    return _out(out * mask[:, :, None, None].to(out.dtype), p['out'])
  return fn


# ------------------------------------------------------------------ build


def _tensors(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Tensor]:
  """Flattens a parameter tree to {'a/b': tensor}, dropping 'kernel'."""
  out = {}
  for key, value in tree.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      out.update(_tensors(value, name + '/'))
    else:
      out[name] = torch.from_numpy(np.array(value, dtype=np.float32))
  return {k[:-len('/kernel')] if k.endswith('/kernel') else k: v
          for k, v in out.items()}


def build(name: str, kw: Mapping[str, Any], params: Mapping[str, Any]
          ) -> tuple[Fn, list[Tensor]]:
  """The PyTorch function of a mechanism and its parameter tensors.

  Args:
    name: registry name.
    kw: knobs the JAX layer was built with.
    params: the JAX layer's parameters (`StandaloneAttention` tree:
      'attention' and, for CST, 'attention_shared'), as numpy arrays.

  Returns:
    (fn(x `[B, N, D]`, mask bool `[B, N]`) -> `[B, N, D]`, parameters).

  Raises:
    NotImplementedError: a mechanism or knob value this module lacks.
  """
  p = _tensors(params['attention'])
  shared = _tensors(params.get('attention_shared', {}))
  if name == 'softmax':
    _check_knobs(name, kw, {})
    fn = _softmax(p)
  elif name == 'cst':
    knobs = _check_knobs(name, kw, {
        'slice_length': 8, 'alpha': 1, 'position_init_std': 0.02,
        'composition': ('only', 'local_first'),
        'aggregation': ('only', 'mean'),
        'share_local_global': ('only', True),
        'position_embedding': ('only', 'ms_vipe')})
    fn = _cst(p, shared, knobs)
  elif name == 'long_short':
    knobs = _check_knobs(name, kw, {
        'window_size': 8, 'num_landmarks': 32,
        'conv_kernel_size': ('only', 0),
        'normalize_before_compress': ('only', None, True)})
    fn = _long_short(p, knobs)
  elif name == 'adamra':
    knobs = _check_knobs(name, kw, {
        'compression_rates': (1 / 2, 1 / 8, 1 / 32), 'epsilon': 1e-6,
        'router_gate': ('only', 'prob', 'hard', 'straight_through'),
        'segment_means': ('only', 'masked'),
        'projections': ('only', 'stacked'),
        'feature_map': ('only', 'relu')})
    fn = _adamra(p, knobs)
  elif name == 'combiner':
    knobs = _check_knobs(name, kw, {
        'variant': ('only', 'fixed'), 'block_size': None,
        'abstraction': ('only', None, 'max')})
    fn = _combiner_fixed(p, knobs)
  else:
    raise NotImplementedError(f'No PyTorch reference for {name!r}.')
  return fn, list(p.values()) + list(shared.values())
