"""What the benchmarks write to `--out` beside the shared pieces: time,
FLOP and ratio formats, the JSON writer and the log-log panel plots.

What `lra_msmra_tools.results` uses too (the byte format, markdown tables,
matplotlib) is in `lra_msmra_tools.reporting`.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from typing import Any, Mapping, Optional, Sequence

from lra_msmra_tools import reporting


def fmt_time(seconds: Optional[float]) -> str:
  if seconds is None:
    return '—'
  if seconds >= 1:
    return f'{seconds:.2f} s'
  return f'{seconds * 1e3:.1f} ms'


def fmt_flops(flops: Optional[float]) -> str:
  if flops is None:
    return '—'
  if flops >= 1e12:
    return f'{flops / 1e12:.3g} TFLOP'
  if flops >= 1e9:
    return f'{flops / 1e9:.3g} GFLOP'
  return f'{flops / 1e6:.3g} MFLOP'


def fmt_ratio(value: Optional[float], digits: int = 2) -> str:
  return '—' if value is None else f'{value:.{digits}f}×'


def write_json(path: str, data: Any) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(data, f, indent=2, sort_keys=False)
    f.write('\n')
  os.replace(tmp, path)


def plot_panels(path: str, panels: Sequence[Mapping[str, Any]],
                xlabel: str, title: str) -> None:
  """Log-log line plots, one panel per entry, one legend beside them.

  Each panel is {'title', 'ylabel', 'series': [{'label', 'points':
  [(x, y)], 'style': '-' or '--' or ':', 'color_key': str}]}; series sharing a
  color_key share a colour. The legend lists every label drawn in any panel,
  once, to the right of the panels; the title is wrapped to the figure's
  width. Axes read in plain numbers (`_plain_log_ticks`), not powers.
  """
  plt = reporting.pyplot()
  width = 6 * len(panels)
  fig, axes = plt.subplots(1, len(panels), figsize=(width, 4.5),
                           squeeze=False)
  keys = []
  for panel in panels:
    for s in panel['series']:
      if s['color_key'] not in keys:
        keys.append(s['color_key'])
  # Past ten keys, twenty colours and a second marker shape, so that no two
  # keys look alike.
  many = len(keys) > 10
  colours = {k: plt.get_cmap('tab20' if many else 'tab10')(i % 20)
             for i, k in enumerate(keys)}
  markers = {k: 's' if many and i % 2 else 'o' for i, k in enumerate(keys)}
  handles = {}
  for ax, panel in zip(axes[0], panels):
    drawn = []
    for s in panel['series']:
      pts = sorted(p for p in s['points'] if p[1] is not None)
      if not pts:
        continue
      drawn += pts
      xs, ys = zip(*pts)
      [line] = ax.plot(xs, ys, s.get('style', '-'),
                       marker=markers[s['color_key']], markersize=4,
                       color=colours[s['color_key']], label=s['label'])
      handles.setdefault(s['label'], line)
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    if drawn:
      _plain_log_ticks(ax, [p[0] for p in drawn], [p[1] for p in drawn])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(panel['ylabel'])
    ax.set_title(panel['title'])
    ax.grid(True, which='both', alpha=0.3)
  # About 13 characters per inch at 10 points.
  fig.suptitle(textwrap.fill(title, width=int(13 * width)), fontsize=10)
  fig.tight_layout()
  if handles:
    fig.legend(list(handles.values()), list(handles), loc='upper left',
               bbox_to_anchor=(1.0, 0.93), fontsize=8,
               ncol=1 + (len(handles) - 1) // 24)
  fig.savefig(path, dpi=120, bbox_inches='tight')
  plt.close(fig)


def _plain(value: float, _=None) -> str:
  """A tick label: 1,024 or 0.05, never 2^10 or 5×10^-2."""
  return f'{value:,.0f}' if value >= 1 else f'{value:.3g}'


def _plain_log_ticks(ax: Any, xs: Sequence[float], ys: Sequence[float]
                     ) -> None:
  """Plain-number ticks for a log-log panel: x at the values drawn (up to
  ten of them; else at powers of 2), y at 1-2-5 steps, at every digit
  within two decades, or at even linear steps within one, so that a
  narrow range still has several labelled ticks."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  values = sorted(set(xs))
  if len(values) <= 10:
    ax.set_xticks(values)
  else:
    ax.xaxis.set_major_locator(ticker.LogLocator(base=2))
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(_plain))
  ax.xaxis.set_minor_locator(ticker.NullLocator())
  positive = [y for y in ys if y > 0]
  decades = (math.log10(max(positive) / min(positive)) if positive else 0.0)
  if decades <= 1:
    locator = ticker.MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10])
  elif decades <= 2:
    locator = ticker.LogLocator(base=10, subs=tuple(range(1, 10)))
  elif decades <= 4:
    locator = ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0))
  else:
    locator = ticker.LogLocator(base=10)
  ax.yaxis.set_major_locator(locator)
  ax.yaxis.set_major_formatter(ticker.FuncFormatter(_plain))
  ax.yaxis.set_minor_formatter(ticker.NullFormatter())
