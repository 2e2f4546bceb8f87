"""Text (IMDb) pipeline on examples served as TFDS would."""

import numpy as np
import pytest

from lra_msmra.data import text
from tests.data.helpers import needs_tfds_extra
from tests.data.helpers import serve_examples
from tests.data.helpers import task_config

REVIEWS = {
    'train': {'text': np.array([b'Great <br />film', 'Très bon'.encode(),
                                b'x' * 50], dtype=object),
              'label': np.array([1, 1, 0], np.int64)},
    'test': {'text': np.array([b'Awful', b'ok'], dtype=object),
             'label': np.array([0, 1], np.int64)},
}


def _ids(raw, length):
  ids = [b + 1 for b in raw][:length]
  return ids + [0] * (length - len(ids))


def test_batches_exact_ids_and_validation_is_test(tmp_path, monkeypatch):
  config = task_config('text', data_dir=str(tmp_path), max_length=12)
  serve_examples(monkeypatch, REVIEWS)
  data = text.get_datasets(config, str(tmp_path))
  assert (data.vocab_size, data.num_classes, data.max_len) == (257, 2, 12)
  assert not data.dual
  assert [len(data.train), len(data.eval), len(data.test)] == [3, 2, 2]
  assert data.eval is data.test  # P5.
  assert data.notes['validation_is_test'] is True
  assert data.notes['data_source'] == 'release'
  batch = data.train.get(np.arange(3))
  assert set(batch) == {'inputs', 'targets'}
  assert batch['inputs'].shape == (3, 12)
  assert batch['inputs'].dtype == np.int32
  assert batch['targets'].dtype == np.int32
  assert batch['inputs'][0].tolist() == _ids(b'Great <br />film', 12)
  # HTML is kept: '<' is byte 60, id 61.
  assert batch['inputs'][0, 6] == 61
  # Multi-byte UTF-8: 'è' = 0xc3 0xa8 -> ids 196, 169.
  assert batch['inputs'][1, 2:4].tolist() == [196, 169]
  assert batch['inputs'][2].tolist() == [121] * 12  # truncated
  assert batch['targets'].tolist() == [1, 1, 0]
  assert data.test.get(np.array([1]))['inputs'][0].tolist() == _ids(b'ok', 12)


def test_papers_length_and_xiong_padding(tmp_path, monkeypatch):
  assert text.get_model_spec(task_config('text', None))['max_len'] == 1000
  config = task_config('text', 'xiong', data_dir=str(tmp_path))
  assert config.data.max_length == 4000
  serve_examples(monkeypatch, REVIEWS)
  data = text.get_datasets(config, str(tmp_path))
  assert data.max_len == 4096
  assert data.train.get(np.array([0]))['inputs'].shape == (1, 4096)


def test_runlocal_generated_reviews_are_learnable_format(tmp_path):
  config = task_config('text', generator={'num_train': 40, 'num_test': 10})
  data = text.get_datasets(config, str(tmp_path))
  assert data.notes['data_source'] == 'mock'
  assert (len(data.train), len(data.test)) == (40, 10)
  texts, labels = text.synthetic_reviews(40, 0)
  batch = data.train.get(np.arange(40))
  assert batch['targets'].tolist() == labels.tolist()
  assert batch['inputs'][0].tolist() == _ids(texts[0], 256)
  assert all(b'<br />' in t for t in texts)


def test_bad_label_and_missing_folder(tmp_path, monkeypatch):
  bad = {'train': dict(REVIEWS['train'], label=np.array([1, 7, 0])),
         'test': REVIEWS['test']}
  config = task_config('text', data_dir=str(tmp_path))
  with monkeypatch.context() as m:
    serve_examples(m, bad)
    with pytest.raises(ValueError, match='imdb_reviews train: label 7'):
      text.get_datasets(config, str(tmp_path))
  config.data_dir = str(tmp_path / 'missing')
  with pytest.raises(FileNotFoundError, match='not a directory'):
    text.get_datasets(config, str(tmp_path))


@needs_tfds_extra
def test_a_dataset_tfds_does_not_find_is_named(tmp_path):
  config = task_config('text', data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match="'imdb_reviews' is not "
                     'prepared'):
    text.get_datasets(config, str(tmp_path))
