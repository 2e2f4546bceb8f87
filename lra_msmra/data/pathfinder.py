"""Pathfinder and Path-X, read straight from the LRA release.

The protocol is in docs/protocol.md §5.5, §5.6 and §7.

Layout (the release's `pathfinder{32,64,128,256}` folders, or a folder
written by `python -m lra_msmra.data.prepare`)::

  <data_dir>/pathfinder<R>/<difficulty folder>/
    imgs/<k>/sample_<n>.png   8-bit single-channel PNGs, R x R
    metadata/<k>.npy          plain text despite the extension; one line
                              per image: `imgs/<k> sample_<n>.png <n> <label>
                              ...` (space-separated, field 3 = label 0/1)

Difficulties: 'easy' = curv_baseline, 'intermediate' = curv_contour_length_9,
'hard' = curv_contour_length_14. LRA's "Path" is pathfinder32 hard, Path-X is
pathfinder128 hard (LRA repository issue #11).

No Beam or TFDS build step: we reproduce what LRA's TFDS builder and loader
do with these files (`data/pathfinder.py`, `image/input_pipeline.py`):

1. Every metadata line becomes an example with key
   `<field 0>_<field 1>_<i>`, i = 1-based line number within its file, image
   `<difficulty folder>/<field 0>/<field 1>`, label int(field 3).
2. Order: TFDS stores a split sorted by the md5 of (split name + key), read
   as a 128-bit integer (`tfds.core.hashing`, salt = the split name, i.e. the
   difficulty). We sort the same way, so the order is deterministic and, if
   LRA's dataset was built by the same TFDS algorithm, identical to it.
3. Splits: `[:80%]`, `[80%:90%]`, `[90%:]` with TFDS's boundaries
   (`round(p * n / 100)`), before any filtering.
4. Empty PNGs (zero bytes, e.g. pathfinder32/curv_baseline/imgs/0/
   sample_172.png) are dropped within each split after slicing, as LRA does
   (P21); their number goes to the notes.
5. PNGs are decoded with TensorFlow's `decode_png` (LRA's decoder; imported
   lazily) and must be R x R x 1; pixel intensities 0..255 are the tokens
   (vocabulary 256), flattened row-major to R * R.

Training order (`data.shuffle`): LRA shuffles whole batches with a buffer of
2048 batches (P10, 'batches', the LRA-protocol default); 'examples'
reshuffles images every epoch as Xiong et al. do. Black background pixels
(id 0) count as padding unless `config.model.mask_padding` is False (P8);
LRA's MEAN pooling is unmasked (P9). All three are recorded in the notes.

Where we differ: a metadata file whose last line lacks a newline keeps that
line (LRA drops the last element after splitting on newlines, which would
lose it); blank lines and malformed lines raise instead of crashing later;
LRA drops the last partial evaluation batch, we evaluate every image.

With `config.data.generate=True`, a small mock set in exactly this layout is
generated into `<workdir>/data/pathfinder` (`generate_dataset`): two dashed
curves and two markers per image, label 1 iff both markers sit on the ends
of the same curve, plus one empty PNG as in the release.

config.data keys:
  resolution: 32, 64, 128 or 256.
  difficulty: 'easy', 'intermediate' or 'hard'.
  pad_to_length: zero-pad the R * R tokens further to this length (0 =
    none; the xiong option sets 1024, a no-op at 32 x 32).
  shuffle: 'batches' (LRA) or 'examples'.
  generate: True for mock images instead of data_dir.
  generator: {num_examples, seed}, used only with generate.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import struct
import zlib
from typing import Any, NamedTuple

import numpy as np

from lra_msmra.data import pipeline

VOCAB_SIZE = 256  # pixel intensities are the tokens.
NUM_CLASSES = 2
RESOLUTIONS = (32, 64, 128, 256)
DIFFICULTIES = {'easy': 'curv_baseline',
                'intermediate': 'curv_contour_length_9',
                'hard': 'curv_contour_length_14'}
# TFDS percent slices of LRA's loader: train, validation, test.
SPLIT_PERCENTS = {'train': (0, 80), 'eval': (80, 90), 'test': (90, 100)}
BATCH_SHUFFLE_WINDOW = 2048  # LRA's shuffle buffer (256 * 8 batches).
# Images per generator batch folder imgs/<k> in generated data.
GENERATED_PER_FOLDER = 500
# Bumped whenever generated data changes, so stale workdir data is redone.
GENERATOR_VERSION = 1


class Example(NamedTuple):
  key: str
  image: str  # path relative to the difficulty folder.
  label: int


def folder_path(root: str, resolution: int, difficulty: str) -> str:
  """`<root>/pathfinder<R>/<difficulty folder>`."""
  return os.path.join(root, f'pathfinder{resolution}',
                      DIFFICULTIES[difficulty])


def _natural_key(path: str) -> tuple:
  name = os.path.basename(path)
  return tuple(int(t) if t.isdigit() else t for t in re.split(r'(\d+)', name))


def read_metadata(folder: str) -> list[Example]:
  """All examples listed in `<folder>/metadata/*.npy`.

  Raises:
    FileNotFoundError: the folder or its metadata files are missing.
    ValueError: a malformed line or a duplicate key, naming file and line.
  """
  meta_dir = os.path.join(folder, 'metadata')
  if not os.path.isdir(meta_dir):
    raise FileNotFoundError(
        f'Pathfinder metadata folder {meta_dir} not found. config.data_dir '
        'must hold pathfinder<R>/<difficulty>/{imgs,metadata} (the '
        'lra_release folder, or the folder written by `python -m '
        'lra_msmra.data.prepare`).')
  files = sorted(glob.glob(os.path.join(meta_dir, '*.npy')), key=_natural_key)
  if not files:
    raise FileNotFoundError(f'No metadata/*.npy files in {folder}.')
  examples, seen = [], {}
  for path in files:
    with open(path, 'rb') as f:
      try:
        text = f.read().decode('utf-8')
      except UnicodeDecodeError as e:
        raise ValueError(f'{path}: not UTF-8 text ({e}).') from None
    lines = text.split('\n')
    if lines and not lines[-1]:
      lines = lines[:-1]
    for line_no, line in enumerate(lines, start=1):
      fields = line.rstrip('\r').split(' ')
      if len(fields) < 4:
        raise ValueError(f'{path}:{line_no}: expected at least 4 '
                         'space-separated fields (folder, file, index, '
                         f'label, ...), got {len(fields)}.')
      if fields[3] not in ('0', '1'):
        raise ValueError(f'{path}:{line_no}: label (field 3) '
                         f'{fields[3]!r} is not 0 or 1.')
      key = '_'.join([fields[0], fields[1], str(line_no)])
      if key in seen:
        raise ValueError(f'{path}:{line_no}: duplicate example key {key!r} '
                         f'(also in {seen[key]}).')
      seen[key] = path
      examples.append(Example(key, os.path.join(fields[0], fields[1]),
                              int(fields[3])))
  return examples


def tfds_order(keys: list[str], salt: str) -> np.ndarray:
  """Indices sorting `keys` as TFDS stores a split: by md5(salt + key)."""
  base = hashlib.md5(salt.encode('utf-8'))

  def hash_key(key: str) -> int:
    h = base.copy()
    h.update(key.encode('utf-8'))
    return int(h.hexdigest(), 16)

  return np.array(sorted(range(len(keys)), key=lambda i: hash_key(keys[i])),
                  dtype=np.int64)


def percent_boundary(percent: int, num: int) -> int:
  """TFDS's 'closest' rounding of a percent slice boundary."""
  return int(round(percent * num / 100.0))


