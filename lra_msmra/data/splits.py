"""TFDS's split-spec arithmetic, without TFDS.

`tfds.load(name, split='train[:90%]')` reads a slice of a stored split;
which examples it reads is plain arithmetic on the split's size
(`tfds.core.ReadInstruction.from_spec(spec).to_absolute(sizes)`). The
generated Text and Image examples (`tfds_io.load_or_mock`) and the
Pathfinder splits (`pathfinder.split_examples`) slice with this module, so
they take exactly the examples TFDS would, with TensorFlow not installed.
tests/data/test_splits.py compares it with TFDS's own code.

Specs, as `tfds.load` takes them (https://www.tensorflow.org/datasets/splits):

  train                 the whole split
  train[10:20]          examples 10..19; negative indices count from the end
  train[:90%]           percent boundaries (floats allowed), rounded to the
                        closest example ('closest', TFDS's default rounding)
  train[90%:]+test      several slices, read one after the other
  all                   every split, in the order of `sizes`

Shard slices (`train[2shard]`) need the shard lengths of stored files and
are refused.
"""

from __future__ import annotations

import re
from typing import Mapping, NamedTuple

# The patterns of tensorflow_datasets/core/splits.py.
_SUB_SPEC_RE = re.compile(
    r'^(?P<split_name>[\w-]+)(\[(?P<split_selector>[\d\w%:.-]+)\])?$')
_SLICE_RE = re.compile(r'^((?P<val>-?[\d_.]+)(?P<unit>(?:%|shard))?)?$')
_ADDITION_SEP_RE = re.compile(r'\s*\+\s*')


class Slice(NamedTuple):
  """Examples `start` .. `stop - 1` of the stored split `split`."""
  split: str
  start: int
  stop: int


def percent_boundary(percent: float, num: int) -> int:
  """TFDS's 'closest' rounding of a percent slice boundary (Python's
  `round`, so halves go to the even neighbour)."""
  return int(round(percent * num / 100.0))


def _relative(spec: str) -> tuple[str, float | int | None,
                                  float | int | None, str]:
  """(split name, from, to, unit) of one `+`-free spec, as TFDS parses it.

  Raises:
    ValueError: a spec TFDS would not parse, or a shard slice.
  """
  bad = (f'Unrecognized split format: {spec!r}. See format at '
         'https://www.tensorflow.org/datasets/splits')
  res = _SUB_SPEC_RE.match(spec)
  if not res:
    raise ValueError(bad)
  name, selector = res.group('split_name'), res.group('split_selector')
  if name == 'all' and selector:
    raise ValueError(f'{spec!r}: the split `all` takes no slice.')
  if selector is None:
    return name, None, None, 'abs'
  slices = [_SLICE_RE.match(x) for x in selector.split(':')]
  if not all(slices) or not any(m.group(0) for m in slices):
    raise ValueError(bad)
  if len(slices) != 2:
    raise ValueError(f'{spec!r}: only [from:to] slices are supported (no '
                     'single index, no shard slices).')
  from_match, to_match = slices
  unit = from_match['unit'] or to_match['unit'] or 'abs'
  if unit == 'shard':
    raise ValueError(f'{spec!r}: shard slices need the stored files; use '
                     'example or percent boundaries.')
  convert = float if unit == '%' else int
  from_, to = (None if m['val'] is None else convert(m['val'])
               for m in (from_match, to_match))
  if unit == '%' and (abs(from_ or 0) > 100 or abs(to or 0) > 100):
    raise ValueError(f'{spec!r}: percent slice boundaries must be in '
                     '[-100, 100].')
  return name, from_, to, unit


def to_absolute(spec: str, sizes: Mapping[str, int]) -> list[Slice]:
  """The examples `tfds.load(split=spec)` reads from splits of `sizes`.

  Args:
    spec: a TFDS split spec (module docstring).
    sizes: stored split name -> number of examples; `all` means these splits
      in this order.

  Returns:
    One `Slice` per `+`-separated part, in order; `start > stop` reads
    nothing (as TFDS).

  Raises:
    ValueError: a malformed spec, an unknown split or a boundary beyond the
      split, with TFDS's conditions.
  """
  parts = _ADDITION_SEP_RE.split(str(spec))
  relative = []
  for part in parts:
    if part == 'all':
      relative += [(name, None, None, 'abs') for name in sizes]
    else:
      relative.append(_relative(part))
  out = []
  for name, from_, to, unit in relative:
    if name not in sizes:
      raise ValueError(f'Unknown split {name!r}. Should be one of '
                       f'{list(sizes)}.')
    num = sizes[name]
    if unit == '%':
      start = 0 if from_ is None else percent_boundary(from_, num)
      stop = num if to is None else percent_boundary(to, num)
    else:
      start = 0 if from_ is None else from_
      stop = num if to is None else to
    if abs(start) > num or abs(stop) > num:
      raise ValueError(f'Requested slice [{start or ""}:{stop or ""}] of '
                       f'{spec!r} incompatible with {num} examples.')
    out.append(Slice(name, start + num if start < 0 else start,
                     stop + num if stop < 0 else stop))
  return out
