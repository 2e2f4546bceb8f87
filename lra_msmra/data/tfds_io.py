"""TFDS reading shared by the Text (IMDb) and Image (CIFAR-10) pipelines.

LRA reads both datasets with `tfds.load` (docs/protocol.md §5.2, §5.4); so do
we, and then hold the splits as numpy arrays. TensorFlow and TFDS are imported
inside the functions only, so importing `lra_msmra` stays fast and TF-free.

Where the data lives: `config.data_dir` is either the folder written by
`python -m lra_msmra.data.prepare` (its `tensorflow_datasets/` subfolder is
used) or any TFDS data dir holding `imdb_reviews/` and `cifar10/`. We never
download during training (`download=False`): the preparation command does it
once (`--tfds`), or `tfds build imdb_reviews cifar10 --data_dir DIR`.

Without data (runlocal and tests), `mock` serves generated examples through
`tfds.testing.mock_data`: the same `tfds.load` call, the dataset's real
feature spec and TFDS's own split-slicing arithmetic (`train[:90%]`).
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

# Subfolder of a prepared data folder that is a TFDS data dir.
TFDS_SUBDIR = 'tensorflow_datasets'


def resolve_data_dir(data_dir: str) -> str:
  """The TFDS data dir of `config.data_dir` (see the module docstring)."""
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(
        f'config.data_dir={data_dir!r} is not a directory. Point it at the '
        'folder written by `python -m lra_msmra.data.prepare --tfds --out '
        'DIR` (or at a TFDS data dir), or set config.data.generate=True for '
        'mock data.')
  sub = os.path.join(data_dir, TFDS_SUBDIR)
  return sub if os.path.isdir(sub) else data_dir


def load(name: str, splits: Sequence[str], data_dir: str | None,
         fields: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
  """Reads whole splits of a TFDS dataset in stored order.

  Args:
    name: TFDS dataset name, e.g. 'imdb_reviews'.
    splits: TFDS split specs, e.g. ['train[:90%]', 'test'].
    data_dir: TFDS data dir; None inside `mock`.
    fields: feature names to keep.

  Returns:
    split spec -> field -> array with one row per example (strings come back
    as an object array of bytes).

  Raises:
    FileNotFoundError: the dataset is not prepared in `data_dir`.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    datasets = tfds.load(name, split=list(splits), data_dir=data_dir,
                         download=False, shuffle_files=False)
  except Exception as e:  # TFDS raises several types for missing data.
    raise FileNotFoundError(
        f'TFDS dataset {name!r} is not prepared in {data_dir}: {e}\nRun '
        '`python -m lra_msmra.data.prepare --tfds --out DIR` on a machine '
        'with internet access and set config.data_dir=DIR.') from None
  out = {}
  for spec, ds in zip(splits, datasets):
    parts = {f: [] for f in fields}
    for batch in tfds.as_numpy(ds.batch(4096)):
      for f in fields:
        parts[f].append(batch[f])
    out[spec] = {f: (np.concatenate(v) if v else np.zeros(0))
                 for f, v in parts.items()}
  return out


@contextlib.contextmanager
def mock(examples: Mapping[str, Mapping[str, np.ndarray]]) -> Iterator[None]:
  """Makes `tfds.load` serve `examples` instead of files.

  Args:
    examples: base split name ('train', 'test') -> feature name -> array with
      one row per example, in the dataset's feature dtypes.

  Yields:
    Nothing; `load(..., data_dir=None)` inside the context reads `examples`.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  sizes = {name: types.SimpleNamespace(
      num_examples=len(next(iter(fields.values()))))
           for name, fields in examples.items()}

  def as_dataset(builder, split, decoders=None, read_config=None, **kwargs):
    del decoders, read_config, kwargs
    parts = tfds.core.ReadInstruction.from_spec(split).to_absolute(sizes)
    rows = {f: np.concatenate([examples[p.splitname][f][p.from_:p.to]
                               for p in parts])
            for f in builder.info.features.keys()}
    return tf.data.Dataset.from_tensor_slices(rows)

  with tfds.testing.mock_data(as_dataset_fn=as_dataset,
                              policy=tfds.testing.MockPolicy.USE_CODE):
    yield


def load_or_mock(name: str, splits: Sequence[str], fields: Sequence[str],
                 config: Any, mock_examples: Callable[[], Mapping[str, Any]]
                 ) -> tuple[dict[str, dict[str, np.ndarray]], str]:
  """`load` from `config.data_dir`, or, with `config.data.generate`, from
  `mock_examples()` served through the same `tfds.load` path; returns the
  splits and a note saying which."""
  if not config.data.generate:
    tfds_dir = resolve_data_dir(config.data_dir)
    return load(name, splits, tfds_dir, fields), f'tfds {name} in {tfds_dir}'
  with mock(mock_examples()):
    data = load(name, splits, None, fields)
  return data, f'mock examples served as tfds {name} (mock_data)'