def decode_png(data: bytes, path: str, resolution: int) -> np.ndarray:
  """Decodes one single-channel R x R PNG to uint8 `[R * R]`.

  Raises:
    ValueError: not a decodable PNG or the wrong shape, naming `path`.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    image = tf.io.decode_png(data, channels=0).numpy()
  except tf.errors.OpError as e:
    raise ValueError(f'{path}: cannot decode the PNG ({e.message}).') from None
  if image.shape != (resolution, resolution, 1):
    raise ValueError(f'{path}: expected a {resolution}x{resolution} '
                     f'single-channel image, got shape {image.shape}.')
  return image.reshape(-1)


# PNGs decoded per graph call by `check_pngs`.
_CHECK_BATCH = 512
_shape_fns: dict[int, Any] = {}


def _batch_shapes(datas: list[bytes]) -> np.ndarray:
  """`[n, 3]` decoded shapes of PNGs, with `decode_png`'s decoder in one
  graph call (much faster than one eager call per image); raises
  tf.errors.OpError if any PNG cannot be decoded."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if 'fn' not in _shape_fns:
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def shapes(data):
      return tf.map_fn(lambda d: tf.shape(tf.io.decode_png(d, channels=0)),
                       data, fn_output_signature=tf.int32)
    _shape_fns['fn'] = shapes
  return _shape_fns['fn'](tf.constant(datas)).numpy()


