"""TFDS reading shared by the Text (IMDb) and Image (CIFAR-10) pipelines.

LRA reads both datasets with `tfds.load` (docs/protocol.md §5.2, §5.4); so do
we, and then hold the splits as numpy arrays. TensorFlow and TFDS are an
optional install (`pip install -e .[tfds]`, requirements-tfds.txt), needed
only to read or prepare the real data: they are imported inside `load` and
`import_extra` only, so importing `lra_msmra` stays fast and TF-free, and a
missing install is reported in one line (`ExtraMissing`) that names the fix.

Where the data lives: `config.data_dir` is either the folder written by
`python -m lra_msmra.data.prepare` (its `tensorflow_datasets/` subfolder is
used) or any TFDS data dir holding `imdb_reviews/` and `cifar10/`. We never
download during training (`download=False`): the preparation command does it
once (`--tfds`), or `tfds build imdb_reviews cifar10 --data_dir DIR`.

Without data (runlocal and tests, `config.data.generate=True`), generated
examples in the dataset's format are sliced with TFDS's own split arithmetic
(`train[:90%]`, reimplemented in `lra_msmra.data.splits`), so the same
examples in the same order come out as `tfds.load` gives for them (see
`from_examples`); this needs neither TensorFlow nor TFDS.
"""

from __future__ import annotations

import importlib
import os
import types
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from lra_msmra import errors
from lra_msmra.data import splits as splits_lib

# Subfolder of a prepared data folder that is a TFDS data dir.
TFDS_SUBDIR = 'tensorflow_datasets'
# How to install the optional TensorFlow and TFDS packages.
EXTRA_INSTALL = ('pip install -e .[tfds] (or pip install -r '
                 'requirements-tfds.txt)')


class ExtraMissing(ImportError):
  """An optional package (the `tfds` extra) is needed but not installed."""


def import_extra(module: str, purpose: str) -> types.ModuleType:
  """Imports `module` of the optional `tfds` extra (TensorFlow, TFDS).

  Args:
    module: the module, e.g. 'tensorflow_datasets'.
    purpose: what needs it, the start of the error message, e.g. 'Reading
      IMDb and CIFAR-10'.

  Raises:
    ExtraMissing: the import failed; its message (one line, marked as the
      user's to fix, see `lra_msmra.errors`) names the install command.
  """
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise errors.mark(ExtraMissing(
        f'{purpose} needs the optional `tfds` extra (TensorFlow, TFDS), '
        f'which is not installed (import {module}: {errors.one_line(e)}); '
        f'install it with {EXTRA_INSTALL}.')) from e


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
    data_dir: TFDS data dir (None: TFDS's default, e.g. under
      `tfds.testing.mock_data`).
    fields: feature names to keep.

  Returns:
    split spec -> field -> array with one row per example (strings come back
    as an object array of bytes).

  Raises:
    ExtraMissing: TensorFlow or TFDS is not installed.
    FileNotFoundError: the dataset is not prepared in `data_dir`.
  """
  tfds = import_extra('tensorflow_datasets', f'Reading TFDS {name}')
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


def from_examples(examples: Mapping[str, Mapping[str, np.ndarray]],
                  splits: Sequence[str], fields: Sequence[str]
                  ) -> dict[str, dict[str, np.ndarray]]:
  """What `load(..., splits, ..., fields)` returns for a dataset that stores
  `examples`, without TFDS.

  Args:
    examples: stored split name ('train', 'test') -> feature name -> array
      with one row per example, in the dataset's feature dtypes (strings as
      an object array of bytes).
    splits: TFDS split specs, e.g. ['train[:90%]', 'test'].
    fields: feature names to keep.

  Returns:
    split spec -> field -> the rows that TFDS's slicing of `spec` selects,
    in stored order (a new array).

  Raises:
    ValueError: a spec TFDS would refuse (`splits.to_absolute`).
  """
  sizes = {name: len(next(iter(features.values())))
           for name, features in examples.items()}
  out = {}
  for spec in splits:
    parts = splits_lib.to_absolute(spec, sizes)
    out[spec] = {f: np.concatenate([examples[p.split][f][p.start:p.stop]
                                    for p in parts])
                 for f in fields}
  return out


def load_or_mock(name: str, splits: Sequence[str], fields: Sequence[str],
                 config: Any, mock_examples: Callable[[], Mapping[str, Any]]
                 ) -> tuple[dict[str, dict[str, np.ndarray]], str]:
  """`load` from `config.data_dir`, or, with `config.data.generate`, the
  same splits of `mock_examples()` (`from_examples`); returns the splits
  and a note saying which."""
  if not config.data.generate:
    tfds_dir = resolve_data_dir(config.data_dir)
    return load(name, splits, tfds_dir, fields), f'tfds {name} in {tfds_dir}'
  return (from_examples(mock_examples(), splits, fields),
          f"mock examples in tfds {name}'s format, sliced as tfds.load "
          'would slice them')
