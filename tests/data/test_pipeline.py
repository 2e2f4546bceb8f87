"""Training order (P10 switch) and ragged storage of lra_msmra.data.pipeline."""

import numpy as np
import pytest

from lra_msmra.data import pipeline


def _source(n):
  return pipeline.ArraySource({'inputs': np.arange(n)[:, None],
                               'targets': np.arange(n)})


def test_example_level_is_default_and_covers_each_epoch():
  batches = pipeline.TrainBatches(_source(12), 4, seed=0)
  assert batches.shuffle.level == 'examples'
  epoch = np.concatenate([batches.indices(s) for s in range(3)])
  assert sorted(epoch) == list(range(12))
  assert list(epoch) != list(range(12))


def test_batch_level_batches_are_consecutive_and_windows_permuted():
  b, window = 4, 3
  src = pipeline.with_train_shuffle(_source(1000), 'batches', window)
  batches = pipeline.TrainBatches(src, b, seed=0)
  stream_batches = []
  for step in range(3 * window):
    idx = batches.indices(step)
    # Fixed composition: b consecutive examples in stored order.
    np.testing.assert_array_equal(idx, idx[0] + np.arange(b))
    assert idx[0] % b == 0
    stream_batches.append(idx[0] // b)
  # Each window of steps holds exactly its window of stream batches.
  for w in range(3):
    assert sorted(stream_batches[w * window:(w + 1) * window]) == list(
        range(w * window, (w + 1) * window))
  assert stream_batches != list(range(3 * window))


def test_batch_level_repeats_the_split_across_epochs():
  # 10 examples, batches of 4: stream batch 2 holds examples 8, 9, 0, 1.
  src = pipeline.with_train_shuffle(_source(10), 'batches', 1)
  batches = pipeline.TrainBatches(src, 4, seed=0)
  np.testing.assert_array_equal(batches.indices(2), [8, 9, 0, 1])
  np.testing.assert_array_equal(batches.indices(3), [2, 3, 4, 5])


def test_batch_level_is_deterministic_and_resumable():
  src = pipeline.with_train_shuffle(_source(50), 'batches', 4)
  a = pipeline.TrainBatches(src, 5, seed=3)
  fresh = pipeline.TrainBatches(src, 5, seed=3)
  other = pipeline.TrainBatches(src, 5, seed=4)
  for step in (0, 7, 3, 11):  # Any order: no hidden iterator state.
    np.testing.assert_array_equal(a.indices(step), fresh.indices(step))
  assert any(not np.array_equal(a.indices(s), other.indices(s))
             for s in range(8))
  np.testing.assert_array_equal(a.get(2)['targets'], a.indices(2))


def test_shuffle_validation():
  with pytest.raises(ValueError, match='positive window'):
    pipeline.TrainShuffle('batches', 0)
  with pytest.raises(ValueError, match='takes 0'):
    pipeline.TrainShuffle('examples', 5)
  with pytest.raises(ValueError, match='valid'):
    pipeline.TrainShuffle('pixels', 0)


def test_ragged_source_pads_truncates_and_offsets():
  seqs = [np.array([0, 1, 2], np.uint8), np.array([], np.uint8),
          np.array([255] * 7, np.uint8)]
  src = pipeline.RaggedSource({'inputs': seqs}, {'targets': np.arange(3)},
                              length=5, id_offset=1)
  batch = src.get(np.array([2, 0, 1]))
  assert batch['inputs'].dtype == np.int32
  np.testing.assert_array_equal(batch['inputs'], [[256] * 5,
                                                  [1, 2, 3, 0, 0],
                                                  [0] * 5])
  np.testing.assert_array_equal(batch['targets'], [2, 0, 1])
  np.testing.assert_array_equal(src.lengths('inputs'), [3, 0, 5])


def test_the_window_applies_to_batch_level_shuffling_only():
  examples = pipeline.with_train_shuffle(_source(10), 'examples', 256)
  assert examples.train_shuffle == pipeline.TrainShuffle('examples', 0)
  batches = pipeline.with_train_shuffle(_source(10), 'batches', 256)
  assert batches.train_shuffle == pipeline.TrainShuffle('batches', 256)