def _check_batch(paths: list[str], resolution: int
                 ) -> tuple[list[str], list[str]]:
  """(empty files, problems) of some PNGs; see `check_pngs`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  empty, problems, datas, read = [], [], [], []
  for path in paths:
    try:
      with open(path, 'rb') as f:
        data = f.read()
    except FileNotFoundError:
      problems.append(f'{path}: image listed in the metadata is missing.')
      continue
    if data:
      datas.append(data)
      read.append(path)
    else:
      empty.append(path)
  if not datas:
    return empty, problems
  try:
    shapes = _batch_shapes(datas)
    bad = [i for i, shape in enumerate(shapes)
           if tuple(shape) != (resolution, resolution, 1)]
  except tf.errors.OpError:
    bad = range(len(datas))  # Find which ones, one by one.
  for i in bad:
    try:
      decode_png(datas[i], read[i], resolution)
    except ValueError as e:
      problems.append(str(e))
  return empty, problems


def check_pngs(paths: list[str], resolution: int, workers: int = 8
               ) -> tuple[list[str], list[str]]:
  """Decodes every non-empty PNG as training will (`decode_png`).

  Files are read and decoded in batches by a pool of threads (the decoder
  releases the GIL; reading overlaps with decoding).

  Returns:
    (empty files, which training skips (P21); one message per file that
    training would reject: missing, not a decodable PNG, or not R x R x 1).
  """
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  batches = [paths[i:i + _CHECK_BATCH]
             for i in range(0, len(paths), _CHECK_BATCH)]
  empty, problems = [], []
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    for e, p in pool.map(lambda b: _check_batch(b, resolution), batches):
      empty += e
      problems += p
  return empty, problems


def load_split(folder: str, examples: list[Example], resolution: int
               ) -> tuple[np.ndarray, np.ndarray, int]:
  """Reads the images of `examples`, skipping empty files (P21).

  Returns:
    (tokens uint8 `[n, R * R]`, labels int32 `[n]`, number skipped).
  """
  tokens = np.zeros((len(examples), resolution * resolution), np.uint8)
  labels = np.zeros(len(examples), np.int32)
  kept = 0
  for ex in examples:
    path = os.path.join(folder, ex.image)
    try:
      with open(path, 'rb') as f:
        data = f.read()
    except FileNotFoundError:
      raise FileNotFoundError(f'{path}: image listed in the metadata is '
                              'missing.') from None
    if not data:
      continue
    tokens[kept] = decode_png(data, path, resolution)
    labels[kept] = ex.label
    kept += 1
  return tokens[:kept], labels[:kept], len(examples) - kept


def split_examples(examples: list[Example], difficulty: str
                   ) -> dict[str, list[Example]]:
  """LRA's 80/10/10 split of one difficulty, in TFDS order."""
  order = tfds_order([e.key for e in examples], difficulty)
  n = len(examples)
  out = {}
  for name, (lo, hi) in SPLIT_PERCENTS.items():
    a, b = percent_boundary(lo, n), percent_boundary(hi, n)
    out[name] = [examples[i] for i in order[a:b]]
  return out


# --------------------------------------------------------------- generation


def write_png(path: str, image: np.ndarray) -> None:
  """Writes uint8 `[H, W]` as an 8-bit grayscale PNG (no filtering)."""
  if image.dtype != np.uint8 or image.ndim != 2:
    raise ValueError(f'Expected uint8 [H, W], got {image.dtype} '
                     f'{image.shape}.')
  h, w = image.shape

  def chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(kind + body) & 0xFFFFFFFF
    return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', crc)

  # Each row starts with filter type 0 (none).
  raw = b''.join(b'\x00' + image[r].tobytes() for r in range(h))
  header = struct.pack('>IIBBBBB', w, h, 8, 0, 0, 0, 0)  # 8-bit gray.
  with open(path, 'wb') as f:
    f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) +
            chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))


