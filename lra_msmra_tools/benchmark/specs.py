"""The benchmarks' command-line mini-language: mechanism specs and lengths.

A spec is a mechanism (or config) name plus knob overrides,
`name:key=value,key=value`; several specs are separated by commas
(`softmax,cst:slice_length=8,alpha=1,combiner:variant=fixed`). A knob value
is read by `parse_value`: `true`/`false`/`none` (any case), an integer, a
decimal number, a fraction `a/b` of two numbers (a float: `1/2` -> 0.5),
a comma list of values in parentheses or brackets (a tuple:
`(1/2,1/8,1/32)`), else the text itself as a string; other arithmetic
(`2*4`) is an error. Lengths are `1024,2048` or `1K,2K`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Spec:
  """A mechanism (or config) name plus knob overrides.

  Attributes:
    name: registry name (attention benchmark) or config name (train step).
    kw: knob overrides, e.g. {'slice_length': 8}.
  """
  name: str
  kw: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def label(self) -> str:
    """`name` or `name:key=value,...` (the form `parse_specs` reads)."""
    if not self.kw:
      return self.name
    knobs = ','.join(f'{k}={_format_value(v)}' for k, v in self.kw.items())
    return f'{self.name}:{knobs}'


def _format_value(value: Any) -> str:
  if isinstance(value, (list, tuple)):
    return '(' + ','.join(_format_value(v) for v in value) + ')'
  if isinstance(value, float):
    return f'{value:g}'
  return str(value)


_NUMBER = r'-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?'
_INT = re.compile(r'-?\d+')
_FLOAT = re.compile(_NUMBER)
_FRACTION = re.compile(rf'({_NUMBER})\s*/\s*({_NUMBER})')
# Numbers joined by operators: arithmetic, which values do not support.
_ARITHMETIC = re.compile(rf'[-+]?{_NUMBER}(?:\s*[-+*/]\s*[-+]?{_NUMBER})+')
_CLOSING = {'(': ')', '[': ']'}


def _is_group(text: str) -> bool:
  """Whether `text` is one parenthesised or bracketed group, `(...)`."""
  if len(text) < 2 or _CLOSING.get(text[0]) != text[-1]:
    return False
  depth = 0
  for i, ch in enumerate(text):
    if ch in '([':
      depth += 1
    elif ch in ')]':
      depth -= 1
    if depth == 0:
      return i == len(text) - 1
  return False


def parse_value(text: str) -> Any:
  """A knob value: `true`/`false`/`none` (any case) -> True/False/None,
  `8` -> 8, `0.5` or `1e-3` -> float, `1/2` -> 0.5, `(1/2,1/8)` or
  `[1/2,1/8]` -> (0.5, 0.125), anything else -> the text itself.

  Raises:
    ValueError: arithmetic other than one fraction (`2*4`, `1/2/2`), or a
      fraction over zero.
  """
  text = text.strip()
  lowered = text.lower()
  if lowered in ('true', 'false'):
    return lowered == 'true'
  if lowered == 'none':
    return None
  if _is_group(text):
    return tuple(parse_value(part) for part in _split_top_level(text[1:-1]))
  if _INT.fullmatch(text):
    return int(text)
  if _FLOAT.fullmatch(text):
    return float(text)
  fraction = _FRACTION.fullmatch(text)
  if fraction:
    numerator, denominator = (float(x) for x in fraction.groups())
    if denominator == 0:
      raise ValueError(f'Knob value {text!r} divides by zero.')
    return numerator / denominator
  if _ARITHMETIC.fullmatch(text):
    raise ValueError(f'Knob value {text!r}: arithmetic is not supported; '
                     'write a number or a fraction a/b.')
  return text


def _split_top_level(text: str) -> list[str]:
  """Splits on commas outside parentheses/brackets."""
  parts, depth, current = [], 0, []
  for ch in text:
    if ch in '([':
      depth += 1
    elif ch in ')]':
      depth -= 1
    if ch == ',' and depth == 0:
      parts.append(''.join(current))
      current = []
    else:
      current.append(ch)
  parts.append(''.join(current))
  return [p.strip() for p in parts if p.strip()]


def parse_specs(text: str) -> list[Spec]:
  """Parses `softmax,cst:slice_length=8,alpha=1,combiner:variant=fixed`.

  A token `name` or `name:key=value` starts a new spec; a following token
  `key=value` (no colon) adds a knob to the current spec. Values are read
  by `parse_value` (`8`, `1/2`, `(1/2,1/8)`, `true`, else strings).

  Raises:
    ValueError: a knob before any name, a malformed token or value, a
      repeated knob or a repeated spec.
  """
  specs: list[tuple[str, dict[str, Any]]] = []
  for token in _split_top_level(text):
    if ':' in token:
      name, knob = token.split(':', 1)
      specs.append((name.strip(), {}))
      token = knob
    elif '=' not in token:
      specs.append((token, {}))
      continue
    if not specs:
      raise ValueError(f'Knob {token!r} comes before any mechanism name; '
                       'write name:key=value.')
    if '=' not in token:
      raise ValueError(f'Malformed knob {token!r}; write key=value.')
    key, value = token.split('=', 1)
    key = key.strip()
    if not key.isidentifier():
      raise ValueError(f'Malformed knob name {key!r} in {text!r}.')
    if key in specs[-1][1]:
      raise ValueError(f'Knob {key!r} given twice for {specs[-1][0]!r}.')
    specs[-1][1][key] = parse_value(value)
  result = [Spec(name, kw) for name, kw in specs]
  labels = [s.label for s in result]
  duplicates = sorted({l for l in labels if labels.count(l) > 1})
  if duplicates:
    raise ValueError(f'Mechanism(s) {duplicates} requested twice.')
  if not result:
    raise ValueError('No mechanism given.')
  return result


def parse_lengths(text: str) -> list[int]:
  """`1024,2048` -> [1024, 2048]; `1K,2K` works too. Sorted, unique."""
  lengths = []
  for token in _split_top_level(text):
    scale = 1
    if token[-1] in 'kK':
      token, scale = token[:-1], 1024
    try:
      value = int(token) * scale
    except ValueError:
      raise ValueError(f'Length {token!r} is not an integer.') from None
    if value < 1:
      raise ValueError(f'Length {value} must be positive.')
    lengths.append(value)
  if not lengths:
    raise ValueError('No length given.')
  return sorted(set(lengths))


def parse_flags(parser, mechanisms: str, lengths: str
                ) -> tuple[list[Spec], list[int]]:
  """`--mechanisms` and `--lengths` of a benchmark command, or its parser's
  one-line usage error naming the flag (`parser.error` exits)."""
  parsed = []
  for flag, parse, text in (('--mechanisms', parse_specs, mechanisms),
                            ('--lengths', parse_lengths, lengths)):
    try:
      parsed.append(parse(text))
    except ValueError as e:
      parser.error(f'{flag}: {e}')
  return parsed[0], parsed[1]
