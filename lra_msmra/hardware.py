"""Peak FLOP/s and memory bandwidth of the accelerators users run on.

`peak(device_kind, dtype)` gives the dense (no sparsity) matmul peak of one
JAX device for the dtype of the computation and its memory bandwidth, from
the vendors' datasheets, or None for a device kind not in the table (the
CPU among them: its peak depends on the host, so no utilisation is claimed
there). The benchmarks divide achieved FLOP/s and bytes/s by these figures,
and the trainer's progress line divides model FLOP/s by the peak (MFU).

float32 matmuls run at the TF32 tensor-core rate on NVIDIA GPUs from
Ampere on (JAX's default matmul precision allows it), and as bfloat16
passes on TPUs (the default precision takes one pass), so float32 uses
those rates. One JAX device is one GPU, or one TPU chip from v4 on (one
TensorCore on v2 and v3, half a chip).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np


class Peak(NamedTuple):
  """One device's peaks: dense matmul FLOP/s and memory bytes/s."""
  flops_per_s: float
  bytes_per_s: float
  source: str


# (substring of jax.Device.device_kind, lower case) -> (bf16 FLOP/s,
# float32 FLOP/s, bytes/s, datasheet). The first matching entry wins, so
# more specific names come first.
_TABLE: tuple[tuple[str, float, float, float, str], ...] = (
    ('h200', 989.4e12, 494.7e12, 4.8e12, 'NVIDIA H200 SXM datasheet'),
    ('h100 pcie', 756.5e12, 378.0e12, 2.0e12, 'NVIDIA H100 PCIe datasheet'),
    ('h100 nvl', 835.5e12, 417.5e12, 3.9e12, 'NVIDIA H100 NVL datasheet'),
    ('h100', 989.4e12, 494.7e12, 3.35e12, 'NVIDIA H100 SXM datasheet'),
    ('a100-sxm4-80gb', 312e12, 156e12, 2.039e12,
     'NVIDIA A100 80GB SXM datasheet'),
    ('a100 80gb pcie', 312e12, 156e12, 1.935e12,
     'NVIDIA A100 80GB PCIe datasheet'),
    ('a100', 312e12, 156e12, 1.555e12, 'NVIDIA A100 40GB datasheet'),
    ('l4', 121e12, 60e12, 0.3e12, 'NVIDIA L4 datasheet'),
    ('tpu v6', 918e12, 918e12, 1.64e12, 'Cloud TPU v6e (Trillium) docs'),
    ('tpu v5 lite', 197e12, 197e12, 0.819e12, 'Cloud TPU v5e docs'),
    ('tpu v5e', 197e12, 197e12, 0.819e12, 'Cloud TPU v5e docs'),
    ('tpu v5', 459e12, 459e12, 2.765e12, 'Cloud TPU v5p docs'),
    ('tpu v4', 275e12, 275e12, 1.2e12, 'Cloud TPU v4 docs'),
    ('tpu v3', 61.5e12, 61.5e12, 0.45e12,
     'Cloud TPU v3 docs (per TensorCore)'),
)


def peak(device_kind: str, dtype: Any = np.float32) -> Optional[Peak]:
  """The peaks of a device kind for matmuls in `dtype`, or None if unknown.

  Args:
    device_kind: `jax.Device.device_kind`, e.g. 'NVIDIA H100 80GB HBM3'.
    dtype: the computation dtype; 16-bit floats get the bf16/fp16 rate,
      anything else the float32 rate.
  """
  kind = device_kind.lower()
  half = np.dtype(dtype).itemsize == 2
  for key, bf16, fp32, bandwidth, source in _TABLE:
    if key in kind:
      return Peak(bf16 if half else fp32, bandwidth, source)
  return None
