"""The least memory traffic of one attention layer, and its roofline time.

A layer cannot run faster than its arithmetic at the device's peak FLOP/s
nor faster than its compulsory memory traffic at the peak bandwidth, so its
roofline time is `max(flops / peak FLOP/s, bytes / peak bytes/s)`
(`roofline_s`). The FLOPs are the matmul FLOPs that
`lra_msmra.flops` counts; this module gives the bytes.

The model (`layer_bytes`): the layer is the contract's — `x`
`[batch, length, features]` projected to queries, keys and values of
`qkv_features` each, an attention core of some kind, and an output
projection to `out_features` — and its projections are separate matrix
products, as in every mechanism here. Whatever a fused kernel keeps on chip
is free; what must cross memory at least once is:

Forward (`fwd`):
  * read the input `x` and the padding mask `[batch, length]` (one byte
    per entry) once;
  * read the parameters once (`param_nbytes`: as stored, float32);
  * write q, k and v (3 x `[batch, length, qkv_features]`) and read them
    once in the attention core;
  * write the attention output `[batch, length, qkv_features]` and read it
    once in the output projection;
  * write the output `[batch, length, out_features]`.

Forward+backward (`fwd_bwd`), the above plus:
  * read the output's cotangent;
  * read the saved q, k, v, attention output and input `x` again (the
    weight gradients and the core's backward need them);
  * write the attention output's cotangent and read it back, write the
    cotangents of q, k and v and read them back;
  * write the input's cotangent;
  * read the parameters again (for the input's cotangent) and write their
    gradients (float32).

Activations move in the layer's dtype (`act_bytes`: 2 for bfloat16, 4 for
float32). A mechanism's own intermediate tensors (slice summaries,
landmarks, routing scores, the N x N scores of softmax) are not counted:
a fused kernel can keep them on chip, so they are not compulsory. The
figure is a lower bound: reading `x` once for the three projections
assumes they share it, and no tensor is re-read for lack of cache.

For B = 4, N = 16,384, D = E = 256, bfloat16 and softmax's four 256 x 256
projections this is 0.34 GB forward and 0.84 GB forward+backward.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

MODES = ('fwd', 'fwd_bwd')


def layer_bytes(*, batch: int, length: int, features: int,
                qkv_features: int, out_features: Optional[int] = None,
                param_nbytes: int, act_bytes: int, mode: str
                ) -> dict[str, Any]:
  """Compulsory memory traffic of one layer call (the module docstring).

  Args:
    batch, length: the input's `[batch, length]`.
    features: input width D.
    qkv_features: width E of queries, keys, values and the attention output.
    out_features: output width (None = `features`).
    param_nbytes: bytes of the layer's parameters as stored (its shared
      module's too; float32 in this project).
    act_bytes: bytes per activation element (the layer's dtype).
    mode: 'fwd' or 'fwd_bwd'.

  Returns:
    {'bytes': total, 'parts': {name: bytes}}, the parts adding up to the
    total.
  """
  if mode not in MODES:
    raise ValueError(f'mode {mode!r} is not one of {MODES}')
  out_features = features if out_features is None else out_features
  tokens = batch * length
  x = tokens * features * act_bytes
  qkv = tokens * qkv_features * act_bytes  # One of q, k, v or the output.
  y = tokens * out_features * act_bytes
  params = param_nbytes
  parts = {
      'read input and padding mask': x + tokens,
      'read parameters': params,
      'write and read q, k, v': 2 * 3 * qkv,
      'write and read attention output': 2 * qkv,
      'write output': y,
  }
  if mode == 'fwd_bwd':
    parts.update({
        "read output's cotangent": y,
        'read saved q, k, v, attention output, input': 4 * qkv + x,
        'write and read cotangents of attention output, q, k, v': 2 * 4 * qkv,
        "write input's cotangent": x,
        'read parameters, write their gradients': 2 * params,
    })
  return {'bytes': sum(parts.values()), 'parts': parts}


def roofline_s(flops: Optional[float], num_bytes: Optional[float],
               flops_per_s: Optional[float],
               bytes_per_s: Optional[float]) -> Optional[float]:
  """max(flops / peak FLOP/s, bytes / peak bytes/s); None if a figure is
  missing (e.g. the CPU, which has no peak in `lra_msmra.hardware`)."""
  if None in (flops, num_bytes, flops_per_s, bytes_per_s):
    return None
  return max(flops / flops_per_s, num_bytes / bytes_per_s)


def bound(flops: float, num_bytes: float, flops_per_s: float,
          bytes_per_s: float) -> str:
  """'compute' or 'memory': which side of the roofline sets its time."""
  return ('compute' if flops / flops_per_s >= num_bytes / bytes_per_s
          else 'memory')


def rates(*, flops: Optional[float], num_bytes: Optional[float],
          time_s: Optional[float],
          peak: Optional[Any]) -> dict[str, Optional[float]]:
  """Achieved figures of a measured call against a `hardware.Peak`.

  Returns a dict with `tflops_per_s` (FLOPs / time), `pct_peak_flops`,
  `pct_peak_bandwidth` (the compulsory bytes / time, a lower bound on the
  bandwidth used, over the peak), `roofline_s`, `over_roofline` (measured
  time / roofline time) and `bound`; None where a figure is missing.
  """
  out: dict[str, Optional[float]] = dict.fromkeys(
      ('tflops_per_s', 'pct_peak_flops', 'pct_peak_bandwidth', 'roofline_s',
       'over_roofline', 'bound'))
  if not time_s:
    return out
  if flops is not None:
    out['tflops_per_s'] = flops / time_s / 1e12
  if peak is None:
    return out
  if flops is not None:
    out['pct_peak_flops'] = 100 * flops / time_s / peak.flops_per_s
  if num_bytes is not None:
    out['pct_peak_bandwidth'] = 100 * num_bytes / time_s / peak.bytes_per_s
  roof = roofline_s(flops, num_bytes, peak.flops_per_s, peak.bytes_per_s)
  if roof:
    out['roofline_s'] = roof
    out['over_roofline'] = time_s / roof
    out['bound'] = bound(flops, num_bytes, peak.flops_per_s,
                         peak.bytes_per_s)
  return out


def describe(parts: Mapping[str, int]) -> str:
  """'name 1.0 MB, ...' for a report."""
  return ', '.join(f'{k} {v / 1e6:.1f} MB' for k, v in parts.items())
