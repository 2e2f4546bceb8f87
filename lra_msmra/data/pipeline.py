"""Deterministic, resumable batching shared by every task.

A split is a random-access `Source`: `len(source)` examples and
`source.get(indices) -> {key: np.ndarray [len(indices), ...]}`. Batching never
depends on hidden iterator state:

* Training batch `step` is a pure function of `(seed, step)`, so the data
  position of a run is its step and a resumed run sees exactly the batches it
  would have seen (docs/protocol.md §4.3 notes that LRA's tf.data pipelines are
  not seeded). Two orders exist (P10), chosen by the training split's
  `train_shuffle` (see `with_train_shuffle`):

  - `'examples'` (default): batch `step` holds stream positions
    `[step * B, (step + 1) * B)` of an endless stream in which epoch `e` is a
    permutation of the split drawn from `(seed, e)`.
  - `'batches'` (LRA's image pipelines: `repeat -> batch -> shuffle(W)`):
    the split is repeated in its stored order and cut into consecutive
    batches, so a batch always holds the same neighbouring examples; only the
    order of batches is shuffled, by a permutation drawn from `(seed, w)`
    within each window `w` of `W` consecutive batches. tf.data's shuffle
    buffer of `W` batches is unseeded and has a long tail; the window
    permutation is its deterministic counterpart: every batch of a window is
    seen exactly once, at most `W - 1` steps away from its stream position.
* Evaluation walks the split in order. The last batch is filled up with
  copies of example 0 whose `weights` are 0, so every example is counted
  exactly once and every batch has the same shape.

With several processes, each one builds only its contiguous slice of every
global batch (`process_index`, `process_count`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol

import numpy as np

from lra_msmra import config_lib

Batch = dict[str, np.ndarray]


class Source(Protocol):
  """Random access to the examples of one split."""

  def __len__(self) -> int:
    ...

  def get(self, indices: np.ndarray) -> Batch:
    ...


@dataclasses.dataclass
class ArraySource:
  """A split held as numpy arrays sharing their first axis.

  Token arrays may be stored in a narrow integer type (e.g. uint8); `get`
  returns int32 for every integer array.
  """
  arrays: Mapping[str, np.ndarray]

  def __post_init__(self):
    lengths = {k: len(v) for k, v in self.arrays.items()}
    if len(set(lengths.values())) != 1:
      raise ValueError(f'Arrays of one split differ in length: {lengths}.')

  def __len__(self) -> int:
    return len(next(iter(self.arrays.values())))

  def get(self, indices: np.ndarray) -> Batch:
    out = {}
    for k, v in self.arrays.items():
      x = v[indices]
      out[k] = x.astype(np.int32) if np.issubdtype(x.dtype, np.integer) else x
    return out


def _local_slice(global_batch: int, process_index: int, process_count: int
                 ) -> slice:
  if global_batch % process_count:
    raise ValueError(f'Global batch {global_batch} is not divisible by the '
                     f'{process_count} processes.')
  per = global_batch // process_count
  return slice(process_index * per, (process_index + 1) * per)


SHUFFLE_LEVELS = ('examples', 'batches')


@dataclasses.dataclass(frozen=True)
class TrainShuffle:
  """How training batches are drawn (see the module docstring).

  Attributes:
    level: 'examples' (a fresh permutation of the split every epoch) or
      'batches' (fixed consecutive batches, shuffled in windows: LRA, P10).
    window: 'batches' only: number of batches per shuffle window (LRA's
      shuffle buffer size); must be 0 for 'examples'.
  """
  level: str = 'examples'
  window: int = 0

  def __post_init__(self):
    if self.level not in SHUFFLE_LEVELS:
      raise ValueError(f'Shuffle level {self.level!r}; valid: '
                       f'{SHUFFLE_LEVELS}.')
    if (self.level == 'batches') != (self.window > 0):
      raise ValueError(f'Shuffle window {self.window} does not fit level '
                       f"{self.level!r}: 'batches' needs a positive window, "
                       "'examples' takes 0.")

  def describe(self) -> str:
    if self.level == 'examples':
      return 'examples (reshuffled every epoch)'
    return f'batches (LRA, P10; window of {self.window} batches)'


@dataclasses.dataclass
class ShuffledSource:
  """A split tagged with the order `TrainBatches` draws it in.

  Task modules choose the order from their config; the trainer stays
  unaware of it.
  """
  source: Source
  train_shuffle: TrainShuffle

  def __len__(self) -> int:
    return len(self.source)

  def get(self, indices: np.ndarray) -> Batch:
    return self.source.get(indices)


def with_train_shuffle(source: Source, level: str, window: int = 0
                       ) -> ShuffledSource:
  """Tags a training split with its shuffle order (`TrainShuffle`).

  Args:
    source: the training split.
    level: `config.data.shuffle`.
    window: batches per shuffle window, used only when `level` is
      'batches' (the task's LRA buffer size); other levels get 0.
  """
  return ShuffledSource(
      source, TrainShuffle(level, window if level == 'batches' else 0))


class TrainBatches:
  """Endless, seeded training batches addressed by step.

  The order is the source's `train_shuffle` when it has one (see
  `with_train_shuffle`), else example-level shuffling.
  """

  def __init__(self, source: Source, global_batch: int, seed: int,
               process_index: int = 0, process_count: int = 1):
    if len(source) == 0:
      raise ValueError('The training split is empty.')
    self.source = source
    self.global_batch = global_batch
    self.seed = seed
    self.shuffle = getattr(source, 'train_shuffle', None) or TrainShuffle()
    self._slice = _local_slice(global_batch, process_index, process_count)
    self._perms: dict[tuple[str, int], np.ndarray] = {}

  def _permutation(self, kind: str, index: int, size: int) -> np.ndarray:
    """Permutation of `size` drawn from (seed, index); a few are cached."""
    key = (kind, index)
    if key not in self._perms:
      if len(self._perms) > 2:
        self._perms.pop(next(iter(self._perms)))
      # Windows draw from a separate stream ([seed, 1, w]); epochs keep the
      # original [seed, e] so example-level batches are unchanged.
      entropy = ([self.seed, index] if kind == 'epoch' else
                 [self.seed, 1, index])
      rng = np.random.default_rng(entropy)
      self._perms[key] = rng.permutation(size)
    return self._perms[key]

  def indices(self, step: int) -> np.ndarray:
    """Example indices of global batch `step` (before the process slice)."""
    n = len(self.source)
    if self.shuffle.level == 'batches':
      window, offset = divmod(step, self.shuffle.window)
      batch = window * self.shuffle.window + int(
          self._permutation('window', window, self.shuffle.window)[offset])
      positions = batch * self.global_batch + np.arange(self.global_batch)
      return positions % n
    positions = step * self.global_batch + np.arange(self.global_batch)
    epochs, offsets = np.divmod(positions, n)
    out = np.empty(self.global_batch, dtype=np.int64)
    for e in np.unique(epochs):
      sel = epochs == e
      out[sel] = self._permutation('epoch', int(e), n)[offsets[sel]]
    return out

  def get(self, step: int) -> Batch:
    """This process's part of training batch `step`."""
    return self.source.get(self.indices(step)[self._slice])


