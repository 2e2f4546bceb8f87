"""Deterministic, resumable batching shared by every task.

A split is a random-access `Source`: `len(source)` examples and
`source.get(indices) -> {key: np.ndarray [len(indices), ...]}`. Batching never
depends on hidden iterator state:

* Training batch `step` holds the examples at stream positions
  `[step * B, (step + 1) * B)` of an endless stream in which epoch `e` is a
  permutation of the split drawn from `(seed, e)`. The data position of a run
  is therefore its step, and a resumed run sees exactly the batches it would
  have seen (PROTOCOL §4.3 notes that LRA's tf.data pipelines are not seeded).
* Evaluation walks the split in order. The last batch is filled up with
  copies of example 0 whose `weights` are 0, so every example is counted
  exactly once and every batch has the same shape.

With several processes, each one builds only its contiguous slice of every
global batch (`process_index`, `process_count`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping, Optional, Protocol

import numpy as np

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


class TrainBatches:
  """Endless, seeded, example-level shuffled batches addressed by step."""

  def __init__(self, source: Source, global_batch: int, seed: int,
               process_index: int = 0, process_count: int = 1):
    if len(source) == 0:
      raise ValueError('The training split is empty.')
    self.source = source
    self.global_batch = global_batch
    self.seed = seed
    self._slice = _local_slice(global_batch, process_index, process_count)
    self._perms: dict[int, np.ndarray] = {}

  def _permutation(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      if len(self._perms) > 2:
        self._perms.pop(min(self._perms))
      rng = np.random.default_rng([self.seed, epoch])
      self._perms[epoch] = rng.permutation(len(self.source))
    return self._perms[epoch]

  def indices(self, step: int) -> np.ndarray:
    """Example indices of global batch `step` (before the process slice)."""
    n = len(self.source)
    positions = step * self.global_batch + np.arange(self.global_batch)
    epochs, offsets = np.divmod(positions, n)
    out = np.empty(self.global_batch, dtype=np.int64)
    for e in np.unique(epochs):
      sel = epochs == e
      out[sel] = self._permutation(int(e))[offsets[sel]]
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


def pad_or_truncate(tokens: list[np.ndarray] | list[list[int]], length: int,
                    dtype: Any = np.int32) -> np.ndarray:
  """Stacks id sequences into `[n, length]`, truncating and zero-padding."""
  out = np.zeros((len(tokens), length), dtype=dtype)
  for i, t in enumerate(tokens):
    t = np.asarray(t[:length])
    out[i, :len(t)] = t
  return out


def smallest_int_dtype(vocab_size: int) -> np.dtype:
  """Narrowest unsigned dtype that holds ids 0..vocab_size-1."""
  for dt in (np.uint8, np.uint16, np.uint32):
    if vocab_size - 1 <= np.iinfo(dt).max:
      return np.dtype(dt)
  return np.dtype(np.int64)


def majority_rate(labels: np.ndarray) -> tuple[int, float]:
  """Most frequent label and its frequency (accuracy of always guessing it)."""
  labels = np.asarray(labels)
  if labels.size == 0:
    return 0, float('nan')
  values, counts = np.unique(labels, return_counts=True)
  return int(values[np.argmax(counts)]), float(counts.max() / labels.size)


@dataclasses.dataclass
class TaskData:
  """What every task module's `get_datasets(config)` returns.

  Attributes:
    train, eval, test: the three splits.
    num_classes: number of labels.
    vocab_size: token table size (id 0 = padding).
    max_len: input length the model sees (tokens per document).
    dual: True for two-document tasks (batches carry `inputs2`).
    notes: facts about the data worth recording next to results (fidelity
      switches, quirks such as validation = test).
  """
  train: Source
  eval: Source
  test: Source
  num_classes: int
  vocab_size: int
  max_len: int
  dual: bool = False
  notes: Optional[dict[str, Any]] = None
