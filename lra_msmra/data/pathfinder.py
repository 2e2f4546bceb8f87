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
5. PNGs are decoded as TensorFlow's `decode_png` (LRA's decoder) decodes
   them, without TensorFlow (`data/png.py`: each file checked as libpng
   does, decoded with Pillow, to the same pixels, refusing the same files).
   They must be R x R x 1; pixel intensities 0..255 are the tokens
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

Generated data (docs/protocol.md §7.3): `generate_dataset` writes a
difficulty folder in this layout with our seeded implementation of the
Pathfinder generator (`pathfinder_generator`, LRA's settings), plus a
`generator.json` stamp; `python -m lra_msmra.data.prepare
--generate_pathfinder` writes all four sets. With `config.data.generate=True`,
`config.data.generator.num_examples` images of the configured resolution and
difficulty are generated into `<workdir>/data/pathfinder` (once). Data that
carries the stamp is recorded as 'generated', with the generator's settings,
wherever it is read from.

config.data keys:
  resolution: 32, 64, 128 or 256 (the generator: 32 or 128).
  difficulty: 'easy', 'intermediate' or 'hard'.
  pad_to_length: zero-pad the R * R tokens further to this length (0 =
    none; the xiong option sets 1024, a no-op at 32 x 32).
  shuffle: 'batches' (LRA) or 'examples'.
  generate: True for generated images instead of data_dir.
  generator: {num_examples, seed}, used only with generate.
"""

from __future__ import annotations

import glob
import hashlib
import json
import multiprocessing
import os
import re
import resource
import shutil
import sys
import time
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np

from lra_msmra import config_lib
from lra_msmra.data import pathfinder_generator
from lra_msmra.data import pipeline
from lra_msmra.data import png
from lra_msmra.data import splits

VOCAB_SIZE = 256  # pixel intensities are the tokens.
NUM_CLASSES = 2
RESOLUTIONS = (32, 64, 128, 256)
DIFFICULTIES = {'easy': 'curv_baseline',
                'intermediate': 'curv_contour_length_9',
                'hard': 'curv_contour_length_14'}
# TFDS percent slices of LRA's loader: train, validation, test.
SPLIT_PERCENTS = {'train': (0, 80), 'eval': (80, 90), 'test': (90, 100)}
BATCH_SHUFFLE_WINDOW = 2048  # LRA's shuffle buffer (256 * 8 batches).
# Images per folder imgs/<k> in generated data.
GENERATED_PER_FOLDER = 1000
# Images per unit of work of the generator's worker processes.
CHUNK = 50
# Present while a generated set is being written (its settings).
PROGRESS_FILE = 'generating.json'
# Images per difficulty in the release (and by default in generated sets).
RELEASE_EXAMPLES = 200_000


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


def decode_png(data: bytes, path: str, resolution: int) -> np.ndarray:
  """Decodes one single-channel R x R PNG to uint8 `[R * R]` as LRA's
  decoder does (`png.decode`).

  Raises:
    ValueError: not a decodable PNG or the wrong shape, naming `path`, on
      one line.
  """
  try:
    return png.decode(data, resolution)
  except ValueError as e:
    raise ValueError(f'{path}: {e}') from None


def _read_files(paths: list[str]) -> list[Optional[bytes]]:
  """The bytes of each file, None for a missing one."""
  out = []
  for path in paths:
    try:
      with open(path, 'rb') as f:
        out.append(f.read())
    except FileNotFoundError:
      out.append(None)
  return out


# PNGs per unit of work of `check_pngs`'s reading threads.
_CHECK_BATCH = 256


def check_pngs(paths: list[str], resolution: int, workers: int = 8
               ) -> tuple[list[str], list[str]]:
  """Decodes every non-empty PNG as training will (`decode_png`).

  A pool of threads reads the files, in batches, a few batches ahead of
  the decoding in this thread: reading overlaps with decoding, and the
  decoder, mostly Python and so holding the GIL, does not share it.

  Returns:
    (empty files, which training skips (P21); one message per file that
    training would reject: missing, not a decodable PNG, or not R x R x 1).
  """
  import collections  # pylint: disable=g-import-not-at-top
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  batches = iter([paths[i:i + _CHECK_BATCH]
                  for i in range(0, len(paths), _CHECK_BATCH)])
  empty, problems = [], []
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    ahead = collections.deque()
    while True:
      while len(ahead) < 2 * workers:  # Bounded: the files can be GBs.
        batch = next(batches, None)
        if batch is None:
          break
        ahead.append((batch, pool.submit(_read_files, batch)))
      if not ahead:
        return empty, problems
      batch, datas = ahead.popleft()
      for path, data in zip(batch, datas.result()):
        if data is None:
          problems.append(f'{path}: image listed in the metadata is '
                          'missing.')
        elif not data:
          empty.append(path)
        else:
          try:
            decode_png(data, path, resolution)
          except ValueError as e:
            problems.append(str(e))


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
    a, b = splits.percent_boundary(lo, n), splits.percent_boundary(hi, n)
    out[name] = [examples[i] for i in order[a:b]]
  return out


# --------------------------------------------------------------- generation


def _metadata_line(batch: int, i: int, label: int, margin: int,
                   s: pathfinder_generator.Settings) -> str:
  """The official generator's metadata fields: folder, file, index within
  the folder, label, continuity, contour length, distractor length, paddle
  length, paddle thickness, paddle margin, number of paddle contrasts."""
  return ' '.join(str(v) for v in (
      f'imgs/{batch}', f'sample_{i}.png', i, label, s.continuity,
      s.contour_length, s.distractor_length, s.paddle_length,
      s.paddle_thickness, margin, len(s.paddle_contrasts)))


def _write_chunk(task: tuple[str, pathfinder_generator.Settings, str, int,
                             int, int, int, int]
                 ) -> tuple[int, int, list[str]]:
  """Writes images `first` .. `first + count - 1` of folder `imgs/<batch>`
  (set indices from `start`); returns (batch, first, their metadata
  lines). Runs in worker processes."""
  folder, s, difficulty, seed, batch, first, start, count = task
  img_dir = os.path.join(folder, 'imgs', str(batch))
  os.makedirs(img_dir, exist_ok=True)
  lines = []
  for i in range(first, first + count):
    pixels, label, margin = pathfinder_generator.generate_image(
        s, seed, difficulty, start + i)
    png.write(os.path.join(img_dir, f'sample_{i}.png'), pixels)
    lines.append(_metadata_line(batch, i, label, margin, s))
  return batch, first, lines


def generate_dataset(root: str, *, resolution: int, difficulty: str,
                     num_examples: int, seed: int,
                     per_folder: int = GENERATED_PER_FOLDER,
                     workers: int = 1, pathx_distractors: str = 'release',
                     log: Optional[Any] = None) -> str:
  """Writes one difficulty folder with our generator, in the release layout.

  Image n (0-based) is `pathfinder_generator.generate_image(settings, seed,
  difficulty, n)`, written to `imgs/<n // per_folder>/sample_<n %
  per_folder>.png` and listed in `metadata/<n // per_folder>.npy`, so the
  files are the same for any number of workers. A folder's metadata file
  is written after its images; an interrupted run of the same settings
  resumes from the folders it finished. `generator.json` (written last)
  records the settings, the time taken and the label counts.

  Args:
    root: the folder that gets `pathfinder<R>/<difficulty folder>`.
    resolution: 32 or 128.
    difficulty: 'easy', 'intermediate' or 'hard'.
    num_examples: images to write (the release has 200,000).
    seed: the set's seed.
    per_folder: images per `imgs/<k>` folder.
    workers: processes writing folders in parallel.
    pathx_distractors: the Path-X distractor count (see
      `pathfinder_generator.PATHX_DISTRACTORS`).
    log: called with a progress line now and then (e.g. print).

  Returns:
    The difficulty folder.

  Raises:
    ValueError: bad settings, or a folder holding other data.
  """
  s = pathfinder_generator.settings(resolution, difficulty, pathx_distractors)
  for name, value, low in (('num_examples', num_examples, 1),
                           ('seed', seed, 0), ('per_folder', per_folder, 1),
                           ('workers', workers, 1)):
    if not config_lib.is_int(value) or value < low:
      raise ValueError(f'{name}={value!r} must be an integer >= {low}.')
  folder = folder_path(root, resolution, difficulty)
  spec = {'generator': 'pathfinder', 'version': pathfinder_generator.VERSION,
          'resolution': resolution, 'difficulty': difficulty,
          'num_examples': num_examples, 'seed': seed,
          'per_folder': per_folder, 'settings': s.to_dict()}
  if resolution == 128:
    spec['pathx_distractors'] = pathx_distractors

  def write() -> dict[str, Any]:
    return _write_dataset(folder, s, spec, workers, log)

  pipeline.generate_once(folder, spec, write)
  return folder


def _write_dataset(folder: str, s: pathfinder_generator.Settings,
                   spec: dict[str, Any], workers: int, log: Optional[Any]
                   ) -> dict[str, Any]:
  """`generate_dataset`'s work; returns the stamp's details."""
  progress = os.path.join(folder, PROGRESS_FILE)
  meta_dir = os.path.join(folder, 'metadata')
  resumable = False
  if os.path.exists(progress):
    with open(progress) as f:
      resumable = json.load(f) == json.loads(json.dumps(spec))
  if not resumable and os.path.isdir(meta_dir):
    if not (os.path.exists(progress) or
            pipeline.read_generator_stamp(folder) is not None):
      raise ValueError(f'{folder} holds Pathfinder data our generator did '
                       'not write; choose another output folder.')
    for sub in ('imgs', 'metadata'):
      shutil.rmtree(os.path.join(folder, sub), ignore_errors=True)
    stamp = os.path.join(folder, pipeline.GENERATOR_STAMP)
    if os.path.exists(stamp):
      os.remove(stamp)
  os.makedirs(meta_dir, exist_ok=True)
  with open(progress, 'w') as f:
    json.dump(spec, f, indent=1)
  n, per = spec['num_examples'], spec['per_folder']
  # Work in chunks of at most CHUNK images, so that few folders still
  # keep every worker busy; a folder's metadata follows its last chunk.
  todo = {k: min(per, n - k * per) for k in range(-(-n // per))
          if not os.path.exists(os.path.join(meta_dir, f'{k}.npy'))}
  tasks = [(folder, s, spec['difficulty'], spec['seed'], k, first, k * per,
            min(CHUNK, count - first))
           for k, count in todo.items() for first in range(0, count, CHUNK)]
  began, load_start, cpu_start = time.time(), os.getloadavg(), _cpu_seconds()
  to_write = sum(todo.values())
  labels, margins, done = [0, 0], {}, n - to_write
  pending: dict[int, dict[int, list[str]]] = {}

  def finish(batch: int, first: int, lines: list[str]) -> None:
    nonlocal done
    chunks = pending.setdefault(batch, {})
    chunks[first] = lines
    done += len(lines)
    if sum(len(c) for c in chunks.values()) < todo[batch]:
      return
    path = os.path.join(meta_dir, f'{batch}.npy')
    with open(path + '.tmp', 'w') as f:
      f.write(''.join(line + '\n' for _, c in sorted(chunks.items())
                      for line in c))
    os.replace(path + '.tmp', path)
    del pending[batch]
    if log is not None and (batch % 20 == 0 or done == n):
      rate = done / max(time.time() - began, 1e-9)
      log(f'  {folder}: {done}/{n} images ({rate:.0f}/s)')

  used = min(workers, max(len(tasks), 1))
  if used == 1:
    for task in tasks:
      finish(*_write_chunk(task))
  else:
    # Forked workers need no importable __main__ (the command line imports
    # neither JAX nor TensorFlow, whose threads make forking unsafe; a
    # caller may have imported them).
    threads = any(m in sys.modules for m in ('jax', 'tensorflow'))
    fork = 'fork' in multiprocessing.get_all_start_methods() and not threads
    context = multiprocessing.get_context('fork' if fork else 'spawn')
    with context.Pool(used) as pool:
      for result in pool.imap_unordered(_write_chunk, tasks):
        finish(*result)
  seconds, cpu = time.time() - began, _cpu_seconds() - cpu_start
  for path in glob.glob(os.path.join(meta_dir, '*.npy')):
    with open(path) as f:
      for line in f:
        fields = line.split(' ')
        labels[int(fields[3])] += 1
        margins[fields[9]] = margins.get(fields[9], 0) + 1
  os.remove(progress)
  return {
      'generation_seconds': round(seconds, 1),
      'images_written': to_write,
      # Wall time per image times the processes that wrote them.
      'seconds_per_image_per_worker': (
          round(seconds * used / to_write, 5) if to_write else None),
      # CPU time of this process and its workers: less dependent on what
      # else the machine runs than the wall time.
      'cpu_seconds': round(cpu, 1),
      'cpu_seconds_per_image': round(cpu / to_write, 5) if to_write else None,
      'workers': used, 'cpu_count': os.cpu_count(),
      'load_average_start': [round(v, 2) for v in load_start],
      'load_average_end': [round(v, 2) for v in os.getloadavg()],
      'labels': {'0': labels[0], '1': labels[1]},
      'paddle_margins': dict(sorted(margins.items())),
  }


def _cpu_seconds() -> float:
  """User and system CPU seconds of this process and its finished
  children."""
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def read_stamp(folder: str) -> Optional[dict[str, Any]]:
  """The generator record of a difficulty folder our generator wrote
  (`{'spec', 'details'}`), or None for any other folder (released data)."""
  return pipeline.read_generator_stamp(folder)


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
    synthetic='generated',
    prepare=(pipeline.RELEASE_HINT + ', or write it with our seeded '
             'implementation of the Pathfinder generator: `python -m '
             'lra_msmra.data.prepare --generate_pathfinder --out DIR`'),
    length=lambda data: data.resolution ** 2, extra_check=_check_data)
get_model_spec = TASK.model_spec


def _generated_root(config: Any, workdir: str) -> str:
  """Generates (once) the difficulty folder of config.data.generator into
  `<workdir>/data/pathfinder`; returns that root."""
  root = os.path.join(workdir, 'data', 'pathfinder')
  if pipeline.read_generator_stamp(root) is not None:
    # Mock images of an earlier version, stamped at the root: redone.
    for name in os.listdir(root):
      if name.startswith('pathfinder') or name == pipeline.GENERATOR_STAMP:
        path = os.path.join(root, name)
        (shutil.rmtree if os.path.isdir(path) else os.remove)(path)
  gen = config.data.generator
  generate_dataset(root, resolution=config.data.resolution,
                   difficulty=config.data.difficulty,
                   num_examples=gen.num_examples, seed=gen.seed)
  return root


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


def get_datasets(config: Any, workdir: str,
                 spec: Optional[Mapping[str, Any]] = None
                 ) -> pipeline.TaskData:
  """The Pathfinder / Path-X splits for `config` (module docstring).

  `spec` is `get_model_spec(config)` if the caller has it (see
  `pipeline.Task.begin`)."""
  source, spec = TASK.begin(config, spec)
  data = config.data
  if source == 'generated':
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
  if os.path.exists(os.path.join(folder, PROGRESS_FILE)):
    raise ValueError(
        f'{folder} is a generated set that was not finished; run the '
        '`python -m lra_msmra.data.prepare --generate_pathfinder` command '
        'that wrote it again to complete it.')
  examples = read_metadata(folder)
  sources, skipped, counts = {}, {}, {}
  for name, split in split_examples(examples, data.difficulty).items():
    tokens, labels, skipped[name] = load_split(folder, split, data.resolution)
    if not len(labels):
      raise ValueError(f'{folder}: the {name} split has no non-empty '
                       f'images ({len(split)} listed).')
    if spec['max_len'] > tokens.shape[1]:
      tokens = pipeline.pad_or_truncate(tokens, spec['max_len'], np.uint8)
    sources[name] = pipeline.ArraySource({'inputs': tokens,
                                          'targets': labels})
    counts[name] = len(labels)
  train = pipeline.with_train_shuffle(sources['train'], data.shuffle,
                                      BATCH_SHUFFLE_WINDOW)
  zero = float(np.mean(sources['test'].arrays['inputs'] == 0))
  # Files our generator wrote carry its stamp, wherever they were written.
  stamp = read_stamp(folder)
  notes = {
      'data_dir': folder,
      'data_source': 'release' if stamp is None else 'generated',
      'resolution': data.resolution,
      'difficulty': f'{data.difficulty} ({DIFFICULTIES[data.difficulty]})',
      'split': 'TFDS order (md5 of difficulty + key), 80/10/10',
      'examples': counts,
      'empty_pngs_skipped': skipped,  # P21.
      'test_fraction_zero_pixels': zero,
      **pipeline.fidelity_notes(config, train.train_shuffle),
  }
  if stamp is not None:
    notes['generator'] = TASK.generator_settings(stamp['spec'])
  return pipeline.TaskData(
      train=train, eval=sources['eval'], test=sources['test'], spec=spec,
      notes=notes)
