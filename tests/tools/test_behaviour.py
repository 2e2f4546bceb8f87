"""lra_msmra_tools.behaviour: snapshots of what the library computes and
their comparison."""

import json
import os

import numpy as np

from lra_msmra_tools import behaviour
from tests import helpers


def _snapshot(path, arrays, metrics):
  records = {'cases': ['local:xla'], 'metrics': metrics,
             'results': {'num_params': 3}}
  np.savez_compressed(path, __records__=np.asarray(json.dumps(records)),
                      **arrays)


def test_compare_finds_every_kind_of_difference(tmp_path, capsys):
  a, b = tmp_path / 'a.npz', tmp_path / 'b.npz'
  base = {'x/params/w': np.arange(4.0, dtype=np.float32),
          'x/out/logits': np.zeros((2, 3), np.float32)}
  _snapshot(a, base, [{'step': 1, 'train/loss': 2.0}])
  _snapshot(b, dict(base), [{'step': 1, 'train/loss': 2.0}])
  assert behaviour.compare(str(a), str(b)) == 0
  assert capsys.readouterr().out.splitlines()[-1].startswith(
      '0 differences')
  changed = dict(base, **{'x/params/w': np.asarray([0, 1, 2, 3.5],
                                                   np.float32),
                          'x/grads/new': np.ones(1, np.float32)})
  del changed['x/out/logits']
  _snapshot(b, changed, [{'step': 1, 'train/loss': 2.5}])
  assert behaviour.compare(str(a), str(b)) == 1
  out = capsys.readouterr().out
  assert 'x/params/w: 1 of 4 elements differ, largest by 0.5' in out
  assert f'x/out/logits: only in {a}' in out
  assert f'x/grads/new: only in {b}' in out
  assert 'metrics: ' in out and '4 differences' in out


def test_a_mechanism_snapshot_is_reproducible():
  path = os.path.join(helpers.ROOT, 'configs', 'listops', 'local.py')
  one = behaviour.mechanism_arrays(path, 'xla')
  two = behaviour.mechanism_arrays(path, 'xla')
  assert set(one) == set(two)
  assert any(k.startswith('grads/') for k in one)
  assert one['out/logits'].shape[0] == 2
  for key, value in one.items():
    np.testing.assert_array_equal(value, two[key])
