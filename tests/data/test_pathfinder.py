"""Pathfinder / Path-X pipeline on tiny PNG trees in the release layout."""

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_datasets.core import hashing
from tensorflow_datasets.core import splits as tfds_splits

from lra_msmra.data import pathfinder
from lra_msmra.data import pathfinder_generator
from tests.data.helpers import task_config
from tests.data.helpers import write_release


def test_order_and_split_follow_tfds():
  keys = [f'imgs/{i % 3}_sample_{i}.png_{i // 3 + 1}' for i in range(50)]
  hasher = hashing.Hasher(salt='hard')
  expected = sorted(range(50), key=lambda i: hasher.hash_key(keys[i]))
  assert pathfinder.tfds_order(keys, 'hard').tolist() == expected
  for n in (10, 11, 15, 25, 199999):
    sizes = {'hard': type('I', (), {'num_examples': n})}
    # LRA's slices of the 'hard' split.
    for spec, (lo, hi) in zip(('hard[:80%]', 'hard[80%:90%]', 'hard[90%:]'),
                              pathfinder.SPLIT_PERCENTS.values()):
      (abs_instr,) = tfds_splits.ReadInstruction.from_spec(spec).to_absolute(
          sizes)
      assert (pathfinder.percent_boundary(lo, n),
              pathfinder.percent_boundary(hi, n)) == (
                  abs_instr.from_ or 0,
                  n if abs_instr.to is None else abs_instr.to)


def test_batches_exact_tokens_and_empty_pngs(tmp_path):
  folder, truth = write_release(str(tmp_path))
  config = task_config('pathfinder', None, data_dir=str(tmp_path))
  data = pathfinder.get_datasets(config, str(tmp_path / 'work'))
  assert (data.vocab_size, data.num_classes, data.max_len) == (256, 2, 1024)
  # 20 listed -> 16 / 2 / 2 by TFDS slicing, then the empty PNG is dropped.
  listed = pathfinder.split_examples(pathfinder.read_metadata(folder), 'hard')
  assert [len(v) for v in listed.values()] == [16, 2, 2]
  sizes = [len(data.train), len(data.eval), len(data.test)]
  assert sum(sizes) == 19
  assert sum(data.notes['empty_pngs_skipped'].values()) == 1
  for name, source in (('train', data.train), ('eval', data.eval),
                       ('test', data.test)):
    kept = [e for e in listed[name] if truth[e.image] is not None]
    batch = source.get(np.arange(len(kept)))
    assert batch['inputs'].dtype == np.int32
    assert batch['inputs'].shape == (len(kept), 1024)
    for row, e in enumerate(kept):
      pixels, label = truth[e.image]
      np.testing.assert_array_equal(batch['inputs'][row], pixels.reshape(-1))
      assert batch['targets'][row] == label
  assert data.notes['train_shuffle'].startswith('batches')
  assert data.notes['pooling'] == 'MEAN'


def test_metadata_keys_are_lra_keys(tmp_path):
  folder, _ = write_release(str(tmp_path), num=10, per_folder=4)
  examples = pathfinder.read_metadata(folder)
  assert [e.key for e in examples[:5]] == [
      'imgs/0_sample_0.png_1', 'imgs/0_sample_1.png_2',
      'imgs/0_sample_2.png_3', 'imgs/0_sample_3.png_4',
      'imgs/1_sample_4.png_1']


def test_generated_runlocal_data_round_trips(tmp_path):
  # data.generate: our generator writes the configured set into the workdir.
  config = task_config('pathfinder', generator={'num_examples': 20},
                       difficulty='easy')
  data = pathfinder.get_datasets(config, str(tmp_path))
  assert data.notes['data_source'] == 'generated'
  gen = data.notes['generator']
  assert (gen['num_examples'], gen['seed'], gen['difficulty'],
          gen['resolution']) == (20, 0, 'easy', 32)
  assert gen['settings']['contour_length'] == 6
  assert sum(data.notes['empty_pngs_skipped'].values()) == 0
  assert len(data.train) + len(data.eval) + len(data.test) == 20
  # The images are the generator's, in TFDS order.
  folder = data.notes['data_dir']
  test = pathfinder.split_examples(pathfinder.read_metadata(folder),
                                   'easy')['test']
  s = pathfinder_generator.settings(32, 'easy')
  batch = data.test.get(np.arange(len(test)))
  for row, example in enumerate(test):
    n = int(example.image.split('_')[-1][:-len('.png')])
    pixels, label, _ = pathfinder_generator.generate_image(s, 0, 'easy', n)
    np.testing.assert_array_equal(batch['inputs'][row], pixels.reshape(-1))
    assert batch['targets'][row] == label
  # The same folder read through data_dir is still recorded as generated.
  config = task_config('pathfinder', None, data_dir=str(tmp_path / 'data' /
                                                        'pathfinder'),
                       difficulty='easy')
  again = pathfinder.get_datasets(config, str(tmp_path / 'other'))
  assert again.notes['data_source'] == 'generated'
  assert again.notes['generator'] == gen


