"""Transparent huge pages for XLA:CPU's per-call buffers (Linux, glibc).

On the CPU backend, XLA allocates the temporary buffer of a compiled program
anew at every call (one block of `compiled.memory_analysis()
.temp_size_in_bytes`: 66 MB to 1 GB for one `long_short` layer's forward
and backward pass at 1,024 to 16,384 tokens in docs/benchmarks.md), and
frees it after. glibc serves
a block that large with a fresh `mmap`, so every call touches every page
of it for the first time: one page fault per 4 KiB (the benchmarks'
`faults_per_call` counts them).

With glibc's tunable `glibc.malloc.hugetlb=1` (glibc 2.35 and newer) and the
kernel's transparent huge pages in `madvise` mode, glibc asks for huge pages
on those mappings, so a call faults once per 2 MiB instead. The tunable is
read when the process starts, so it has to be in the environment of the
Python process:

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python -m lra_msmra.main ...

On the 2-core machine of docs/benchmarks.md ("Page faults"), full-size
ListOps training steps ran 1.5 to 1.6 times faster with it. Nothing
computed changes (the same programs run on the same data); only where the
memory comes from. In `always` mode the kernel already does this
for large mappings, and in `never` mode the tunable has no effect. This
module only reads the settings (through `lra_msmra.provenance`, which
records them in results.json) and builds environments for the benchmarks'
worker processes; it changes nothing in the running process.
"""

from __future__ import annotations

import os
from typing import Mapping

from lra_msmra import provenance

TUNABLE = provenance.HUGETLB_TUNABLE
SETTING = f'{TUNABLE}=1'
thp_mode = provenance.thp_mode
hugetlb_value = provenance.hugetlb_value


def with_hugepages(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
  """A copy of `environ` whose `GLIBC_TUNABLES` sets `glibc.malloc.hugetlb=1`
  (other tunables kept; an explicit setting of it is replaced)."""
  env = dict(environ)
  items = [item for item in env.get('GLIBC_TUNABLES', '').split(':')
           if item and item.partition('=')[0] != TUNABLE]
  env['GLIBC_TUNABLES'] = ':'.join(items + [SETTING])
  return env


def describe(environ: Mapping[str, str] = os.environ) -> dict[str, object]:
  """What decides how this process gets memory: the THP mode, the glibc
  huge page tunable and any `MALLOC_*` variables (for benchmark reports;
  `lra_msmra.provenance.host_memory`)."""
  return provenance.host_memory(environ)
