"""Shared helpers of the data tests: configs with overrides, fixtures, PNG
files of every kind, and generated examples served where `tfds.load` would
read."""

import contextlib
import os
import struct
import types
import zlib

import numpy as np
import pytest

from lra_msmra import config_lib
from lra_msmra.data import pathfinder
from lra_msmra.data import png
from lra_msmra.data import tfds_io
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def task_config(task, arg='runlocal', **data_overrides):
  """configs/<task>/transformer.py:<arg> with config.data overrides."""
  path = os.path.join(ROOT, 'configs', task, 'transformer.py')
  config = config_lib.load_sibling(path, 'transformer').get_config(arg)
  for key, value in data_overrides.items():
    if key == 'data_dir':
      config.data_dir = value
      config.data.generate = not value
    elif isinstance(value, dict):
      config.data[key].update(value)
    else:
      config.data[key] = value
  return config


def write_release(root, resolution=32, difficulty='hard', num=20, seed=0,
                  empty=(3,), per_folder=8):
  """A release-like folder: imgs/<k>/sample_<n>.png plus metadata/<k>.npy.

  Returns {image relative path: (pixels [R, R], label)}; empty files map to
  None.
  """
  folder = pathfinder.folder_path(root, resolution, difficulty)
  rng = np.random.default_rng(seed)
  truth, lines = {}, {}
  for n in range(num):
    k = n // per_folder
    os.makedirs(os.path.join(folder, 'imgs', str(k)), exist_ok=True)
    rel = os.path.join(f'imgs/{k}', f'sample_{n}.png')
    label = int(rng.integers(2))
    if n in empty:
      open(os.path.join(folder, rel), 'wb').close()
      truth[rel] = None
    else:
      pixels = rng.integers(0, 256, (resolution, resolution)).astype(np.uint8)
      png.write(os.path.join(folder, rel), pixels)
      truth[rel] = (pixels, label)
    lines.setdefault(k, []).append(
        f'imgs/{k} sample_{n}.png {n} {label} 1.0 14 4 2 0.5 1 1\n')
  os.makedirs(os.path.join(folder, 'metadata'), exist_ok=True)
  for k, rows in lines.items():
    with open(os.path.join(folder, 'metadata', f'{k}.npy'), 'w') as f:
      f.write(''.join(rows))
  return folder, truth


def needs_tfds_extra(test):
  """Marks a test `extras` and skips it without TensorFlow and TFDS."""
  return pytest.mark.extras(pytest.mark.skipif(
      helpers.TFDS_EXTRA_MISSING, reason=helpers.TFDS_EXTRA_REASON)(test))


def png_chunk(kind, body):
  """One PNG chunk with its CRC."""
  return (struct.pack('>I', len(body)) + kind + body +
          struct.pack('>I', zlib.crc32(kind + body)))


# Adam7 passes: (first row, row step, first column, column step).
ADAM7 = ((0, 8, 0, 8), (0, 8, 4, 8), (4, 8, 0, 4), (0, 4, 2, 4), (2, 4, 0, 2),
         (0, 2, 1, 2), (1, 2, 0, 1))


def _rows(samples, bit_depth):
  """Packed scanlines (no filter byte) of `samples` [H, W * channels]."""
  if bit_depth == 16:
    return [r.astype('>u2').tobytes() for r in samples]
  if bit_depth == 8:
    return [r.astype(np.uint8).tobytes() for r in samples]
  return [np.packbits(np.unpackbits(r.astype(np.uint8)[:, None], axis=1)
                      [:, 8 - bit_depth:].reshape(-1)).tobytes()
          for r in samples]


def make_png(samples, *, bit_depth=8, colour=0, interlace=False,
             palette=None, before_idat=b'', after_idat=b'', filter_type=0,
             idat_size=None, zlib_data=None, extra_data=b''):
  """A PNG written by hand, so that every corner of the format can be made.

  Args:
    samples: int array [H, W] (or [H, W, C] for colour types with several
      samples per pixel) of sample values for `bit_depth`.
    bit_depth: 1, 2, 4, 8 or 16.
    colour: PNG colour type (0 gray, 2 RGB, 3 palette, 4 gray + alpha,
      6 RGBA).
    interlace: Adam7.
    palette: PLTE body for colour type 3.
    before_idat: chunks between IHDR (or PLTE) and the first IDAT.
    after_idat: chunks between the last IDAT and IEND.
    filter_type: the filter byte of every row (0 = none; others are
      written as the byte only, which only 0 decodes right).
    idat_size: split the zlib stream into IDAT chunks of this size.
    zlib_data: the zlib stream to write instead of the image's.
    extra_data: bytes appended to the scanlines before compression.

  Returns:
    The file's bytes.
  """
  samples = np.asarray(samples)
  if samples.ndim == 2:
    samples = samples[..., None]
  h, w, c = samples.shape
  if zlib_data is None:
    passes = ([(0, 1, 0, 1)] if not interlace else ADAM7)
    raw = b''
    for y0, dy, x0, dx in passes:
      sub = samples[y0::dy, x0::dx]
      if sub.size:
        raw += b''.join(bytes([filter_type]) + r for r in
                        _rows(sub.reshape(sub.shape[0], -1), bit_depth))
    zlib_data = zlib.compress(raw + extra_data)
  size = idat_size or max(len(zlib_data), 1)
  idat = b''.join(png_chunk(b'IDAT', zlib_data[i:i + size])
                  for i in range(0, max(len(zlib_data), 1), size))
  header = struct.pack('>IIBBBBB', w, h, bit_depth, colour, 0, 0,
                       int(interlace))
  return (png.PNG_SIGNATURE + png_chunk(b'IHDR', header) +
          (png_chunk(b'PLTE', palette) if palette is not None else b'') +
          before_idat + idat + after_idat + png_chunk(b'IEND', b''))


def serve_examples(monkeypatch, examples):
  """Makes `tfds_io.load` (the real-data path) return the splits of
  `examples` (stored split -> feature -> rows) as TFDS would, without TFDS:
  tests of a pipeline's real-data path."""
  def load(name, splits, data_dir, fields):
    del name, data_dir
    return tfds_io.from_examples(examples, splits, fields)
  monkeypatch.setattr(tfds_io, 'load', load)


@contextlib.contextmanager
def tfds_mock(examples):
  """Makes `tfds.load` itself serve `examples` (through
  `tfds.testing.mock_data`, TFDS's split arithmetic, `tf.data`): the oracle
  `tfds_io.from_examples` is compared with. Needs TensorFlow and TFDS.

  Features of the dataset that `examples` lack get an id per row.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  sizes = {name: types.SimpleNamespace(
      num_examples=len(next(iter(fields.values()))))
           for name, fields in examples.items()}

  def column(split, feature):
    if feature in examples[split]:
      return examples[split][feature]
    return np.array([f'{split}_{k}'.encode()
                     for k in range(sizes[split].num_examples)], dtype=object)

  def as_dataset(builder, split, decoders=None, read_config=None, **kwargs):
    del decoders, read_config, kwargs
    parts = tfds.core.ReadInstruction.from_spec(split).to_absolute(sizes)
    rows = {f: np.concatenate([column(p.splitname, f)[p.from_:p.to]
                               for p in parts])
            for f in builder.info.features.keys()}
    return tf.data.Dataset.from_tensor_slices(rows)

  with tfds.testing.mock_data(as_dataset_fn=as_dataset,
                              policy=tfds.testing.MockPolicy.USE_CODE):
    yield
