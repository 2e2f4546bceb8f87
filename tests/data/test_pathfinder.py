"""Pathfinder / Path-X pipeline on tiny PNG trees in the release layout.

The PNG decoder (`pathfinder.decode_png`, Pillow) is checked here without
TensorFlow on files of every kind, with the pixels and refusals that
TensorFlow's `tf.io.decode_png` (LRA's decoder) gives them; the tests marked
`extras` compare it with TensorFlow itself, file by file.
"""

import io
import os
import struct
import zlib

import numpy as np
import pytest

from lra_msmra.data import pathfinder
from lra_msmra.data import pathfinder_generator
from lra_msmra.data import png
from lra_msmra.data import splits
from tests.data.helpers import make_png
from tests.data.helpers import needs_tfds_extra
from tests.data.helpers import png_chunk
from tests.data.helpers import task_config
from tests.data.helpers import write_release

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'pathfinder_fixture')
# Keys in LRA's format and their order in a TFDS split (computed with
# tfds.core.hashing, see test_order_is_tfds_order).
KEYS = [f'imgs/{i % 3}_sample_{i}.png_{i // 3 + 1}' for i in range(12)]
TFDS_ORDER = {'hard': [9, 10, 6, 7, 0, 1, 3, 2, 5, 11, 8, 4],
              'easy': [5, 9, 6, 0, 1, 3, 10, 8, 2, 4, 11, 7]}


def test_order_is_pinned():
  for salt, order in TFDS_ORDER.items():
    assert pathfinder.tfds_order(KEYS, salt).tolist() == order


@needs_tfds_extra
def test_order_is_tfds_order():
  from tensorflow_datasets.core import hashing  # pylint: disable=g-import-not-at-top
  keys = [f'imgs/{i % 3}_sample_{i}.png_{i // 3 + 1}' for i in range(50)]
  for salt in ('hard', 'easy'):
    hasher = hashing.Hasher(salt=salt)
    expected = sorted(range(50), key=lambda i: hasher.hash_key(keys[i]))
    assert pathfinder.tfds_order(keys, salt).tolist() == expected
    assert sorted(range(12), key=lambda i: hasher.hash_key(KEYS[i])) == (
        TFDS_ORDER[salt])


def test_split_sizes_are_tfds_percent_slices():
  # LRA's `[:80%]`, `[80%:90%]`, `[90%:]` of the difficulty's split
  # (lra_msmra.data.splits, compared with TFDS in test_splits.py).
  for n in (10, 11, 15, 25, 199999):
    examples = [pathfinder.Example(k, k, 0) for k in map(str, range(n))]
    sizes = [len(v) for v in pathfinder.split_examples(examples,
                                                       'hard').values()]
    bounds = [slice_.stop - slice_.start for slice_ in (
        splits.to_absolute(spec, {'hard': n})[0]
        for spec in ('hard[:80%]', 'hard[80%:90%]', 'hard[90%:]'))]
    assert sizes == bounds and sum(sizes) == n


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
  png.write(bad, np.zeros((16, 32), np.uint8))
  _fails(tmp_path, f'{bad}: expected a 32x32 single-channel')
  with open(bad, 'wb') as f:
    f.write(make_png(np.zeros((32, 32, 3), np.uint8), colour=2))
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


# ------------------------------------------------------------ the decoder


def _decode(data, resolution):
  """('ok', pixels) or ('refused', message) of `pathfinder.decode_png`."""
  try:
    return 'ok', pathfinder.decode_png(data, 'dir/x.png', resolution)
  except ValueError as e:
    message = str(e)
    assert message.startswith('dir/x.png: ') and '\n' not in message
    return 'refused', message


def _refused(data, resolution, match):
  status, message = _decode(data, resolution)
  assert status == 'refused', match
  assert match in message, message


@pytest.mark.parametrize('resolution,difficulty,count',
                         [(32, 'easy', 4), (32, 'hard', 4), (128, 'hard', 2)])
def test_decoder_on_the_pinned_generator_images(resolution, difficulty,
                                                count):
  # Files written by `prepare --generate_pathfinder` (the fixture's README).
  folder = pathfinder.folder_path(FIXTURE, resolution, difficulty)
  s = pathfinder_generator.settings(resolution, difficulty)
  for n in range(count):
    with open(os.path.join(folder, f'imgs/0/sample_{n}.png'), 'rb') as f:
      data = f.read()
    pixels, _, _ = pathfinder_generator.generate_image(s, 0, difficulty, n)
    decoded = pathfinder.decode_png(data, 'x', resolution)
    assert decoded.dtype == np.uint8
    np.testing.assert_array_equal(decoded, pixels.reshape(-1))


