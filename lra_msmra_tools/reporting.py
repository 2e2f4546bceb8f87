"""What the benchmarks and `lra_msmra_tools.results` share to write their reports:
the byte format, markdown tables and matplotlib.

No JAX here; matplotlib is imported only when `pyplot()` is called. What
only the benchmarks use (time, FLOP and ratio formats, the JSON writer,
log-log panels) is in `lra_msmra_tools.benchmark.outputs`.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

MIB = 2 ** 20


def fmt_bytes(value: Optional[float]) -> str:
  """Bytes in MiB (2^20 bytes), the one memory unit of every report and
  plot: '4,395 MiB' for 4,608,937,984 bytes."""
  if value is None:
    return '—'
  return f'{value / MIB:,.0f} MiB' if value >= 10 * MIB else (
      f'{value / MIB:.1f} MiB')


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]
                   ) -> str:
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  for row in rows:
    lines.append('| ' + ' | '.join(str(c) for c in row) + ' |')
  return '\n'.join(lines)


def line_styles(keys: Sequence[str]) -> dict[str, dict[str, Any]]:
  """A colour and a marker (None or 'o') per key, no two keys alike.

  Up to ten keys take tab10's colours; past ten, the twenty colours of
  tab20 (its ten darker shades first) and a round marker on the keys of
  the second ten, whose colours are the lighter shades of the first ten's.
  """
  plt = pyplot()
  if len(keys) <= 10:
    return {k: {'color': plt.get_cmap('tab10')(i), 'marker': None}
            for i, k in enumerate(keys)}
  order = list(range(0, 20, 2)) + list(range(1, 20, 2))
  return {k: {'color': plt.get_cmap('tab20')(order[i % 20]),
              'marker': 'o' if (i % 20) >= 10 else None}
          for i, k in enumerate(keys)}


def pyplot():
  """matplotlib.pyplot with the non-interactive Agg backend (lazy import)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def replace_between(path: str, start: str, end: str, text: str) -> None:
  """Puts `text` between the markers `start` and `end` of the file `path`
  (each report's generated section of a doc)."""
  with open(path, encoding='utf-8') as f:
    doc = f.read()
  if start not in doc or end not in doc:
    raise SystemExit(f'{path}: no {start} ... {end} markers to replace.')
  head, rest = doc.split(start, 1)
  _, tail = rest.split(end, 1)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(f'{head}{start}\n{text}\n{end}{tail}')