def test_an_unfinished_generated_set_is_refused(tmp_path):
  folder = pathfinder.generate_dataset(str(tmp_path), resolution=32,
                                       difficulty='easy', num_examples=10,
                                       seed=0)
  (tmp_path / 'pathfinder32' / 'curv_baseline' / 'generating.json').write_text(
      '{}')
  _fails(tmp_path, f'{folder} is a generated set that was not finished',
         difficulty='easy')


def test_earlier_mock_data_in_a_workdir_is_replaced(tmp_path):
  # Workdirs of earlier versions hold mock images stamped at the root.
  root = tmp_path / 'data' / 'pathfinder'
  write_release(str(root), difficulty='easy', num=10, empty=())
  (root / 'generator.json').write_text('{"spec": {"version": 1}}')
  config = task_config('pathfinder', generator={'num_examples': 10},
                       difficulty='easy')
  data = pathfinder.get_datasets(config, str(tmp_path))
  assert data.notes['data_source'] == 'generated'
  assert not (root / 'generator.json').exists()


def test_pathx_reads_pathfinder128_hard(tmp_path):
  write_release(str(tmp_path), resolution=128, num=10, empty=())
  config = task_config('pathx', None, data_dir=str(tmp_path))
  assert (config.data.resolution, config.data.difficulty) == (128, 'hard')
  data = pathfinder.get_datasets(config, str(tmp_path))
  assert data.max_len == 16384
  assert data.test.get(np.array([0]))['inputs'].shape == (1, 16384)


def test_xiong_difficulty_and_padding(tmp_path):
  write_release(str(tmp_path), difficulty='intermediate', num=10, empty=())
  config = task_config('pathfinder', 'xiong', data_dir=str(tmp_path),
                       difficulty='intermediate')
  data = pathfinder.get_datasets(config, str(tmp_path))
  assert data.train.train_shuffle.level == 'examples'
  assert 'curv_contour_length_9' in data.notes['data_dir']


def _fails(tmp_path, message, **overrides):
  overrides.setdefault('data_dir', str(tmp_path))
  config = task_config('pathfinder', None, **overrides)
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    pathfinder.get_datasets(config, str(tmp_path))


def test_corrupt_and_wrong_shape_pngs_name_the_file(tmp_path):
  folder, _ = write_release(str(tmp_path), num=20, empty=())
  bad = os.path.join(folder, 'imgs/0/sample_2.png')
  with open(bad, 'wb') as f:
    f.write(b'\x89PNG\r\n\x1a\nnot really')
  _fails(tmp_path, f'{bad}: cannot decode')
  pathfinder.write_png(bad, np.zeros((16, 32), np.uint8))
  _fails(tmp_path, f'{bad}: expected a 32x32 single-channel')
  rgb = tf.io.encode_png(np.zeros((32, 32, 3), np.uint8)).numpy()
  with open(bad, 'wb') as f:
    f.write(rgb)
  _fails(tmp_path, 'got shape \\(32, 32, 3\\)')
  os.remove(bad)
  _fails(tmp_path, f'{bad}: image listed in the metadata is missing')


def test_malformed_metadata_and_missing_folders(tmp_path):
  folder, _ = write_release(str(tmp_path), num=20, empty=())
  meta = os.path.join(folder, 'metadata', '0.npy')
  with open(meta, 'a') as f:
    f.write('imgs/0 sample_9.png 9 2 1.0\n')
  _fails(tmp_path, f'{meta}:9: label \\(field 3\\) \'2\' is not 0 or 1')
  with open(meta, 'w') as f:
    f.write('imgs/0 sample_0.png\n')
  _fails(tmp_path, f'{meta}:1: expected at least 4')
  _fails(tmp_path, 'curv_baseline/metadata not found', difficulty='easy')
  _fails(tmp_path, 'not a directory', data_dir=str(tmp_path / 'x'))
  with pytest.raises(ValueError, match='resolution=48'):
    pathfinder.get_model_spec(task_config('pathfinder', resolution=48))


def test_outer_release_folder_with_two_pathfinder128_copies_is_refused(
    tmp_path):
  # The nested archive: <outer>/pathfinder128 beside <outer>/lra_release/.
  write_release(str(tmp_path), resolution=128, difficulty='hard', num=8,
                empty=())
  write_release(str(tmp_path / 'lra_release'), resolution=128,
                difficulty='hard', num=8, empty=())
  config = task_config('pathx', None, data_dir=str(tmp_path))
  with pytest.raises(ValueError, match='two copies of pathfinder128') as e:
    pathfinder.get_datasets(config, str(tmp_path))
  assert str(tmp_path / 'lra_release' / 'pathfinder128') in str(e.value)
  # Pointing at the inner folder reads it.
  config = task_config('pathx', None,
                       data_dir=str(tmp_path / 'lra_release'))
  assert pathfinder.get_datasets(config, str(tmp_path)).notes[
      'data_source'] == 'release'
