"""Every task's full-size config compiles and fits on a TPU slice and a GPU host.

The XLA path (`implementation='xla'`) of each task's full-size CST config,
its train and eval steps at the config's own global batch, really compiled
on this CPU (`lra_msmra_tools.compile`) for a v5e 2x2 slice (libtpu, which
refuses a program beyond the HBM) and for 8 H200s (XLA's CUDA compiler;
the memory compared with the GPU's here), two worker processes at a time.
The whole table, every mechanism on five targets, is docs/scaling.md's
"Where it fits".
"""

import os

import pytest

from tests import helpers

from lra_msmra_tools import compile as compile_lib
from lra_msmra_tools import fits
from lra_msmra_tools import scaling

pytestmark = [
    pytest.mark.slow,
    pytest.mark.extras,
    pytest.mark.xdist_group('tools-full-size'),
    pytest.mark.skipif(helpers.COMPILE_EXTRAS_MISSING,
                       reason=helpers.COMPILE_EXTRAS_REASON),
]

TARGETS = ('v5e-4', 'h200:8')
CELLS = [(task, target) for task in fits.TASKS for target in TARGETS]


@pytest.fixture(scope='module')
def results():
  jobs = []
  for task, target in CELLS:
    path = os.path.join(scaling.CONFIG_ROOT, task, 'cst.py')
    config = compile_lib.apply_settings(scaling.load_config(path), None,
                                        'xla')
    jobs.append(compile_lib.Job(label=f'{task}/cst.py', config=config,
                                target=target, max_batch_search=0,
                                kernel_stats=False))
  return dict(zip(CELLS, compile_lib.run_jobs(jobs, workers=2)))


@pytest.mark.parametrize('task, target', CELLS,
                         ids=[f'{t}-{g}' for t, g in CELLS])
def test_full_size_compiles_and_fits(results, task, target):
  r = results[(task, target)]
  assert not r.get('error') and not r.get('failures'), r
  assert r['fits'] is True, compile_lib.problem_lines(r)
  for step in ('train', 'eval'):
    assert 0 < r[step]['total'] <= r['hbm_bytes'], r[step]
  # The donated training state is aliased to the new state.
  assert r['train']['alias'] > 0.9 * r['state_bytes']
  assert r['flops'] > 0