def eval_batches(source: Source, global_batch: int, num_steps: int = -1,
                 process_index: int = 0, process_count: int = 1
                 ) -> Iterator[Batch]:
  """Yields this process's part of each evaluation batch, with `weights`.

  Args:
    source: the split.
    global_batch: batch size across all processes.
    num_steps: number of batches; -1 = the whole split.
    process_index: this process.
    process_count: number of processes.
  """
  n = len(source)
  total = -(-n // global_batch)
  if num_steps != -1:
    total = min(total, num_steps)
  local = _local_slice(global_batch, process_index, process_count)
  for b in range(total):
    positions = b * global_batch + np.arange(global_batch)
    real = positions < n
    idx = np.where(real, positions, 0)[local]
    batch = source.get(idx)
    batch['weights'] = real[local].astype(np.float32)
    yield batch


class RaggedSource:
  """Variable-length id sequences stored flat, zero-padded at batch time.

  Holding long documents padded would cost `n * length` ids per key (e.g.
  Retrieval: 147k pairs x 2 x 4000); here each key keeps one flat array of
  the real ids (narrow dtype, e.g. uint8 bytes) plus offsets.

  Attributes:
    length: every sequence is truncated / zero-padded to this many ids.
    id_offset: added to every stored value (e.g. 1 turns bytes 0..255 into
      ids 1..256 with 0 left for padding).
  """

  def __init__(self, sequences: Mapping[str, list[np.ndarray]],
               dense: Mapping[str, np.ndarray], length: int,
               id_offset: int = 0):
    """Builds the source.

    Args:
      sequences: key -> list of 1-D integer arrays (one per example).
      dense: key -> array `[n, ...]` returned as is (e.g. `targets`).
      length: padded length of every sequence key.
      id_offset: added to every stored sequence value.
    """
    sizes = {k: len(v) for k, v in {**sequences, **dense}.items()}
    if len(set(sizes.values())) != 1:
      raise ValueError(f'Fields of one split differ in length: {sizes}.')
    self.length = length
    self.id_offset = id_offset
    self._flat, self._starts, self._lengths = {}, {}, {}
    for k, seqs in sequences.items():
      lengths = np.array([min(len(x), length) for x in seqs], np.int64)
      starts = np.zeros(len(seqs) + 1, np.int64)
      np.cumsum(lengths, out=starts[1:])
      flat = (np.concatenate([np.asarray(x)[:n] for x, n in
                              zip(seqs, lengths)]) if len(seqs) else
              np.zeros(0, np.uint8))
      self._flat[k], self._starts[k], self._lengths[k] = flat, starts, lengths
    self._dense = dict(dense)

  def __len__(self) -> int:
    return len(next(iter({**self._lengths, **self._dense}.values())))

  def lengths(self, key: str) -> np.ndarray:
    """Stored (truncated) length of every sequence of `key`."""
    return self._lengths[key]

  def get(self, indices: np.ndarray) -> Batch:
    out = {}
    for k, flat in self._flat.items():
      x = np.zeros((len(indices), self.length), np.int32)
      for row, i in enumerate(indices):
        start, n = self._starts[k][i], self._lengths[k][i]
        x[row, :n] = flat[start:start + n].astype(np.int32) + self.id_offset
      out[k] = x
    for k, v in self._dense.items():
      x = v[indices]
      out[k] = x.astype(np.int32) if np.issubdtype(x.dtype, np.integer) else x
    return out


def fidelity_notes(config: Any, shuffle: TrainShuffle) -> dict[str, Any]:
  """The LRA fidelity switches of a run, for results.json (P8, P9, P10)."""
  m = config.model
  return {
      'zero_id_is_padding': bool(m.mask_padding),  # P8: black pixels too.
      'pooling': m.pooling,  # P9: 'MEAN' is unmasked (LRA), 'MASKED_MEAN' not.
      'train_shuffle': shuffle.describe(),  # P10.
  }


def _check_exact_keys(where: str, cfg: Any, expected: set[str]) -> None:
  keys = set(cfg.keys())
  if keys != expected:
    raise ValueError(f'{where} must have exactly the keys {sorted(expected)}; '
                     f'unknown {sorted(keys - expected)}, missing '
                     f'{sorted(expected - keys)}.')


def check_data_keys(task: str, data: Any, keys: set[str],
                    generator_keys: set[str]) -> None:
  """Checks the exact keys of `config.data` and `.generator`, `generate` and
  `shuffle`."""
  _check_exact_keys(f'config.data for {task}', data, keys | {'generate'})
  _check_exact_keys('config.data.generator', data.generator, generator_keys)
  if not isinstance(data.generate, bool):
    raise ValueError(f'config.data.generate={data.generate!r} must be True '
                     'or False.')
  if 'shuffle' in keys and data.shuffle not in SHUFFLE_LEVELS:
    raise ValueError(f'config.data.shuffle={data.shuffle!r}; valid: '
                     f'{SHUFFLE_LEVELS}.')


# Where a run's examples come from (recorded in results.json):
#   release    files of the LRA release (or TFDS for IMDb and CIFAR-10);
#   generated  our seeded implementation of the official generator (ListOps);
#   mock       stand-in examples in the task's real format, for plumbing
#              checks only: never comparable with any published number.
DATA_SOURCES = ('release', 'generated', 'mock')
RELEASE_HINT = ('download the LRA release once (lra_release.gz, see README) '
                'and run `python -m lra_msmra.data.prepare --lra_release '
                'lra_release.gz --out DIR`')


def data_source(config: Any, synthetic: str, prepare: str) -> str:
  """The source a config asks for: 'release', or `synthetic` with
  `data.generate=True`; raises if it asks for neither or both.

  Args:
    config: the run config (`data_dir`, `data.generate`).
    synthetic: what `data.generate=True` gives this task, 'generated' or
      'mock'.
    prepare: how to get the task's real data, for the error message.
  """
  if synthetic not in DATA_SOURCES[1:]:
    raise ValueError(f'synthetic={synthetic!r}; valid: {DATA_SOURCES[1:]}.')
  if config.data_dir and config.data.generate:
    raise ValueError(
        f'config.data_dir={config.data_dir!r} and config.data.generate=True '
        'ask for two data sources; drop one of them.')
  if config.data_dir:
    return 'release'
  if config.data.generate:
    return synthetic
  fallback = (
      'or --config.data.generate=True, our seeded implementation of the '
      'official generator' if synthetic == 'generated' else
      '--config.data.generate=True gives mock examples for plumbing checks '
      'only, never comparable with published numbers; the `runlocal` option '
      'sets it')
  raise ValueError(
      f'config.data_dir is empty: the {config.task} config needs its data. '
      f'To prepare it, {prepare}; then pass --config.data_dir=DIR ({fallback}'
      ').')


@dataclasses.dataclass(frozen=True)
class Task:
  """What a task module declares once: its vocabulary, labels, config keys
  and data sources; the shared checks, the model spec (which its
  `TaskData` carries) and the data source use it.

  Attributes:
    name: the task name of error messages.
    vocab_size: token table size (id 0 = padding).
    num_classes: number of labels.
    dual: two documents per example (Retrieval).
    data_keys: keys of `config.data` besides `generate` and `generator`.
    generator_keys: keys of `config.data.generator`.
    synthetic: what `data.generate=True` gives: 'generated' or 'mock'.
    prepare: how to get the real data, for error messages.
    length: tokens per example (per document) before extra padding, from
      `config.data`.
    extra_check: the task's own checks of `config.data`, if any.
    generator_defaults: the value the generator takes for each of
      `generator_keys` that a call leaves out; a generated folder's stamp
      records only what its call gave, and `generator_settings` completes
      it, so two records of the same data are equal.
  """
  name: str
  vocab_size: int
  num_classes: int
  dual: bool
  data_keys: frozenset[str]
  generator_keys: frozenset[str]
  synthetic: str
  prepare: str
  length: Callable[[Any], int]
  extra_check: Optional[Callable[[Any], None]] = None
  generator_defaults: Mapping[str, Any] = dataclasses.field(
      default_factory=dict)

  def generator_settings(self, settings: Mapping[str, Any]
                         ) -> dict[str, Any]:
    """`settings` with every generator key the call left out set to the
    generator's default."""
    return {**self.generator_defaults, **settings}

  def check(self, data: Any) -> None:
    """Keys, `generate`, `shuffle`, the task's own checks, then lengths."""
    check_data_keys(self.name, data, set(self.data_keys) | {'generator'},
                    set(self.generator_keys))
    if self.extra_check is not None:
      self.extra_check(data)
    check_length(data, self.length(data))

  def max_len(self, data: Any) -> int:
    """Input length the model sees: `pad_to_length`, else `length`."""
    return data.pad_to_length or self.length(data)

  def model_spec(self, config: Any) -> dict[str, Any]:
    """What the model needs from the task, from the config alone: checks
    `config.data`, then returns `vocab_size`, `num_classes`, `max_len` and
    `dual`. The only place a task's spec is built: `TaskData.spec` is
    this dict."""
    self.check(config.data)
    return {'vocab_size': self.vocab_size, 'num_classes': self.num_classes,
            'max_len': self.max_len(config.data), 'dual': self.dual}

  def source(self, config: Any) -> str:
    """The data source the config asks for (see `data_source`)."""
    return data_source(config, self.synthetic, self.prepare)

  def begin(self, config: Any, spec: Optional[Mapping[str, Any]] = None
            ) -> tuple[str, Mapping[str, Any]]:
    """What every `get_datasets` starts with: the data source and the
    model spec.

    Args:
      config: the run config.
      spec: `model_spec(config)` when the caller already has it (a run
        has, from validating its config): `config.data` was checked when
        it was built and is not checked again. None: built here, which
        checks `config.data`.
    """
    if spec is None:
      spec = self.model_spec(config)
    return self.source(config), spec


def generate_once(folder: str, spec: Mapping[str, Any],
                  generate: Callable[[], Any]) -> str:
  """Runs `generate()` (which writes `folder`) unless `folder` already holds
  data of `spec`; returns `folder`.

  `folder/generator.json` records `spec` and, if `generate()` returns a
  mapping, that mapping (e.g. timing and label counts). It is written last and atomically (write,
  then rename), so hosts of a multi-host run generating into a shared
  folder, or a run killed while generating, never leave a stamp beside
  incomplete data.
  """
  spec = json.loads(json.dumps(spec))
  stamp = read_generator_stamp(folder)
  if stamp is not None and stamp.get('spec') == spec:
    return folder
  details = generate()
  details = dict(details) if isinstance(details, Mapping) else {}
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, GENERATOR_STAMP)
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump({'spec': spec, 'details': details}, f, indent=1)
  os.replace(tmp, path)
  return folder


