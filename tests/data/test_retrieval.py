"""Retrieval pipeline on tiny TSVs in the official AAN format."""

import os

import numpy as np
import pytest

from lra_msmra.data import pipeline
from lra_msmra.data import retrieval
from tests.data.helpers import task_config

ROWS = {
    'train': [(1, 'A1', 'B1', 'ab', 'héllo'), (0, 'A2', 'B2', 'x' * 20, 'y'),
              (1, 'A3', 'B3', 'cc', 'dd'), (0, 'A4', 'B4', 'e', '')],
    'eval': [(0, 'C1', 'D1', 'q', 'r'), (1, 'C2', 'D2', 's', 't')],
    'test': [(1, 'E1', 'F1', 'u', 'v')],
}


def _write(folder, rows=ROWS):
  os.makedirs(folder, exist_ok=True)
  for split, r in rows.items():
    retrieval.write_tsv(retrieval.split_path(folder, split), r)
  return folder


def _ids(text, length):
  ids = [b + 1 for b in text.encode('utf-8')][:length]
  return ids + [0] * (length - len(ids))


def test_batches_exact_ids_and_dtypes(tmp_path):
  folder = _write(str(tmp_path / 'tsv_data'))
  # data_dir may be the prepared folder holding tsv_data/.
  config = task_config('retrieval', data_dir=str(tmp_path), max_length=8)
  data = retrieval.get_datasets(config, str(tmp_path / 'work'))
  assert data.dual and data.vocab_size == 257 and data.num_classes == 2
  assert data.max_len == config.data.max_length == 8
  assert [len(data.train), len(data.eval), len(data.test)] == [4, 2, 1]
  assert data.notes['data_dir'] == folder
  batch = data.train.get(np.arange(4))
  assert set(batch) == {'inputs', 'inputs2', 'targets'}
  for key in ('inputs', 'inputs2'):
    assert batch[key].shape == (4, 8) and batch[key].dtype == np.int32
  assert batch['inputs'][0].tolist() == [98, 99, 0, 0, 0, 0, 0, 0]
  # 'é' is two UTF-8 bytes (0xc3 0xa9): ids 196 and 170.
  assert batch['inputs2'][0].tolist() == _ids('héllo', 8)
  assert batch['inputs2'][0, 1:3].tolist() == [196, 170]
  assert batch['inputs'][1].tolist() == [121] * 8  # Truncated 'x' * 20.
  assert batch['inputs2'][3].tolist() == [0] * 8  # Empty document.
  assert batch['targets'].tolist() == [1, 0, 1, 0]
  assert batch['inputs'].max() < data.vocab_size


def test_lra_and_xiong_lengths(tmp_path):
  _write(str(tmp_path))
  lra = retrieval.get_model_spec(task_config('retrieval', None))
  xiong = retrieval.get_model_spec(task_config('retrieval', 'xiong'))
  assert (lra['max_len'], xiong['max_len']) == (4000, 4096)
  config = task_config('retrieval', 'xiong', data_dir=str(tmp_path))
  data = retrieval.get_datasets(config, str(tmp_path))
  batch = data.test.get(np.array([0]))
  assert batch['inputs'].shape == (1, 4096)
  assert data.notes['dual_interaction'] == 'nli'
  assert data.notes['pooling'] == 'MEAN'


def test_label_floats_and_crlf(tmp_path):
  path = str(tmp_path / 'x.tsv')
  with open(path, 'wb') as f:
    f.write(b'1.0\ta\tb\tab\tcd\r\n0\ta\tb\tef\tgh\r\n')
  t1, t2, labels = retrieval.read_tsv(path)
  assert labels.tolist() == [1, 0]
  assert bytes(t2[0]) == b'cd' and bytes(t1[1]) == b'ef'


def test_keeps_first_10000_bytes(tmp_path):
  path = str(tmp_path / 'x.tsv')
  retrieval.write_tsv(path, [(1, 'a', 'b', 'z' * 12000, 'w')])
  t1, _, _ = retrieval.read_tsv(path)
  assert len(t1[0]) == 10000


@pytest.mark.parametrize('line,message', [
    (b'1\ta\tb\tonly four\n', 'expected 5 tab-separated columns'),
    (b'2\ta\tb\tc\td\n', "label b'2' is not 0 or 1"),
    (b'yes\ta\tb\tc\td\n', "label b'yes' is not 0 or 1"),
    (b'1\ta\tb\tc\td\n\n', 'empty line'),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
  path = str(tmp_path / 'bad.tsv')
  with open(path, 'wb') as f:
    f.write(line)
  with pytest.raises(ValueError, match=message) as e:
    retrieval.read_tsv(path)
  assert f'{path}:' in str(e.value)


def test_missing_file_and_folder(tmp_path):
  _write(str(tmp_path), {'train': ROWS['train'], 'eval': ROWS['eval']})
  config = task_config('retrieval', data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match='new_aan_pairs.test.tsv'):
    retrieval.get_datasets(config, str(tmp_path))
  config = task_config('retrieval', data_dir=str(tmp_path / 'nope'))
  with pytest.raises(FileNotFoundError, match='not a directory'):
    retrieval.get_datasets(config, str(tmp_path))


def test_generated_runlocal_data_round_trips(tmp_path):
  config = task_config('retrieval', generator={'num_train': 16,
                                              'num_valid': 8, 'num_test': 8})
  data = retrieval.get_datasets(config, str(tmp_path))
  assert data.notes['data_source'] == 'mock'
  paths = [retrieval.split_path(data.notes['data_dir'], s)
           for s in ('train', 'eval', 'test')]
  _, _, labels = retrieval.read_tsv(paths[0])
  with open(paths[0], 'rb') as f:
    assert len(f.readline().split(b'\t')) == 5
  batches = pipeline.TrainBatches(data.train, 8, seed=0)
  assert sorted(np.concatenate([batches.get(s)['targets'] for s in (0, 1)])
                ) == sorted(labels)


def test_unknown_data_key_is_an_error():
  config = task_config('retrieval')
  config.data.tokenizer = 'char'
  with pytest.raises(ValueError, match="unknown \\['tokenizer'\\]"):
    retrieval.get_model_spec(config)
