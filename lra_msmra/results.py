r"""Collects `results.json` files into one table beside the published numbers.

  python -m lra_msmra.results --runs /tmp/runs/* --out /tmp/summary \
      [--benchmark /tmp/bench_train/train_step.json]

`--runs` takes workdirs, `results.json` files, or folders searched
recursively for `results.json` (what `launch/suite.py` writes). Runs are
grouped by protocol, mechanism (attention name, plus the knobs that tell
apart several configs of one attention, e.g. Combiner fixed vs axial) and
task; seeds are averaged (mean ± standard deviation over n runs of each
run's headline test accuracy: the final checkpoint under the LRA protocol,
the best-validation one otherwise, as `results.json` records).

For each protocol the table lists our rows, then the published rows of the
same protocol (`lra_msmra.published`): the official LRA leaderboard for
`lra`, Xiong et al.'s table for `xiong`, the CST paper's re-tuned table for
`cst`, plus every paper's own rows for the mechanisms we ran. Every row
names its protocol and source. Numbers of different protocols are not
comparable (docs/protocol.md §9.2).

The bubble chart (`results_bubble.png`) plots, as the CST and AdaMRA papers
do, the LRA average (y) against speed relative to softmax (x), circle area
proportional to peak memory. Speed and memory come from `--benchmark` (a
`train_step.json` of `lra_msmra.benchmark.train_step`, at
`--bubble_length`, default its longest length that softmax completed); the
benchmark's records are matched to runs by attention name. Without it,
speed is the geometric mean over tasks of each run's `train_steps_per_sec`
relative to softmax's under the same protocol, and all circles have one
size (memory unknown). Averages over fewer than five tasks are marked.

Outputs in `--out`: `results.md` (also printed), `results_table.json` (the
aggregated rows; not named results.json, so that an output folder inside
the runs' folder is never read back as a run) and `results_bubble.png`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Any, Iterable, Mapping, Optional, Sequence

from lra_msmra import published

TASKS = published.TASKS
AVERAGE_TASKS = published.AVERAGE_TASKS
RESULTS_FILE = 'results.json'
TABLE_FILE = 'results_table.json'


def find_results(paths: Iterable[str]) -> list[str]:
  """`results.json` files under the given files/folders, sorted, unique."""
  found = set()
  for path in paths:
    if os.path.isfile(path):
      found.add(os.path.abspath(path))
    elif os.path.isdir(path):
      for root, _, files in os.walk(path):
        if RESULTS_FILE in files:
          found.add(os.path.abspath(os.path.join(root, RESULTS_FILE)))
    else:
      raise FileNotFoundError(f'--runs: {path} does not exist.')
  return sorted(found)


def load_run(path: str) -> dict[str, Any]:
  with open(path) as f:
    run = json.load(f)
  missing = [k for k in ('task', 'attention', 'protocol', 'test_accuracy')
             if k not in run]
  if missing:
    raise ValueError(f'{path} lacks {missing}; is it a results.json written '
                     'by lra_msmra.train?')
  run['path'] = path
  run['attention_kw'] = (run.get('config', {}).get('model', {})
                         .get('attention_kw', {}))
  return run


def _knob_key(kw: Mapping[str, Any]) -> str:
  return json.dumps(kw, sort_keys=True)


def label_runs(runs: Sequence[dict[str, Any]]) -> None:
  """Sets run['mechanism']: the attention, plus knobs where needed.

  If one attention was run with several knob sets, each label adds the
  knobs whose values differ between those sets, e.g. `combiner[variant=
  axial]`.
  """
  by_attention: dict[str, dict[str, Mapping[str, Any]]] = {}
  for run in runs:
    by_attention.setdefault(run['attention'], {})[
        _knob_key(run['attention_kw'])] = run['attention_kw']
  for run in runs:
    variants = by_attention[run['attention']]
    if len(variants) == 1:
      run['mechanism'] = run['attention']
      continue
    keys = sorted({k for kw in variants.values() for k in kw})
    differing = [k for k in keys
                 if len({json.dumps(kw.get(k)) for kw in variants.values()})
                 > 1]
    knobs = ','.join(f'{k}={run["attention_kw"].get(k)}' for k in differing)
    run['mechanism'] = f'{run["attention"]}[{knobs}]'


def aggregate(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per (protocol, mechanism) with per-task mean/std over seeds."""
  groups: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
  for run in runs:
    groups.setdefault((run['protocol'], run['mechanism']), {}).setdefault(
        run['task'], []).append(run)
  rows = []
  for (protocol, mechanism), tasks in sorted(groups.items()):
    row = {'protocol': protocol, 'mechanism': mechanism,
           'attention': next(iter(tasks.values()))[0]['attention'],
           'tasks': {}}
    for task, task_runs in tasks.items():
      acc = [100.0 * r['test_accuracy'] for r in task_runs]
      speed = [r['train_steps_per_sec'] for r in task_runs
               if r.get('train_steps_per_sec')]
      row['tasks'][task] = {
          'mean': statistics.fmean(acc),
          'std': statistics.stdev(acc) if len(acc) > 1 else 0.0,
          'n': len(acc),
          'seeds': [r.get('config', {}).get('seed') for r in task_runs],
          'reported': sorted({r.get('reported', '?') for r in task_runs}),
          'steps_per_sec': statistics.fmean(speed) if speed else None,
          'num_params': task_runs[0].get('num_params'),
          'paths': [r['path'] for r in task_runs]}
    done = [t for t in AVERAGE_TASKS if t in row['tasks']]
    row['average'] = (statistics.fmean(row['tasks'][t]['mean'] for t in done)
                      if done else None)
    row['average_tasks'] = len(done)
    rows.append(row)
  return rows


