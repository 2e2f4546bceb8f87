"""Compile targets: TPU slices and NVIDIA GPU hosts, compiled for on a CPU.

A target is named as a user would name the machine they train on:

* a TPU slice `CHIP:TOPOLOGY`, the chips along each axis of the slice:
  `v5e:2x2`, `v5e:16x16`, `v6e:4x4` (2-D chips), `v4:2x2x1`, `v4:4x4x4`,
  `v5p:2x2x1` (3-D chips);
* a Cloud TPU accelerator type `CHIP-N`: `v5e-4`, `v6e-8` (N chips), `v4-8`,
  `v5p-8` (N TensorCores, two per chip: v4-8 is 4 chips, `v4:2x2x1`);
* NVIDIA GPUs `h100` or `h200`, optionally `:GPUS` on one host or
  `:HOSTSxGPUS`: `h100` (one GPU), `h100:8`, `h200:2x8` (2 hosts of 8).

`parse(name)` gives a `Target` with the figures the compile report needs
(HBM per device, peak FLOP/s and bandwidth from `lra_msmra.hardware`, the
only table of peaks); `Target.devices()` gives JAX's compile-only devices of
the target (`jax.experimental.topologies.get_topology_desc`), which compile
for real without the hardware. `prepare_environment()` must run before JAX
is imported (it sets `JAX_PLATFORMS=cpu`, which both compilers need here).

This module imports no JAX at module level: `parse` and the figures work
without it.

One JAX device is one TPU chip (v4 and v5p in megacore mode, as on Cloud TPU
VMs: the chip's two TensorCores form one device) or one GPU. The compile-only
packages are optional (`requirements-compile.txt`, `pip install -e
.[compile]`): libtpu for TPU targets, the CUDA PJRT plugin for GPU targets.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re
import sys
from typing import Any, Optional

INSTALL = ('pip install -r requirements-compile.txt (or pip install -e '
           '.[compile])')

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10

# The XLA flag that makes a register spill in a GPU kernel fail the compile
# (else ptxas only warns and the kernel runs slowly).
SPILL_FLAG = '--xla_gpu_fail_ptx_compilation_on_register_spilling=true'


class MissingPackage(RuntimeError):
  """A compile-only package a target needs is not installed."""


# ------------------------------------------------------------------- chips


@dataclasses.dataclass(frozen=True)
class TpuChip:
  """Published facts of a TPU generation, per chip (one JAX device)."""
  device_kind: str  # jax.Device.device_kind of its devices.
  dims: int  # Axes of a slice's topology: 2 (v5e, v6e) or 3 (v4, v5p).
  hbm_bytes: int  # Cloud TPU docs, per chip.
  # VMEM of one TensorCore, where a Pallas kernel's blocks live: JAX's own
  # table (`jax.experimental.pallas.tpu.get_tpu_info_for_chip`, checked
  # against this one by tests/tools/test_compile.py). A kernel gets a
  # smaller scoped limit by default unless it asks for more
  # (`vmem_limit_bytes`).
  vmem_bytes: int
  megacore: bool  # Two TensorCores per chip, one device.


TPU_CHIPS: dict[str, TpuChip] = {
    'v4': TpuChip('TPU v4', 3, 32 * GIB, 16 * MIB, True),
    'v5e': TpuChip('TPU v5 lite', 2, 16 * GIB, 128 * MIB, False),
    'v5p': TpuChip('TPU v5', 3, 95 * GIB, 64 * MIB, True),
    'v6e': TpuChip('TPU v6 lite', 2, 32 * GIB, 128 * MIB, False),
}
# Cloud TPU names whose number counts TensorCores (two per chip), not chips.
_CORE_COUNTED = ('v4', 'v5p')
# `v5litepod-N` is Cloud's own name for `v5e-N`.
_ALIASES = {'v5litepod': 'v5e'}
# The slices of one host on Cloud TPU VMs with 2-D chips (v5e, v6e): up to
# 8 chips (2x4); larger slices have 4 chips (2x2) per host, libtpu's default
# for every chip, as are v4 and v5p hosts (2x2x1).
_SINGLE_HOST_CHIPS = 8


@dataclasses.dataclass(frozen=True)
class GpuChip:
  """Published facts of one NVIDIA GPU, from NVIDIA's datasheets and the
  CUDA programming guide (compute capability 9.0), from which the GPU
  target description XLA compiles for is written (`gpu_target_config`)."""
  device_kind: str  # The name the driver reports: jax.Device.device_kind.
  # Device memory: what the driver reports as total (nvidia-smi's
  # "MiB" figure), a little less than the marketed GB figure (H100 SXM
  # "80GB": 81,559 MiB, 79.6 GiB; H200 "141GB": 143,771 MiB, 140.4 GiB). The
  # CUDA context and libraries take some of it at run time: the compile
  # report compares against a usable fraction of it.
  memory_mib: int
  sm_count: int
  shared_memory_per_sm: int
  shared_memory_per_block_optin: int  # The most a kernel can ask for.
  registers_per_sm: int
  registers_per_block: int
  threads_per_sm: int
  l2_bytes: int
  boost_clock_ghz: float
  compute_capability: tuple[int, int]

  @property
  def hbm_bytes(self) -> int:
    return self.memory_mib * MIB


_HOPPER = dict(sm_count=132, shared_memory_per_sm=228 * KIB,
               shared_memory_per_block_optin=227 * KIB,
               registers_per_sm=65536, registers_per_block=65536,
               threads_per_sm=2048, l2_bytes=50 * MIB, boost_clock_ghz=1.98,
               compute_capability=(9, 0))
GPU_CHIPS: dict[str, GpuChip] = {
    # H100 SXM5 80GB (HBM3, 3.35 TB/s).
    'h100': GpuChip('NVIDIA H100 80GB HBM3', 81559, **_HOPPER),
    # H200 SXM 141GB (HBM3e, 4.8 TB/s); same SMs as the H100 SXM.
    'h200': GpuChip('NVIDIA H200', 143771, **_HOPPER),
}
# cuDNN version the description declares: the oldest jax-cuda12-plugin
# 0.10.2 accepts (nvidia-cudnn-cu12>=9.8); it picks which fused cuDNN
# kernels XLA may emit.
_CUDNN_VERSION = (9, 8, 0)
GPUS_PER_HOST = 8


def _peaks(device_kind: str) -> tuple[float, float, float]:
  """(bf16 FLOP/s, float32 FLOP/s, bytes/s) from lra_msmra.hardware."""
  from lra_msmra import hardware  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  bf16 = hardware.peak(device_kind, np.dtype('float16'))
  f32 = hardware.peak(device_kind, np.float32)
  if bf16 is None or f32 is None:
    raise AssertionError(f'lra_msmra.hardware has no peak for {device_kind!r}')
  return bf16.flops_per_s, f32.flops_per_s, bf16.bytes_per_s


def gpu_target_config(chip: str) -> str:
  """The `GpuTargetConfig` (protobuf text) XLA compiles a GPU target for.

  Written from `GPU_CHIPS` and the bandwidth in `lra_msmra.hardware`; the
  fields are those of XLA's `GpuTargetConfigProto` / `GpuDeviceInfoProto`
  that jaxlib 0.10.2 accepts (it rejects `collective_memory_granularity`).
  """
  g = GPU_CHIPS[chip]
  _, _, bandwidth = _peaks(g.device_kind)
  major, minor = g.compute_capability
  info = [
      ('threads_per_block_limit', 1024),
      ('threads_per_warp', 32),
      ('shared_memory_per_block', 48 * KIB),  # Without the opt-in.
      ('shared_memory_per_core', g.shared_memory_per_sm),
      ('threads_per_core_limit', g.threads_per_sm),
      ('core_count', g.sm_count),
      ('fpus_per_core', 128),  # FP32 lanes per SM (Hopper).
      ('block_dim_limit_x', 2 ** 31 - 1),
      ('block_dim_limit_y', 65535),
      ('block_dim_limit_z', 65535),
      ('memory_bandwidth', int(bandwidth)),
      ('l2_cache_size', g.l2_bytes),
      ('clock_rate_ghz', g.boost_clock_ghz),
      ('device_memory_size', g.hbm_bytes),
      ('shared_memory_per_block_optin', g.shared_memory_per_block_optin),
      ('cuda_compute_capability', f'{{ major: {major} minor: {minor} }}'),
      ('registers_per_core_limit', g.registers_per_sm),
      ('registers_per_block_limit', g.registers_per_block),
      ('thread_dim_limit_x', 1024),
      ('thread_dim_limit_y', 1024),
      ('thread_dim_limit_z', 64),
  ]
  lines = ['gpu_device_info {']
  for key, value in info:
    sep = ' ' if isinstance(value, str) else ': '
    lines.append(f'  {key}{sep}{value}')
  lines.append('}')
  lines.append('platform_name: "CUDA"')
  a, b, c = _CUDNN_VERSION
  lines.append(f'dnn_version_info {{ major: {a} minor: {b} patch: {c} }}')
  lines.append(f'device_description_str: "{g.device_kind}"')
  return '\n'.join(lines) + '\n'


# ----------------------------------------------------------------- targets


@dataclasses.dataclass(frozen=True)
class Target:
  """A machine to compile for: a TPU slice or GPU hosts.

  Per-device figures: one device is one TPU chip or one GPU.
  """
  name: str  # Canonical: 'v5e:2x2', 'v4:2x2x1', 'h200:2x8'.
  platform: str  # 'tpu' or 'cuda'.
  chip: str  # 'v4', 'v5e', 'v5p', 'v6e', 'h100', 'h200'.
  num_hosts: int
  num_devices: int
  device_kind: str
  hbm_bytes: int  # Per device.
  peak_bf16_flops: float  # Dense matmul FLOP/s per device.
  peak_f32_flops: float
  hbm_bytes_per_s: float
  vmem_bytes: Optional[int] = None  # TPU: one TensorCore's VMEM.
  topology: str = ''  # TPU: 'v5e:2x2'; GPU: 'slices x hosts x GPUs'.
  alias: str = ''  # The name as given, when not the canonical one.

  @property
  def label(self) -> str:
    """The name as given (e.g. 'v5e-4'), else the canonical one."""
    return self.alias or self.name

  def peak_flops(self, dtype: Any) -> float:
    """Matmul peak for activations in `dtype` ('bfloat16' or 'float32')."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    half = str(dtype) in ('bfloat16', 'float16') or (
        not isinstance(dtype, str) and np.dtype(dtype).itemsize == 2)
    return self.peak_bf16_flops if half else self.peak_f32_flops

  def target_config(self) -> str:
    """GPU targets: the GpuTargetConfig text they are compiled for."""
    if self.platform != 'cuda':
      raise ValueError(f'{self.name} is a TPU target: no GPU description.')
    return gpu_target_config(self.chip)

  def compiler_options(self, spill_check: bool = True
                       ) -> Optional[dict[str, Any]]:
    """Options for `lowered.compile(compiler_options=...)` on this target.

    GPU: a kernel that spills registers fails the compile (`spill_check`;
    the option, unlike XLA_FLAGS, works after XLA has started), and XLA's
    own matmuls use cuBLAS: without a device there is no autotuner, and
    XLA's Triton GEMM emitter then may find no tile sizes for an odd shape
    (`Couldn't find output tile sizes ... dot f32[416,64]`). Pallas kernels
    are Triton kernels either way. TPU: None (libtpu's defaults).
    """
    if self.platform != 'cuda':
      return None
    return {'xla_gpu_enable_triton_gemm': False,
            'xla_gpu_fail_ptx_compilation_on_register_spilling': spill_check}

  def check_packages(self) -> None:
    """Raises MissingPackage unless this target's compiler is installed."""
    if self.platform == 'tpu':
      if importlib.util.find_spec('libtpu') is None:
        raise MissingPackage(
            f'target {self.label} needs libtpu (jax[tpu]), which is not '
            f'installed: {INSTALL}.')
    elif (_find('jax_plugins.xla_cuda12') is None
          or _find('jax_cuda12_plugin') is None):
      raise MissingPackage(
          f'target {self.label} needs the CUDA plugin (jax-cuda12-pjrt, '
          f'jax-cuda12-plugin), which is not installed: {INSTALL}.')

  def devices(self) -> list[Any]:
    """JAX's compile-only devices of this target (every host's).

    Needs `prepare_environment()` before JAX is imported, or JAX_PLATFORMS=cpu
    already set. Raises MissingPackage when the compiler is not installed.
    """
    return list(_devices(self))