GENERATOR_STAMP = 'generator.json'


def read_generator_stamp(folder: str) -> Optional[dict[str, Any]]:
  """`folder/generator.json` as `generate_once` wrote it, or None."""
  path = os.path.join(folder, GENERATOR_STAMP)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def check_length(data: Any, length: Any) -> None:
  """Checks `length` (tokens per example) against `data.pad_to_length`."""
  if not config_lib.is_int(length) or length < 1:
    raise ValueError(f'config.data.max_length={length!r} must be a positive '
                     'integer.')
  pad = data.pad_to_length
  if not config_lib.is_int(pad) or pad < 0:
    raise ValueError(f'config.data.pad_to_length={pad!r} must be a '
                     'non-negative integer (0 = no extra padding).')
  if data.pad_to_length and data.pad_to_length < length:
    raise ValueError(f'config.data.pad_to_length={data.pad_to_length} is '
                     f'below the {length} tokens of an example; use 0 for '
                     'none.')


def pad_or_truncate(tokens: list[np.ndarray] | list[list[int]], length: int,
                    dtype: Any = np.int32) -> np.ndarray:
  """Stacks id sequences into `[n, length]`, truncating and zero-padding."""
  out = np.zeros((len(tokens), length), dtype=dtype)
  for i, t in enumerate(tokens):
    t = np.asarray(t[:length])
    out[i, :len(t)] = t
  return out