def _fmt_score(cell: Optional[Mapping[str, Any]]) -> str:
  if cell is None:
    return '—'
  if cell['n'] > 1:
    return f'{cell["mean"]:.2f} ± {cell["std"]:.2f} (n={cell["n"]})'
  return f'{cell["mean"]:.2f}'


def _fmt_avg(value: Optional[float], count: int) -> str:
  if value is None:
    return '—'
  if count < len(AVERAGE_TASKS):
    return f'{value:.2f} ({count}/{len(AVERAGE_TASKS)} tasks)'
  return f'{value:.2f}'


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  header = (['Model', 'Protocol', 'Source']
            + [published.TASK_TITLES[t] for t in TASKS] + ['Avg'])
  lines = ['# LRA results', '',
           'Test accuracy in %. "ours" rows: mean ± standard deviation over '
           'seeds (n runs); Avg = mean of the five tasks without Path-X. '
           'Rows of different protocols are not comparable '
           '(docs/protocol.md §9.2): each row names its protocol.', '']
  protocols = sorted({r['protocol'] for r in rows},
                     key=lambda p: list(published.PROTOCOL_TITLES).index(p)
                     if p in published.PROTOCOL_TITLES else 99)
  for protocol in protocols:
    ours = [r for r in rows if r['protocol'] == protocol]
    title = published.PROTOCOL_TITLES.get(protocol, protocol)
    table = []
    for r in ours:
      table.append([f'**{r["mechanism"]}** (ours)', title, 'this repo']
                   + [_fmt_score(r['tasks'].get(t)) for t in TASKS]
                   + [_fmt_avg(r['average'], r['average_tasks'])])
    refs = published.reference_rows(protocol,
                                    {r['attention'] for r in ours})
    notes = []
    for ref in refs:
      mark = ''
      if ref.note:
        notes.append(ref.note)
        mark = f' [{len(notes)}]'
      table.append([ref.model + mark, title, ref.source]
                   + [f'{ref.scores[t]:.2f}' if t in ref.scores else (
                       ref.pathx if t == 'pathx' and ref.pathx else '—')
                      for t in TASKS]
                   + ['—' if ref.avg is None else f'{ref.avg:.2f}'])
    lines += [f'## Protocol: {title} (`{protocol}`)', '',
              _table(header, table), '']
    if notes:
      lines += [f'[{i}] {n}' for i, n in enumerate(notes, 1)] + ['']
  runs = [(r['mechanism'], r['protocol'], t, c)
          for r in rows for t, c in r['tasks'].items()]
  lines += ['## Runs', '', _table(
      ['mechanism', 'protocol', 'task', 'checkpoint', 'seeds', 'steps/s',
       'parameters'],
      [[f'`{m}`', p, t, '/'.join(c['reported']),
        ','.join(str(s) for s in c['seeds']),
        '—' if c['steps_per_sec'] is None else f'{c["steps_per_sec"]:.2f}',
        '—' if c['num_params'] is None else f'{c["num_params"]:,}']
       for m, p, t, c in runs]), '']
  return '\n'.join(lines)


def _table(header, rows) -> str:
  out = ['| ' + ' | '.join(header) + ' |',
         '|' + '|'.join('---' for _ in header) + '|']
  out += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
  return '\n'.join(out)


# ------------------------------------------------------------------ bubbles


def _benchmark_points(bench: Mapping[str, Any], length: Optional[int]
                      ) -> tuple[dict[str, tuple[float, float]], str]:
  """attention -> (relative speed, net peak bytes) from train_step.json."""
  ok = [r for r in bench['records'] if r.get('status') == 'ok']
  base = [r for r in ok if r.get('attention') == 'softmax']
  if not base:
    raise ValueError('The benchmark has no completed softmax point to '
                     'compare speeds with.')
  if length is None:
    length = max(r['length'] for r in base)
  base_rec = [r for r in base if r['length'] == length]
  if not base_rec:
    raise ValueError(f'The benchmark has no softmax point at length '
                     f'{length}; choose --bubble_length from '
                     f'{sorted({r["length"] for r in base})}.')
  points = {}
  for r in ok:
    if r['length'] == length and r['attention'] not in points:
      points[r['attention']] = (r['steps_per_s'] / base_rec[0]['steps_per_s'],
                                r['net_peak_bytes'])
  return points, (f'speed and memory: training step at N={length} '
                  f'({bench["settings"]["task"]}, batch '
                  f'{bench["settings"]["batch"]})')


