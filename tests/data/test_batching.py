"""Deterministic, resumable batching shared by every task."""

import numpy as np
import pytest

from lra_msmra import records
from lra_msmra.data import pipeline


def source(n=10):
  return pipeline.ArraySource({'inputs': np.arange(n, dtype=np.uint8)[:, None],
                               'targets': np.arange(n, dtype=np.int32)})


def test_train_batches_are_a_function_of_seed_and_step():
  a = pipeline.TrainBatches(source(), 4, seed=3)
  b = pipeline.TrainBatches(source(), 4, seed=3)
  for step in (7, 0, 3, 7):  # any order: no hidden iterator state
    np.testing.assert_array_equal(a.get(step)['targets'],
                                  b.get(step)['targets'])
  assert a.get(0)['inputs'].dtype == np.int32
  c = pipeline.TrainBatches(source(), 4, seed=4)
  assert any(not np.array_equal(a.indices(s), c.indices(s)) for s in range(5))


def test_each_epoch_is_a_permutation():
  n, batch = 10, 4
  tb = pipeline.TrainBatches(source(n), batch, seed=0)
  stream = np.concatenate([tb.indices(s) for s in range(10)])  # 4 epochs
  for e in range(4):
    assert sorted(stream[e * n:(e + 1) * n]) == list(range(n))
  assert not np.array_equal(stream[:n], stream[n:2 * n])


def test_process_slices_assemble_the_global_batch():
  tb = pipeline.TrainBatches(source(), 6, seed=1)
  parts = [pipeline.TrainBatches(source(), 6, seed=1, process_index=i,
                                 process_count=3).get(5)['targets']
           for i in range(3)]
  np.testing.assert_array_equal(np.concatenate(parts), tb.get(5)['targets'])
  with pytest.raises(ValueError, match='not divisible'):
    pipeline.TrainBatches(source(), 6, seed=1, process_index=0,
                          process_count=4)


def test_eval_batches_count_every_example_once():
  batches = list(pipeline.eval_batches(source(10), 4))
  assert len(batches) == 3
  assert all(b['inputs'].shape == (4, 1) for b in batches)
  w = np.concatenate([b['weights'] for b in batches])
  t = np.concatenate([b['targets'] for b in batches])
  assert w.sum() == 10 and sorted(t[w > 0]) == list(range(10))
  assert len(list(pipeline.eval_batches(source(10), 4, num_steps=2))) == 2
  halves = [list(pipeline.eval_batches(source(10), 4, process_index=i,
                                       process_count=2)) for i in range(2)]
  joined = np.concatenate([np.concatenate([h0['targets'], h1['targets']])
                           for h0, h1 in zip(*halves)])
  np.testing.assert_array_equal(joined, t)


def test_helpers():
  out = pipeline.pad_or_truncate([[1, 2, 3], [4]], 2)
  np.testing.assert_array_equal(out, [[1, 2], [4, 0]])
  assert records.majority_class(np.bincount([1, 2, 2, 3])) == (2, 0.5)
  with pytest.raises(ValueError, match='differ in length'):
    pipeline.ArraySource({'a': np.zeros(2), 'b': np.zeros(3)})