def test_decoder_bit_depths_interlacing_and_filters():
  rng = np.random.default_rng(0)
  for depth in (1, 2, 4, 8, 16):
    values = rng.integers(0, 2 ** depth, (8, 8))
    # libpng expands 1, 2 and 4 bits to 0..255; TF keeps the high byte of
    # 16 bits (test_decoder_equals_tensorflow checks both).
    expected = (values >> 8 if depth == 16 else
                values * (255 // (2 ** depth - 1))).astype(np.uint8)
    for interlace in (False, True):
      status, pixels = _decode(
          make_png(values, bit_depth=depth, interlace=interlace), 8)
      assert status == 'ok', (depth, interlace, pixels)
      np.testing.assert_array_equal(pixels, expected.reshape(-1))
  # Row filters (here Sub, Up, Average, Paeth as encoders choose them).
  from PIL import Image  # pylint: disable=g-import-not-at-top
  image = (np.add.outer(np.arange(32), 3 * np.arange(32)) % 256).astype(
      np.uint8)
  image[5:9] = rng.integers(0, 256, (4, 32))
  out = io.BytesIO()
  Image.fromarray(image).save(out, 'PNG', optimize=True)
  assert _decode(out.getvalue(), 32)[1].tolist() == image.reshape(-1).tolist()


def test_decoder_takes_gray_and_refuses_other_colour_types():
  gray = np.arange(64).reshape(8, 8)
  # A tRNS chunk is ignored, as by TF; so are other ancillary chunks.
  trns = png_chunk(b'tRNS', b'\x00\x05') + png_chunk(b'gAMA', b'\0\0\xb1\x8f')
  assert _decode(make_png(gray, before_idat=trns), 8)[1].tolist() == list(
      range(64))
  # TF's channels: gray + alpha 2, RGB 3, RGBA 4, palette 3 (4 with tRNS).
  for samples, colour, depth, channels in (
      (np.zeros((8, 8, 2)), 4, 8, 2), (np.zeros((8, 8, 2)), 4, 16, 2),
      (np.zeros((8, 8, 3)), 2, 8, 3), (np.zeros((8, 8, 3)), 2, 16, 3),
      (np.zeros((8, 8, 4)), 6, 8, 4)):
    _refused(make_png(samples, colour=colour, bit_depth=depth), 8,
             f'single-channel image, got shape (8, 8, {channels})')
  palette = bytes(range(12))
  _refused(make_png(np.zeros((8, 8)), colour=3, palette=palette), 8,
           'got shape (8, 8, 3)')
  _refused(make_png(np.zeros((8, 8)), colour=3, palette=palette,
                    before_idat=png_chunk(b'tRNS', b'\x00')), 8,
           'got shape (8, 8, 4)')
  _refused(make_png(np.zeros((8, 16))), 8, 'got shape (8, 16, 1)')
  _refused(make_png(np.zeros((8, 8))), 16, 'expected a 16x16')


def test_decoder_refuses_what_libpng_refuses():
  good = make_png(np.arange(64).reshape(8, 8), idat_size=20)
  assert _decode(good, 8)[0] == 'ok'
  # Cut anywhere: Pillow alone decodes a file cut after its image data.
  for cut in range(len(good)):
    _refused(good[:cut], 8, 'cannot decode the PNG')
  # A wrong CRC in a critical chunk; in an ancillary one (skipped) it is
  # fine, which Pillow alone refuses.
  flipped = bytearray(good)
  flipped[good.index(b'IDAT') + 6] ^= 1
  _refused(bytes(flipped), 8, 'CRC error in chunk IDAT')
  text = png_chunk(b'tEXt', b'a\x00b')
  assert _decode(make_png(np.zeros((8, 8)), before_idat=text[:-1] + b'?'),
                 8)[0] == 'ok'
  for data, match in (
      (b'\xff\xd8\xff\xe0' + bytes(100), 'not a PNG file'),  # A JPEG.
      (make_png(np.zeros((8, 8)), before_idat=png_chunk(b'ABCD', b'')),
       'unknown critical chunk ABCD'),
      (make_png(np.zeros((8, 8)), zlib_data=zlib.compress(bytes(9 * 7))),
       'not enough image data'),
      (make_png(np.zeros((8, 8)), zlib_data=zlib.compress(bytes(72))[:-4]),
       'not enough image data'),
      (make_png(np.zeros((8, 8)), zlib_data=zlib.compress(bytes(72))[:-1]
                + b'?'), 'incorrect data check'),
      (make_png(np.zeros((8, 8)), filter_type=7), 'cannot decode the PNG'),
      (make_png(np.zeros((8, 8)), bit_depth=3), 'bad IHDR'),
      (png.PNG_SIGNATURE + text + good[8:], 'IHDR is not the first'),
  ):
    _refused(data, 8, match)
  # What libpng lets through: data after IEND, bytes after the zlib stream,
  # more image data than needed, an unknown ancillary chunk before IHDR.
  for data in (good + b'junk',
               make_png(np.zeros((8, 8)),
                        zlib_data=zlib.compress(bytes(72)) + b'junk'),
               make_png(np.zeros((8, 8)), extra_data=bytes(50)),
               png.PNG_SIGNATURE + png_chunk(b'abCd', b'') + good[8:]):
    assert _decode(data, 8)[0] == 'ok'


def test_check_pngs_lists_empty_and_bad_files(tmp_path, monkeypatch):
  files = {'good.png': make_png(np.zeros((8, 8))), 'empty.png': b'',
           'rgb.png': make_png(np.zeros((8, 8, 3)), colour=2),
           'cut.png': make_png(np.zeros((8, 8)))[:-5]}
  for name, data in files.items():
    (tmp_path / name).write_bytes(data)
  paths = [str(tmp_path / n) for n in [*files, 'missing.png']]
  empty, problems = pathfinder.check_pngs(paths, 8, workers=2)
  assert empty == [str(tmp_path / 'empty.png')]
  assert sorted(problems) == sorted([
      f'{tmp_path / "rgb.png"}: expected a 8x8 single-channel image, got '
      'shape (8, 8, 3).',
      f'{tmp_path / "cut.png"}: cannot decode the PNG (truncated (no IEND '
      'chunk)).',
      f'{tmp_path / "missing.png"}: image listed in the metadata is missing.'])
  # Read in many batches ahead of the decoding: the same, in path order.
  monkeypatch.setattr(pathfinder, '_CHECK_BATCH', 1)
  many = paths * 7
  for workers in (1, 3):
    again = pathfinder.check_pngs(many, 8, workers=workers)
    assert again == (empty * 7, problems * 7)


def _tf_decode(data, resolution):
  """What LRA's decoder makes of a file: ('ok', pixels [R * R]) or
  ('refused', why)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    image = tf.io.decode_png(data, channels=0).numpy()
  except tf.errors.OpError:
    return 'refused', 'cannot decode'
  if image.shape != (resolution, resolution, 1):
    return 'refused', f'shape {image.shape}'
  return 'ok', image.reshape(-1)


def _same_as_tensorflow(data, resolution, what):
  ours, theirs = _decode(data, resolution), _tf_decode(data, resolution)
  assert ours[0] == theirs[0], (what, ours[1], theirs[1])
  if ours[0] == 'ok':
    assert ours[1].dtype == theirs[1].dtype == np.uint8
    np.testing.assert_array_equal(ours[1], theirs[1], err_msg=what)


def _variants(data, rng):
  """`data` cut at some places, with bytes flipped, with chunks put in."""
  yield 'intact', data
  for cut in sorted(set(rng.integers(0, len(data), 40).tolist()) |
                    set(range(max(len(data) - 30, 0), len(data)))):
    yield f'cut at {cut}', data[:cut]
  for _ in range(60):
    flipped = bytearray(data)
    for i in rng.integers(0, len(data), int(rng.integers(1, 4))):
      flipped[i] ^= 1 << int(rng.integers(8))
    yield 'bytes flipped', bytes(flipped)
  bounds, pos = [8], 8
  while pos + 8 <= len(data):
    pos += 12 + struct.unpack('>I', data[pos:pos + 4])[0]
    bounds.append(pos)
  for kind in (b'tEXt', b'zzZz', b'ABCD', b'PLTE', b'tRNS', b'IDAT',
               b'IEND', b'IHDR'):
    for body in (b'', b'\x00\x01\x00', b'\x00' * 6):
      for bad_crc in (False, True):
        c = png_chunk(kind, body)
        c = c[:-1] + bytes([c[-1] ^ 0xff]) if bad_crc else c
        at = bounds[int(rng.integers(len(bounds)))]
        yield f'{kind} {body!r} at {at} (bad CRC {bad_crc})', (
            data[:at] + c + data[at:])


def _encoded(image):
  """`image` as different encoders write it: our writer, Pillow, libpng
  (TF) with its adaptive row filters, and 16 bits."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  out = io.BytesIO()
  Image.fromarray(image).save(out, 'PNG', optimize=True)
  yield 'pillow', out.getvalue()
  yield 'libpng', tf.io.encode_png(image[..., None]).numpy()
  yield 'libpng 16 bits', tf.io.encode_png(
      image[..., None].astype(np.uint16) * 257 + 100).numpy()


@needs_tfds_extra
def test_decoder_equals_tensorflow_on_release_and_generated_files(tmp_path):
  rng = np.random.default_rng(0)
  files = []
  # Release-style files and what our generator writes (prepare's and
  # data.generate's path), and the pinned fixture of the generator.
  folder, truth = write_release(str(tmp_path / 'release'), num=6)
  files += [(os.path.join(folder, rel), 32) for rel in truth]
  generated = pathfinder.generate_dataset(
      str(tmp_path / 'generated'), resolution=32, difficulty='hard',
      num_examples=4, seed=1)
  files += [(os.path.join(generated, 'imgs/0', n), 32)
            for n in os.listdir(os.path.join(generated, 'imgs/0'))]
  for r, sub in ((32, 'curv_baseline'), (128, 'curv_contour_length_14')):
    folder = os.path.join(FIXTURE, f'pathfinder{r}', sub, 'imgs/0')
    files += [(os.path.join(folder, n), r) for n in os.listdir(folder)]
  for path, r in files:
    with open(path, 'rb') as f:
      data = f.read()
    if not data:
      continue  # Empty files are skipped before decoding (P21).
    _same_as_tensorflow(data, r, path)
    for name, encoded in _encoded(pathfinder.decode_png(data, path, r)
                                  .reshape(r, r)):
      _same_as_tensorflow(encoded, r, f'{path} by {name}')
  for what, data in _variants(open(files[0][0], 'rb').read(), rng):
    _same_as_tensorflow(data, 32, what)


@needs_tfds_extra
def test_decoder_equals_tensorflow_on_every_kind_of_png():
  rng = np.random.default_rng(1)
  cases = []
  for r in (7, 8, 16):
    for depth in (1, 2, 4, 8, 16):
      values = rng.integers(0, 2 ** depth, (r, r))
      for interlace in (False, True):
        cases.append((f'{depth} bits, interlace {interlace}', make_png(
            values, bit_depth=depth, interlace=interlace), r))
    values = rng.integers(0, 256, (r, r))
    text = png_chunk(b'tEXt', b'a\x00b')
    cases += [
        ('gray + tRNS', make_png(values, before_idat=png_chunk(
            b'tRNS', b'\x00\x07')), r),
        ('16 bits + tRNS', make_png(
            values * 200, bit_depth=16,
            before_idat=png_chunk(b'tRNS', b'\x00\x07')), r),
        ('gray + alpha', make_png(rng.integers(0, 256, (r, r, 2)), colour=4),
         r),
        ('RGB', make_png(rng.integers(0, 256, (r, r, 3)), colour=2), r),
        ('RGBA', make_png(rng.integers(0, 256, (r, r, 4)), colour=6), r),
        ('palette', make_png(values % 4, colour=3, palette=bytes(12)), r),
        ('palette + tRNS', make_png(values % 4, colour=3, palette=bytes(12),
                                    before_idat=png_chunk(b'tRNS', b'\x00')),
         r),
        ('wrong size', make_png(values), r + 1),
        ('bad filter', make_png(values, filter_type=5), r),
        ('extra image data', make_png(values, extra_data=bytes(40)), r),
        ('gray with PLTE', make_png(values, palette=bytes(6)), r),
        ('text before IHDR', png.PNG_SIGNATURE + text +
         make_png(values)[8:], r),
    ]
    # The end of the zlib stream at IDAT boundaries: libpng reads past the
    # image into one more chunk only, and forgives a bad checksum there.
    stream = zlib.compress(b''.join(b'\x00' + bytes(row) for row in
                                    values.astype(np.uint8)))
    for size in (1, 2, 3, 5, len(stream)):
      for cut in range(6):
        head, rest = stream[:len(stream) - cut], stream[len(stream) - cut:]
        cases.append((f'IDAT of {size}, stream cut by {cut}', make_png(
            values, zlib_data=head, idat_size=size), r))
        cases.append((f'IDAT of {size}, last {cut} bytes after tEXt',
                      make_png(values, zlib_data=head, idat_size=size,
                               after_idat=text + (png_chunk(b'IDAT', rest)
                                                  if rest else b'')), r))
      cases.append((f'IDAT of {size}, bad checksum', make_png(
          values, zlib_data=stream[:-1] + bytes([stream[-1] ^ 1]),
          idat_size=size), r))
  for what, data, r in cases:
    _same_as_tensorflow(data, r, what)
    if what in ('8 bits, interlace False', 'RGB', 'palette'):
      for variant, changed in _variants(data, rng):
        _same_as_tensorflow(changed, r, f'{what}, {variant}')


@needs_tfds_extra
def test_tensorflow_decodes_gray_jpeg_where_we_refuse():
  # The one difference, documented in `pathfinder.decode_png`: TF's
  # decode_png sniffs the format and decodes JPEG (GIF, WebP) data too.
  from PIL import Image  # pylint: disable=g-import-not-at-top
  out = io.BytesIO()
  Image.fromarray(np.full((8, 8), 128, np.uint8)).save(out, 'JPEG')
  assert _tf_decode(out.getvalue(), 8)[0] == 'ok'
  _refused(out.getvalue(), 8, 'not a PNG file')