def check_labels(labels: np.ndarray, num_classes: int, where: str
                 ) -> np.ndarray:
  """Labels as int32; raises naming the first one outside the classes."""
  labels = np.asarray(labels).astype(np.int32)
  bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
  if bad.size:
    raise ValueError(f'{where}: label {labels[bad[0]]} of example {bad[0]} '
                     f'is outside 0..{num_classes - 1}.')
  return labels


@dataclasses.dataclass
class TaskData:
  """What every task module's `get_datasets(config)` returns.

  Attributes:
    train, eval, test: the three splits.
    spec: the task's model spec (`Task.model_spec`), which the splits
      follow: `max_len` tokens per document, ids below `vocab_size`, labels
      below `num_classes`, `inputs2` in batches when `dual`.
    notes: facts about the data worth recording next to results (fidelity
      switches, quirks such as validation = test).
  """
  train: Source
  eval: Source
  test: Source
  spec: Mapping[str, Any]
  notes: Optional[dict[str, Any]] = None

  @property
  def vocab_size(self) -> int:
    """Token table size (id 0 = padding)."""
    return self.spec['vocab_size']

  @property
  def num_classes(self) -> int:
    return self.spec['num_classes']

  @property
  def max_len(self) -> int:
    """Input length the model sees (tokens per document)."""
    return self.spec['max_len']

  @property
  def dual(self) -> bool:
    """Two documents per example (batches carry `inputs2`)."""
    return self.spec['dual']