def _run_speeds(rows: Sequence[Mapping[str, Any]]
                ) -> dict[tuple[str, str], float]:
  """(protocol, mechanism) -> geometric mean over tasks of speed ratios."""
  out = {}
  for r in rows:
    base = next((b for b in rows if b['protocol'] == r['protocol']
                 and b['attention'] == 'softmax'), None)
    if base is None:
      continue
    ratios = [c['steps_per_sec'] / base['tasks'][t]['steps_per_sec']
              for t, c in r['tasks'].items()
              if c['steps_per_sec'] and t in base['tasks']
              and base['tasks'][t]['steps_per_sec']]
    if ratios:
      out[(r['protocol'], r['mechanism'])] = math.exp(
          statistics.fmean(math.log(x) for x in ratios))
  return out


def bubble_chart(rows: Sequence[Mapping[str, Any]], path: str,
                 bench: Optional[Mapping[str, Any]] = None,
                 bubble_length: Optional[int] = None) -> list[dict[str, Any]]:
  """Draws the accuracy-vs-speed chart; returns the plotted points."""
  from lra_msmra.benchmark import common  # pylint: disable=g-import-not-at-top
  if bench is not None:
    bench_points, caption = _benchmark_points(bench, bubble_length)
  else:
    bench_points = None
    caption = ('speed: runs\' steps/s relative to softmax (geometric mean '
               'over tasks); memory not measured: equal circles')
    speeds = _run_speeds(rows)
  points = []
  for r in rows:
    if r['average'] is None:
      continue
    if bench_points is not None:
      if r['attention'] not in bench_points:
        continue
      speed, memory = bench_points[r['attention']]
    else:
      speed = speeds.get((r['protocol'], r['mechanism']))
      memory = None
      if speed is None:
        continue
    points.append({'label': r['mechanism'], 'protocol': r['protocol'],
                   'average': r['average'],
                   'average_tasks': r['average_tasks'],
                   'relative_speed': speed, 'memory_bytes': memory})
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(7, 5))
  memories = [p['memory_bytes'] for p in points if p['memory_bytes']]
  biggest = max(memories) if memories else None
  for i, p in enumerate(points):
    size = 400.0 if not biggest or not p['memory_bytes'] else (
        2000.0 * p['memory_bytes'] / biggest)
    colour = plt.get_cmap('tab10')(i % 10)
    ax.scatter([p['relative_speed']], [p['average']], s=size, alpha=0.5,
               color=colour, edgecolors='black')
    mark = '' if p['average_tasks'] == len(AVERAGE_TASKS) else (
        f' ({p["average_tasks"]}/5 tasks)')
    text = f'{p["label"]} [{p["protocol"]}]{mark}'
    if p['memory_bytes']:
      text += f'\n{common.fmt_bytes(p["memory_bytes"])}'
    ax.annotate(text, (p['relative_speed'], p['average']), fontsize=7,
                ha='center', va='center')
  ax.set_xlabel('speed relative to softmax (×)')
  ax.set_ylabel('LRA average accuracy (%)')
  ax.set_title('LRA average vs speed; circle area = peak memory\n' + caption,
               fontsize=8)
  ax.grid(True, alpha=0.3)
  if points:
    xs = [p['relative_speed'] for p in points]
    ys = [p['average'] for p in points]
    ax.set_xlim(0, max(xs) * 1.25)
    ax.set_ylim(min(ys) - 3, max(ys) + 3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return points


def main(argv: Sequence[str]) -> None:
  parser = argparse.ArgumentParser(
      prog='python -m lra_msmra.results',
      description='LRA results of our runs beside the published numbers.')
  parser.add_argument('--runs', nargs='+', required=True,
                      help='workdirs, results.json files or folders to '
                           'search')
  parser.add_argument('--out', default='.',
                      help='folder for results.md/.json and the chart')
  parser.add_argument('--benchmark', default=None,
                      help='train_step.json for the chart\'s speed and '
                           'memory')
  parser.add_argument('--bubble_length', type=int, default=None)
  args = parser.parse_args(argv[1:])
  paths = find_results(args.runs)
  if not paths:
    raise SystemExit(f'No {RESULTS_FILE} found under {args.runs}.')
  runs = [load_run(p) for p in paths]
  label_runs(runs)
  rows = aggregate(runs)
  os.makedirs(args.out, exist_ok=True)
  text = markdown(rows)
  bench = None
  if args.benchmark:
    with open(args.benchmark) as f:
      bench = json.load(f)
  points = bubble_chart(rows, os.path.join(args.out, 'results_bubble.png'),
                        bench, args.bubble_length)
  with open(os.path.join(args.out, 'results.md'), 'w') as f:
    f.write(text + '\n')
  with open(os.path.join(args.out, TABLE_FILE), 'w') as f:
    json.dump({'runs': paths, 'rows': rows, 'bubbles': points}, f, indent=2)
    f.write('\n')
  print(text)
  print(f'\nWrote results.md, {TABLE_FILE} and results_bubble.png to '
        f'{args.out} ({len(paths)} runs).')


if __name__ == '__main__':
  main(sys.argv)