def _find(module: str):
  try:
    return importlib.util.find_spec(module)
  except ModuleNotFoundError:  # Its parent package is missing.
    return None


def _tpu_options(target: Target) -> dict[str, Any]:
  chip = TPU_CHIPS[target.chip]
  shape = tuple(int(x) for x in target.name.split(':')[1].split('x'))
  options: dict[str, Any] = {}
  if chip.megacore:
    options['chip_config_name'] = 'megacore'
  if target.num_hosts == 1:
    # A whole slice on one host (libtpu's default host is 2x2x1 chips).
    options['chips_per_host_bounds'] = shape + (1,) * (3 - len(shape))
  return options


@functools.lru_cache(maxsize=None)
def _devices(target: Target) -> tuple[Any, ...]:
  target.check_packages()
  prepare_environment()
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if target.platform == 'tpu':
    desc = topologies.get_topology_desc(
        topology_name=target.name, platform='tpu', **_tpu_options(target))
  else:
    desc = topologies.get_topology_desc(
        platform='cuda', topology_name='', target_config=target.target_config(),
        topology=target.topology)
  devices = tuple(desc.devices)
  if len(devices) != target.num_devices:
    raise AssertionError(f'{target.name}: {len(devices)} compile-only devices, '
                         f'{target.num_devices} expected.')
  return devices


