"""The device peak table: lookups by device kind and dtype."""

import jax.numpy as jnp
import numpy as np

from lra_msmra import hardware


def test_known_kinds_and_dtypes():
  h100 = hardware.peak('NVIDIA H100 80GB HBM3', jnp.bfloat16)
  assert h100.flops_per_s == 989.4e12 and h100.bytes_per_s == 3.35e12
  assert hardware.peak('NVIDIA H100 80GB HBM3', np.float32).flops_per_s == (
      494.7e12)
  # The more specific names win over the family name.
  assert hardware.peak('NVIDIA H100 PCIe', jnp.float16).bytes_per_s == 2.0e12
  assert hardware.peak('NVIDIA H200', jnp.bfloat16).bytes_per_s == 4.8e12
  assert hardware.peak('TPU v5 lite', jnp.bfloat16).flops_per_s == 197e12
  assert hardware.peak('TPU v4', jnp.float32).flops_per_s == 275e12


def test_unknown_kind_is_none():
  assert hardware.peak('cpu') is None
  assert hardware.peak('Some Future Accelerator', jnp.bfloat16) is None
