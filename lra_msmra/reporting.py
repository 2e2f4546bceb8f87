"""What the benchmarks and `lra_msmra.results` share to write their reports:
the byte format, markdown tables and matplotlib.

No JAX here; matplotlib is imported only when `pyplot()` is called. What
only the benchmarks use (time, FLOP and ratio formats, the JSON writer,
log-log panels) is in `lra_msmra.benchmark.outputs`.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

MIB = 2 ** 20


def fmt_bytes(value: Optional[float]) -> str:
  if value is None:
    return '—'
  return f'{value / MIB:,.0f} MB' if value >= 10 * MIB else (
      f'{value / MIB:.1f} MB')


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]
                   ) -> str:
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  for row in rows:
    lines.append('| ' + ' | '.join(str(c) for c in row) + ' |')
  return '\n'.join(lines)


def pyplot():
  """matplotlib.pyplot with the non-interactive Agg backend (lazy import)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt
