"""Two runs of the same command give bit-identical training losses.

The `xiong` ListOps config (model, optimizer, OneCycle schedule, dropout)
trained for 20 steps on a fixed small file, twice, each in a fresh process:
data order and initialisation are seeded, so every per-step loss must agree
to the last bit.
"""

import json
import os
import subprocess
import sys

import pytest

from lra_msmra.data import listops
from tests import helpers

STEPS = 20


def _losses(workdir):
  with open(os.path.join(workdir, 'tensorboard', 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  return [(r['step'], r['train/loss']) for r in records if 'train/loss' in r]


# A whole run in a process: under the `slow` marker (pytest.ini).
@pytest.mark.slow
def test_first_steps_of_xiong_listops_are_bit_identical(tmp_path):
  data = tmp_path / 'listops'
  listops.generate_dataset(str(data), num_train=96, num_valid=32,
                           num_test=32, min_length=20, max_length=120,
                           max_depth=5, max_args=5, seed=0)
  env = helpers.user_env()  # The user's XLA settings.
  losses = []
  for name in ('a', 'b'):
    cmd = [sys.executable, '-m', 'lra_msmra.main', '--config',
           'configs/listops/cst.py:xiong', '--workdir', str(tmp_path / name),
           f'--config.data_dir={data}', '--config.data.max_length=128',
           '--config.data.pad_to_length=128',
           f'--config.num_train_steps={STEPS}', '--config.log_every_steps=1',
           f'--config.eval_every_steps={STEPS}',
           f'--config.checkpoint_every_steps={STEPS}']
    done = subprocess.run(cmd, cwd=helpers.ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    losses.append(_losses(tmp_path / name))
  assert [s for s, _ in losses[0]] == list(range(1, STEPS + 1))
  assert losses[0] == losses[1]
  # The losses move: the test would notice a run that did not train.
  assert len({loss for _, loss in losses[0]}) > STEPS // 2