# ------------------------------------------------------------------ parsing


def _valid_forms() -> str:
  return ('valid: TPU slices CHIP:TOPOLOGY with CHIP in '
          f'{", ".join(TPU_CHIPS)} (v5e:2x2, v6e:16x16, v4:2x2x1, v5p:4x4x4), '
          'Cloud TPU names (v5e-4, v6e-8; v4-8 and v5p-8 count TensorCores, '
          'two per chip), or NVIDIA GPUs '
          f'{"|".join(GPU_CHIPS)}[:GPUS or :HOSTSxGPUS] (h100, h100:8, '
          'h200:2x8)')


def _bad(name: str, problem: str) -> ValueError:
  return ValueError(f'target {name!r}: {problem}; {_valid_forms()}.')


def _tpu_target(given: str, chip_name: str, shape: tuple[int, ...],
                alias: str = '') -> Target:
  chip = TPU_CHIPS[chip_name]
  if len(shape) != chip.dims:
    example = 'x'.join(['2', '2', '1'][:chip.dims])
    raise _bad(given, f'{chip_name} slices have {chip.dims} axes '
               f'({chip_name}:{example}), not {len(shape)}')
  if any(d < 1 for d in shape):
    raise _bad(given, 'every axis needs at least one chip')
  chips = math.prod(shape)
  if chip.dims == 2 and chips <= _SINGLE_HOST_CHIPS:
    hosts = 1
  else:
    if shape[0] % 2 or shape[1] % 2:
      raise _bad(given, f'a {chip_name} slice of several hosts (2x2 chips '
                 'each) needs its first two axes even')
    hosts = chips // 4
  name = f'{chip_name}:' + 'x'.join(map(str, shape))
  bf16, f32, bandwidth = _peaks(chip.device_kind)
  return Target(
      name=name, platform='tpu', chip=chip_name, num_hosts=hosts,
      num_devices=chips, device_kind=chip.device_kind,
      hbm_bytes=chip.hbm_bytes, peak_bf16_flops=bf16, peak_f32_flops=f32,
      hbm_bytes_per_s=bandwidth, vmem_bytes=chip.vmem_bytes, topology=name,
      alias=alias if alias.lower() != name else '')