def _curve(rng: np.random.Generator, size: int, length: int
           ) -> np.ndarray:
  """Points `[length + 1, 2]` of a smooth random walk inside the canvas."""
  margin = 2.0
  p = rng.uniform(margin, size - 1 - margin, size=2)
  theta = rng.uniform(0, 2 * np.pi)
  points = [p.copy()]
  for _ in range(length):
    theta += rng.normal(0, 0.35)
    step = np.array([np.cos(theta), np.sin(theta)]) * 1.5
    nxt = p + step
    for axis in range(2):  # Reflect off the borders.
      if not margin <= nxt[axis] <= size - 1 - margin:
        step[axis] = -step[axis]
        theta = np.arctan2(step[1], step[0])
    p = np.clip(p + step, margin, size - 1 - margin)
    points.append(p.copy())
  return np.array(points)


def _draw_dashes(canvas: np.ndarray, points: np.ndarray, value: int) -> None:
  """Draws every other segment of a polyline (the release's 'paddles')."""
  for i in range(0, len(points) - 1, 2):
    for t in np.linspace(0, 1, 4):
      y, x = np.round(points[i] * (1 - t) + points[i + 1] * t).astype(int)
      canvas[y, x] = value


def _draw_marker(canvas: np.ndarray, point: np.ndarray, value: int) -> None:
  cy, cx = np.round(point).astype(int)
  size = canvas.shape[0]
  for y in range(max(cy - 1, 0), min(cy + 2, size)):
    for x in range(max(cx - 1, 0), min(cx + 2, size)):
      canvas[y, x] = value


def synthetic_image(rng: np.random.Generator, size: int, label: int
                    ) -> np.ndarray:
  """One Pathfinder-like image: two dashed curves, two markers.

  Label 1: the markers sit on both ends of the same curve; label 0: on one
  end of each curve.
  """
  length = max(8, size // 3)
  canvas = np.zeros((size, size), np.uint8)
  a, b = _curve(rng, size, length), _curve(rng, size, length)
  _draw_dashes(canvas, a, 200)
  _draw_dashes(canvas, b, 200)
  ends = (a[0], a[-1]) if label else (a[0], b[-1])
  for end in ends:
    _draw_marker(canvas, end, 255)
  return canvas


def generate_dataset(root: str, *, resolution: int, difficulty: str,
                     num_examples: int, seed: int) -> str:
  """Writes a synthetic difficulty folder in the release layout.

  Also writes one empty PNG listed in the metadata, as in the release (P21).

  Returns:
    The difficulty folder.
  """
  folder = folder_path(root, resolution, difficulty)
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.join(folder, 'metadata'), exist_ok=True)
  lines: dict[int, list[str]] = {}
  for n in range(num_examples + 1):
    batch = n // GENERATED_PER_FOLDER
    img_dir = os.path.join(folder, 'imgs', str(batch))
    os.makedirs(img_dir, exist_ok=True)
    label = int(rng.integers(2))
    name = f'sample_{n}.png'
    if n == 0:
      open(os.path.join(img_dir, name), 'wb').close()  # The empty PNG.
    else:
      write_png(os.path.join(img_dir, name),
                synthetic_image(rng, resolution, label))
    # Fields after the label follow the generator: continuity, contour
    # length, distractor length, paddle length, thickness, margin, contrasts.
    lines.setdefault(batch, []).append(
        f'imgs/{batch} {name} {n} {label} 1.0 14 4 2 0.5 1 1')
  for batch, rows in lines.items():
    with open(os.path.join(folder, 'metadata', f'{batch}.npy'), 'w') as f:
      f.write(''.join(r + '\n' for r in rows))
  return folder


# ---------------------------------------------------------------- the task


def _check_data(data: Any) -> None:
  """Pathfinder's own checks: resolution and difficulty."""
  if data.resolution not in RESOLUTIONS:
    raise ValueError(f'config.data.resolution={data.resolution!r}; valid: '
                     f'{RESOLUTIONS}.')
  if data.difficulty not in DIFFICULTIES:
    raise ValueError(f'config.data.difficulty={data.difficulty!r}; valid: '
                     f'{sorted(DIFFICULTIES)}.')


