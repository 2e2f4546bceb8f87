"""Image (CIFAR-10) pipeline on examples served as TFDS would, and
TF-exact grayscale."""

import numpy as np
import pytest

from lra_msmra.data import image
from tests.data.helpers import needs_tfds_extra
from tests.data.helpers import serve_examples
from tests.data.helpers import task_config


@needs_tfds_extra
def test_grayscale_matches_tensorflow_on_every_rgb_triple():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # All 2^24 triples: every rounding edge case of the truncating cast.
  v = np.arange(256, dtype=np.uint8)
  for r in range(0, 256, 64):  # Four chunks keep memory small.
    grid = np.stack(np.meshgrid(v[r:r + 64], v, v, indexing='ij'), -1)
    expected = tf.image.rgb_to_grayscale(grid).numpy()[..., 0]
    np.testing.assert_array_equal(image.rgb_to_grayscale(grid), expected)


def test_grayscale_known_values_and_pil_difference():
  rgb = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255],
                  [1, 1, 1], [0, 0, 0]], np.uint8)
  assert image.rgb_to_grayscale(rgb).tolist() == [76, 149, 29, 255, 1, 0]
  # PIL's rounding formula gives 76, 150, 29, 255, 1, 0: 1 off on green.
  x = rgb.astype(np.int64)
  pil = (299 * x[:, 0] + 587 * x[:, 1] + 114 * x[:, 2] + 500) // 1000
  assert pil.tolist() == [76, 150, 29, 255, 1, 0]


def _examples(num_train, num_test):
  rng = np.random.default_rng(0)
  out = {}
  for split, n in (('train', num_train), ('test', num_test)):
    out[split] = {
        'image': rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8),
        'label': np.arange(n, dtype=np.int64) % 10,
        'id': np.array([f'{split}_{i}'.encode() for i in range(n)],
                       dtype=object)}
  return out


def test_splits_tokens_and_notes(tmp_path, monkeypatch):
  examples = _examples(20, 5)
  config = task_config('image', None, data_dir=str(tmp_path))
  serve_examples(monkeypatch, examples)
  data = image.get_datasets(config, str(tmp_path))
  # train[:90%] / train[90%:] / test, in stored order.
  assert [len(data.train), len(data.eval), len(data.test)] == [18, 2, 5]
  assert (data.vocab_size, data.num_classes, data.max_len) == (256, 10, 1024)
  batch = data.eval.get(np.array([1]))
  assert set(batch) == {'inputs', 'targets'}
  assert batch['inputs'].shape == (1, 1024)
  assert batch['inputs'].dtype == np.int32
  # Example 19 of train, row-major grayscale (TF's, see above).
  expected = image.rgb_to_grayscale(examples['train']['image'][19])
  np.testing.assert_array_equal(batch['inputs'][0], expected.reshape(-1))
  assert batch['targets'].tolist() == [9]
  assert data.notes['train_shuffle'].startswith('batches')
  assert data.notes['zero_id_is_padding'] is True  # P8
  assert data.notes['pooling'] == 'CLS'
  assert data.train.train_shuffle.window == image.BATCH_SHUFFLE_WINDOW


def test_xiong_uses_example_shuffling(tmp_path, monkeypatch):
  config = task_config('image', 'xiong', data_dir=str(tmp_path))
  serve_examples(monkeypatch, _examples(10, 2))
  data = image.get_datasets(config, str(tmp_path))
  assert data.train.train_shuffle.level == 'examples'
  assert data.notes['pooling'] == 'MEAN'
  assert data.max_len == 1024


def test_runlocal_generated_images(tmp_path):
  config = task_config('image', generator={'num_train': 30, 'num_test': 10})
  data = image.get_datasets(config, str(tmp_path))
  assert [len(data.train), len(data.eval), len(data.test)] == [27, 3, 10]
  images, labels = image.synthetic_images(30, 0)
  batch = data.train.get(np.arange(27))
  assert batch['targets'].tolist() == labels[:27].tolist()
  np.testing.assert_array_equal(
      batch['inputs'], image.rgb_to_grayscale(images[:27]).reshape(27, -1))


def test_bad_label_and_empty_split_are_errors(tmp_path, monkeypatch):
  examples = _examples(10, 2)
  examples['test']['label'][1] = 12
  config = task_config('image', data_dir=str(tmp_path))
  serve_examples(monkeypatch, examples)
  with pytest.raises(ValueError, match='cifar10 test: label 12'):
    image.get_datasets(config, str(tmp_path))
  # 4 generated training images leave train[90%:] empty.
  config = task_config('image', generator={'num_train': 4, 'num_test': 2})
  with pytest.raises(ValueError, match=r'cifar10 train\[90%:\]: the split '
                     'has no examples'):
    image.get_datasets(config, str(tmp_path))
