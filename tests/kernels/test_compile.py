"""Every Pallas kernel compiles for a TPU (v5e) and a GPU (H200), on this CPU.

A real compile, not a lowering (`lra_msmra_tools.kernels`): libtpu runs
Mosaic's checks (tiling, aligned dynamic slices, scoped VMEM), and the
CUDA plugin compiles Triton to sm_90a machine code, failing on shared
memory beyond the limit and on register spills. Every mechanism variant
with a Pallas implementation, forward and gradients, at the `runlocal`
shape of the LRA configs (float32, 100 tokens, head dim 16) and at a
length that is a multiple of no tile (bfloat16, 1000 tokens, head dim
64, attention dropout 0.1: the kernels' keep-mask hashing), on the H200
also at head dim 256 in float32; and the layer
of task configs with a Pallas mechanism as their models run them
(`kernels.config_case`: the config's knobs, heads, head dim, length and
dropout, metrics collected as in the train step).

The H200 compiles every config's layer: what fails there (register
spills, shared memory) turns on every knob. The v5e compiles, for each
mechanism file and options, the layers that reach past the shapes above,
the longest (Path-X, 16K: scoped VMEM) and the narrowest head (4 lanes),
which keeps CI's cost down. The wider sweep (every TPU generation, H100,
every config layer on each, lengths to 16K, head dims to 128, both
dtypes) is the command of docs/scaling.md.
"""


import pytest

from tests import helpers

from lra_msmra_tools import kernels as kernel_matrix

pytestmark = [
    pytest.mark.slow,
    pytest.mark.extras,
    pytest.mark.xdist_group('kernels-compile'),
    pytest.mark.skipif(helpers.COMPILE_EXTRAS_MISSING,
                       reason=helpers.COMPILE_EXTRAS_REASON),
]

SHAPES = ((100, 16, 'float32', 0.0), (1000, 64, 'bfloat16', 0.1))
TARGETS = ('v5e-4', 'h200')
# Wide float32 heads on the GPU, where their tiles meet the shared-memory
# and register limits (AdaMRA works its [d, d] summaries in spans there).
WIDE = (1000, 256, 'float32', 0.1)
CASES = [kernel_matrix.Case(variant, target, n, d, dtype, dropout=rate)
         for variant, _, _ in kernel_matrix.VARIANTS
         for target in TARGETS for n, d, dtype, rate in SHAPES]
CASES += [kernel_matrix.Case(variant, 'h200', WIDE[0], WIDE[1], WIDE[2],
                             dropout=WIDE[3])
          for variant, _, _ in kernel_matrix.VARIANTS]


def reaching(cases):
  """For each mechanism file and options (`x.py[:options]`, whatever the
  task), its longest layer and its narrowest-head one."""
  groups = {}
  for case in cases:
    groups.setdefault(case.variant.split('/', 1)[1], []).append(case)
  chosen = {}
  for group in groups.values():
    for pick in (max(group, key=lambda c: c.length),
                 min(group, key=lambda c: (c.head_dim, -c.length))):
      chosen[pick.key] = pick
  return list(chosen.values())


CONFIG_LAYERS = kernel_matrix.task_configs()
CASES += [kernel_matrix.config_case(config, 'h200')
          for config in CONFIG_LAYERS]
CASES += reaching([kernel_matrix.config_case(config, 'v5e-4')
                   for config in CONFIG_LAYERS])


@pytest.fixture(scope='module')
def records():
  """Every case compiled once, two worker processes at a time."""
  return {r['key']: r for r in kernel_matrix.run(CASES, jobs=2)}


@pytest.mark.parametrize('case', CASES, ids=[
    f'{c.variant.replace("/", "-")}-{c.target}-{c.length}-{c.dtype}'
    for c in CASES])
def test_kernel_compiles(records, case):
  record = records[case.key]
  assert record['status'] == 'ok', record.get('error')
  # The layer really runs kernels there: the forward and backward calls.
  assert record['kernels'] >= 2, record