def _cloud_shape(chip_name: str, count: int, given: str) -> tuple[int, ...]:
  """The slice shape Cloud TPU gives an accelerator type `CHIP-count`."""
  chip = TPU_CHIPS[chip_name]
  if chip_name in _CORE_COUNTED:
    if count < 8 or count & (count - 1):
      raise _bad(given, f'{chip_name}-N counts TensorCores (two per chip): '
                 'N is a power of two from 8')
    shape = [2, 2, 1]
    while math.prod(shape) < count // 2:
      # Double the last of the smallest axes: 2x2x1, 2x2x2, 2x2x4, 2x4x4,
      # 4x4x4, 4x4x8, ...
      smallest = min(shape)
      i = max(j for j, d in enumerate(shape) if d == smallest)
      shape[i] *= 2
    return tuple(shape)
  del chip
  if count < 1 or count & (count - 1) or count == 2:
    raise _bad(given, f'{chip_name}-N counts chips: N is 1, 4, 8, 16, ... '
               '(a power of two)')
  if count == 1:
    return (1, 1)
  side = 1 << (count.bit_length() - 1) // 2
  return (side, count // side)  # 4: 2x2, 8: 2x4, 32: 4x8, 256: 16x16.


_TPU_NAME = re.compile(r'^([a-z0-9]+):([0-9]+(?:x[0-9]+)*)$')
_CLOUD_NAME = re.compile(r'^([a-z0-9]+)-([0-9]+)$')
_GPU_NAME = re.compile(r'^([a-z0-9]+)(?::(?:([0-9]+)x)?([0-9]+))?$')


def parse(name: str) -> Target:
  """The target named `name` (see the module docstring for the forms).

  Raises:
    ValueError: one line naming the problem and the valid forms.
  """
  given = name
  name = name.strip().lower()
  m = _TPU_NAME.match(name)
  if m and m.group(1) in TPU_CHIPS:
    return _tpu_target(given, m.group(1),
                       tuple(int(x) for x in m.group(2).split('x')))
  m = _CLOUD_NAME.match(name)
  if m and _ALIASES.get(m.group(1), m.group(1)) in TPU_CHIPS:
    chip = _ALIASES.get(m.group(1), m.group(1))
    shape = _cloud_shape(chip, int(m.group(2)), given)
    return _tpu_target(given, chip, shape, alias=given.strip())
  m = _GPU_NAME.match(name)
  if m and m.group(1) in GPU_CHIPS:
    chip = m.group(1)
    hosts = int(m.group(2)) if m.group(2) else 1
    per_host = int(m.group(3)) if m.group(3) else 1
    if hosts < 1 or not 1 <= per_host <= GPUS_PER_HOST:
      raise _bad(given, f'a host holds 1 to {GPUS_PER_HOST} GPUs and there '
                 'is at least one host')
    g = GPU_CHIPS[chip]
    bf16, f32, bandwidth = _peaks(g.device_kind)
    canonical = (chip if hosts == per_host == 1 else
                 f'{chip}:{per_host}' if hosts == 1 else
                 f'{chip}:{hosts}x{per_host}')
    return Target(
        name=canonical, platform='cuda', chip=chip, num_hosts=hosts,
        num_devices=hosts * per_host, device_kind=g.device_kind,
        hbm_bytes=g.hbm_bytes, peak_bf16_flops=bf16, peak_f32_flops=f32,
        hbm_bytes_per_s=bandwidth,
        # XLA's GPU topology: slices x hosts per slice x GPUs per host.
        topology=f'1x{hosts}x{per_host}',
        alias=given.strip() if given.strip().lower() != canonical else '')
  head = re.split(r'[:\-]', name, maxsplit=1)[0]
  if head in TPU_CHIPS or head in _ALIASES:
    problem = 'not a slice shape (axes like 2x2 or 2x2x1) or a Cloud count'
  elif head in GPU_CHIPS:
    problem = 'not a GPU count (h100:8) or hosts x GPUs (h200:2x8)'
  else:
    problem = f'unknown chip {head!r}'
  raise _bad(given, problem)


# ------------------------------------------------------------ environment


def _add_flag(flags: str, flag: str) -> str:
  key = flag.split('=', 1)[0]
  kept = [f for f in flags.split() if f.split('=', 1)[0] != key]
  return ' '.join(kept + [flag])


def prepare_environment() -> None:
  """Sets what deviceless compiles need; call before JAX is imported.

  * `JAX_PLATFORMS=cpu`: the one runtime platform. Without it an installed
    libtpu makes JAX look for a TPU (and wait), and the CUDA plugin fails
    its driver check.
  * `ALLOW_MULTIPLE_LIBTPU_LOAD=1`: several processes may load libtpu at
    once (else all but the first fail on its lock file).
  * libtpu's and TensorFlow's C++ logs quieted (`TF_CPP_MIN_LOG_LEVEL`,
    `TPU_STDERR_LOG_LEVEL`, `TPU_MIN_LOG_LEVEL`): libtpu warns that it
    cannot find an accelerator or its workers' hostnames, which is expected
    here.
  * `XLA_FLAGS` gains `--xla_gpu_fail_ptx_compilation_on_register_spilling=true`
    (a GPU kernel that spills registers fails to compile instead of running
    slowly). XLA reads XLA_FLAGS once, when its first backend starts.

  Calling it again is harmless. If JAX was imported already, it must have
  been with `JAX_PLATFORMS=cpu`.

  Raises:
    RuntimeError: JAX was imported with another platform setting.
  """
  if 'jax' in sys.modules:
    jax = sys.modules['jax']
    platforms = getattr(jax.config, 'jax_platforms', None)
    if (platforms or '').strip() != 'cpu':
      raise RuntimeError(
          'JAX was imported before lra_msmra_tools.targets.'
          'prepare_environment() without JAX_PLATFORMS=cpu (jax_platforms='
          f'{platforms!r}); set JAX_PLATFORMS=cpu in the environment, or call '
          'prepare_environment() before importing jax.')
  os.environ['JAX_PLATFORMS'] = 'cpu'
  os.environ['ALLOW_MULTIPLE_LIBTPU_LOAD'] = '1'
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  os.environ.setdefault('TPU_STDERR_LOG_LEVEL', '3')
  os.environ.setdefault('TPU_MIN_LOG_LEVEL', '3')
  os.environ['XLA_FLAGS'] = _add_flag(os.environ.get('XLA_FLAGS', ''),
                                      SPILL_FLAG)