TASK = pipeline.Task(
    name='pathfinder', vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
    dual=False,
    data_keys=frozenset({'difficulty', 'pad_to_length', 'resolution',
                         'shuffle'}),
    generator_keys=frozenset({'num_examples', 'seed'}),
    synthetic='mock', prepare=pipeline.RELEASE_HINT,
    length=lambda data: data.resolution ** 2, extra_check=_check_data)
get_model_spec = TASK.model_spec


def _generated_root(config: Any, workdir: str) -> str:
  """Generates (once) the folder described by config.data.generator."""
  spec = dict(config.data.generator.to_dict(),
              resolution=config.data.resolution,
              difficulty=config.data.difficulty)
  root = os.path.join(workdir, 'data', 'pathfinder')
  return pipeline.generate_once(
      root, dict(spec, version=GENERATOR_VERSION),
      lambda: generate_dataset(root, **spec))


def _refuse_second_copy(root: str, resolution: int) -> None:
  """The LRA archive's nested layout has a second `pathfinder128` beside
  its inner `lra_release/` folder (P20); given the outer folder, both would
  match. Raises instead of picking one silently."""
  name = f'pathfinder{resolution}'
  here = os.path.join(root, name)
  inner = os.path.join(root, 'lra_release', name)
  if os.path.isdir(here) and os.path.isdir(inner):
    raise ValueError(
        f'config.data_dir={root!r} holds two copies of {name}: {here} and '
        f'{inner} (the nested layout of the LRA archive, which does not say '
        'which is right). Point config.data_dir at the folder of the copy '
        f'you mean ({os.path.join(root, "lra_release")} for the one beside '
        'the other tasks), or prepare the release once with `python -m '
        'lra_msmra.data.prepare --lra_release ... --out DIR '
        '--pathfinder128_copy main|extra` and use DIR.')


def get_datasets(config: Any, workdir: str) -> pipeline.TaskData:
  """The Pathfinder / Path-X splits for `config` (module docstring)."""
  source, length = TASK.begin(config)
  data = config.data
  if source == 'mock':
    root = _generated_root(config, workdir)
  else:
    root = config.data_dir
    if not os.path.isdir(root):
      raise FileNotFoundError(
          f'config.data_dir={root!r} is not a directory. It must hold '
          f'pathfinder{data.resolution}/{DIFFICULTIES[data.difficulty]}/'
          '{imgs,metadata} (the lra_release folder, or the folder written '
          'by `python -m lra_msmra.data.prepare`).')
  folder = folder_path(root, data.resolution, data.difficulty)
  if source == 'release':
    _refuse_second_copy(root, data.resolution)
  examples = read_metadata(folder)
  sources, skipped, counts = {}, {}, {}
  for name, split in split_examples(examples, data.difficulty).items():
    tokens, labels, skipped[name] = load_split(folder, split, data.resolution)
    if not len(labels):
      raise ValueError(f'{folder}: the {name} split has no non-empty '
                       f'images ({len(split)} listed).')
    if length > tokens.shape[1]:
      tokens = pipeline.pad_or_truncate(tokens, length, np.uint8)
    sources[name] = pipeline.ArraySource({'inputs': tokens,
                                          'targets': labels})
    counts[name] = len(labels)
  train = pipeline.with_train_shuffle(sources['train'], data.shuffle,
                                      BATCH_SHUFFLE_WINDOW)
  zero = float(np.mean(sources['test'].arrays['inputs'] == 0))
  notes = {
      'data_dir': folder,
      'data_source': source,
      'resolution': data.resolution,
      'difficulty': f'{data.difficulty} ({DIFFICULTIES[data.difficulty]})',
      'split': 'TFDS order (md5 of difficulty + key), 80/10/10',
      'examples': counts,
      'empty_pngs_skipped': skipped,  # P21.
      'test_fraction_zero_pixels': zero,
      **pipeline.fidelity_notes(config, train.train_shuffle),
  }
  return pipeline.TaskData(
      train=train, eval=sources['eval'], test=sources['test'],
      num_classes=NUM_CLASSES, vocab_size=VOCAB_SIZE, max_len=length,
      notes=notes)
