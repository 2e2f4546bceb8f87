r"""Collects `results.json` files into one table beside the published numbers.

  python -m lra_msmra_tools.results --runs /tmp/runs/* --out /tmp/summary \
      [--benchmark /tmp/bench_train/train_step.json]

`--runs` takes workdirs, `results.json` files, or folders searched
recursively for `results.json` (what `launch/suite.py` writes). Runs are
grouped by protocol, mechanism (attention name, plus the knobs that tell
apart several configs of one attention, e.g. Combiner fixed vs axial) and
task; seeds are averaged (mean ± standard deviation over n runs of each
run's headline test accuracy: the final checkpoint under the LRA protocol,
the best-validation one otherwise, as `results.json` records).

For each protocol the table lists our rows, then the published rows of the
same protocol (`lra_msmra_tools.published`): the official LRA leaderboard for
`lra`, Xiong et al.'s table for `xiong`, the CST paper's re-tuned table for
`cst`, plus every paper's own rows for the mechanisms we ran. Every row
names its protocol and source. Numbers of different protocols are not
comparable (docs/protocol.md §9.2).

The bubble chart (`results_bubble.png`) plots, as the CST and AdaMRA papers
do, the LRA average (y) against speed relative to softmax (x), circle area
proportional to peak memory. Speed and memory come from `--benchmark` (a
`train_step.json` of `lra_msmra_tools.benchmark.train_step`, at
`--bubble_length`, default its longest length that softmax completed); the
benchmark's records are matched to runs by attention name. Without it,
speed is the geometric mean over tasks of each run's `train_steps_per_sec`
relative to softmax's under the same protocol, from runs known (by their
`device_history`) to be trained on one kind of device, the same as
softmax's, and all circles have one size (memory unknown). Averages over
fewer than five tasks are marked.

Learning-rate searches (`launch/suite.py --lr_bracket`, the CST paper's
protocol): runs of one config file and seed that differ only in the
learning rate get one more row, `<config> (learning rate by validation)`,
made of the run of each seed with the best validation accuracy
(`select_by_validation`); every rate keeps its own row as well.

Outputs in `--out`: `results.md` (also printed), `results_table.json` (the
aggregated rows; not named results.json, so that an output folder inside
the runs' folder is never read back as a run) and `results_bubble.png`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import statistics
import sys
from typing import Any, Iterable, Mapping, Optional, Sequence

from lra_msmra import config_lib
from lra_msmra import data
from lra_msmra import fingerprint as fingerprint_lib
from lra_msmra_tools import published
from lra_msmra_tools import reporting

TASKS = published.TASKS
AVERAGE_TASKS = published.AVERAGE_TASKS
RESULTS_FILE = 'results.json'
TABLE_FILE = 'results_table.json'
# The repository's config files, which define each protocol's official setting.
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'configs')


def load_run(path: str) -> dict[str, Any]:
  with open(path) as f:
    run = json.load(f)
  missing = [k for k in ('task', 'attention', 'protocol', 'test_accuracy')
             if k not in run]
  if missing:
    raise ValueError(f'{path} lacks {missing}; is it a results.json written '
                     'by lra_msmra.train?')
  run['path'] = path
  config = run.get('config', {})
  run['attention_kw'] = config.get('model', {}).get('attention_kw', {})
  if 'data_source' not in run:
    run['data_source'] = fingerprint_lib.data_source_record(
        _legacy_notes(run))
  if 'generator' in run['data_source']:
    # Runs before the data notes completed them record only the generator
    # settings their data's call gave: same data, same record.
    run['data_source']['generator'] = data.generator_settings(
        run['task'], run['data_source']['generator'])
  run['setting'] = fingerprint_lib.setting(config, run['data_source'],
                                           run.get('pretraining'))
  run['fingerprint'] = fingerprint_lib.fingerprint(run['setting'])
  return run


def _legacy_notes(run: Mapping[str, Any]) -> dict[str, Any]:
  """Data notes of a results.json written before sources were recorded:
  'generated' meant our ListOps generator or mock data elsewhere."""
  notes = dict(run.get('data_notes', {}))
  if 'data_source' not in notes and 'generated' in notes:
    notes['data_source'] = ('release' if not notes['generated'] else
                            'generated' if run['task'] == 'listops' else
                            'mock')
  return notes


# ------------------------------------------------- official configs, labels


@functools.lru_cache(maxsize=None)
def official_settings(task: str, protocol: str, configs_root: str = CONFIGS
                      ) -> tuple[tuple[str, Mapping[str, Any], bool], ...]:
  """(label, config setting, official) of every config file of `task` under
  the protocol's option and no override, e.g. ('cst', ..., True),
  ('long_short:best', ..., True), and of its `runlocal` form, e.g.
  ('cst:runlocal', ..., False): a runlocal job is a config file of the
  repository but never a result (docs/runlocal.md). Settings leave the data
  source out (it is reported on its own)."""
  folder = os.path.join(configs_root, task)
  if not os.path.isdir(folder):
    return ()
  option = '' if protocol == 'lra' else protocol
  base = os.path.join(folder, 'base.py')
  task_options = (getattr(config_lib.load_sibling(base, 'base'), 'OPTIONS', ())
                  if os.path.exists(base) else ())
  out = []
  for name in sorted(os.listdir(folder)):
    if not name.endswith('.py') or name == 'base.py':
      continue
    stem = name[:-3]
    module = config_lib.load_sibling(os.path.join(folder, name), stem)
    allowed = (*getattr(module, 'OPTIONS', ()), *task_options)
    for extra in ('', 'best', 'runlocal'):
      if extra and extra not in allowed:
        continue
      arg = ','.join(o for o in (option, extra) if o)
      try:
        config = module.get_config(arg or None)
      except ValueError:  # e.g. `best` without a paper setting for the task
        continue
      config_setting = fingerprint_lib.setting(json.loads(config.to_json()),
                                               {})
      out.append((stem + (f':{extra}' if extra else ''), config_setting,
                  extra != 'runlocal'))
  return tuple(out)


def _config_part(values: Mapping[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in values.items()
          if not k.startswith('data_source.')}


def label_runs(runs: Sequence[dict[str, Any]],
               configs_root: str = CONFIGS) -> None:
  """Sets each run's `mechanism` (row label), `official`, `runlocal` and
  `changes`.

  A run whose setting (seed, paths and logging aside) equals a config file's
  under its protocol has that file's name as label and `official=True`. A
  run that equals a config file's `runlocal` form is labelled so, e.g.
  `cst:runlocal`, with `official=False`. Otherwise the label is the closest
  config file of the same attention plus what differs from it, e.g. `cst
  (data.max_length=4000)`; without any config file to compare with, the
  attention name and its knobs.
  """
  for run in runs:
    ours = {k: v for k, v in _config_part(run['setting']).items()
            if not k.startswith('pretraining.')}
    candidates = [
        (label, ref, official) for label, ref, official in
        official_settings(run['task'], run['protocol'], configs_root)
        if ref.get('model.attention') == run['attention']]
    run['official'] = run['runlocal'] = False
    run['changes'] = []
    match = next(((label, official) for label, ref, official in candidates
                  if ref == ours), None)
    if match is not None:
      run['mechanism'], run['official'] = match
      run['config_label'] = match[0]
      if not run['official']:
        run['runlocal'] = True
        run['changes'] = ['the runlocal option']
      continue
    if candidates:
      label, ref, _ = min(candidates, key=lambda c: len(
          fingerprint_lib.differences(ours, c[1])))
      run['changes'] = fingerprint_lib.differences(ours, ref)
      run['mechanism'] = f'{label} ({", ".join(run["changes"])})'
      run['config_label'] = label
      continue
    knobs = ','.join(f'{k}={v}' for k, v in sorted(run['attention_kw'].items()))
    run['mechanism'] = run['attention'] + (f'[{knobs}]' if knobs else '')
    run['changes'] = ['no config file of this attention to compare with']
  for run in runs:
    if run.get('pretraining'):
      run['mechanism'] += f' + {spt_label(run["pretraining"])}'
      run['official'] = False


def spt_label(record: Mapping[str, Any]) -> str:
  """'SPT masked 15%, 750 steps' for a run fine-tuned from a pretrained
  encoder (results.json's `pretraining`)."""
  objective = record.get('objective', '?')
  rate = (record.get('masking') or {}).get('rate')
  span = (record.get('masking') or {}).get('span', 1)
  what = objective + (f' {100 * rate:g}%' if rate is not None else '') + (
      f' spans of {span}' if span and span > 1 else '')
  return f'SPT {what}, {record.get("steps", "?")} steps'


def pretraining_dir(run_dir: str) -> bool:
  """Whether the workdir `run_dir` holds a self-pretraining run (its
  config.json's `objective`)."""
  try:
    with open(os.path.join(run_dir, 'config.json')) as f:
      objective = json.load(f).get('objective', 'classify')
  except (OSError, ValueError):
    return False
  return objective != 'classify'


def is_pretraining(run: Mapping[str, Any]) -> bool:
  """A self-pretraining run (its accuracy is per token, not a task
  score): no table row; its fine-tuned runs name it."""
  return run.get('objective', 'classify') != 'classify'


# Schedule keys that hold the learning rate (those `launch/suite.py
# --lr_bracket` scales).
LEARNING_RATE_KEYS = ('learning_rate', 'max_learning_rate',
                      'base_learning_rate')
SEARCH_LABEL = 'learning rate by validation'


def _rate_change(run: Mapping[str, Any]) -> Optional[str]:
  """'' for a run of an official config as it is; its learning rate
  (`schedule.<key>=value`) when that is the run's only change from an
  official config; None otherwise."""
  if run.get('official'):
    return ''
  changes = run.get('changes') or []
  keys = {f'schedule.{k}' for k in LEARNING_RATE_KEYS}
  if len(changes) == 1 and changes[0].split('=', 1)[0] in keys:
    return changes[0]
  return None


def select_by_validation(runs: Sequence[Mapping[str, Any]]
                         ) -> list[dict[str, Any]]:
  """The learning-rate search of the CST paper's protocol, one run per seed.

  Runs of one official config file and seed (same protocol, task and data)
  that differ only in the schedule's learning rate (the workdirs
  `launch/suite.py --lr_bracket` writes) form a search. From each search of
  two rates or more, the run with the best validation accuracy (of its
  best-validation checkpoint) is returned as a copy labelled `<config>
  (learning rate by validation)`, official when its config file is, with
  `searched` (the rates, the chosen one first) and one fingerprint for the
  whole search, so that seeds that chose different rates are averaged in
  one row. Ties go to the config's own rate, then to the smaller rate. The
  runs themselves keep their rows.
  """
  groups: dict[tuple[Any, ...], list[tuple[str, Mapping[str, Any]]]] = {}
  for run in runs:
    rate = _rate_change(run)
    if rate is None or 'config_label' not in run:
      continue
    key = (run['protocol'], run['task'], run['config_label'],
           data_label(run['data_source']), run.get('config', {}).get('seed'))
    groups.setdefault(key, []).append((rate, run))
  selected = []
  for (_, _, label, _, _), members in sorted(groups.items(),
                                             key=lambda kv: str(kv[0])):
    if len({rate for rate, _ in members}) < 2:
      continue

    def order(member):
      rate, run = member
      value = rate.split('=', 1)[1] if rate else ''
      val = (run.get('best') or {}).get('val_accuracy')
      return (-(val if val is not None else -1.0), rate != '',
              float(value) if value else 0.0)

    rate, best = min(members, key=order)
    copy = dict(best)
    copy['mechanism'] = f'{label} ({SEARCH_LABEL})'
    copy['official'] = any(r.get('official') for _, r in members)
    copy['changes'] = []
    copy['searched'] = [rate or 'the config\'s own'] + sorted(
        r or 'the config\'s own' for r, _ in members if r != rate)
    copy['fingerprint'] = 'search-' + hashlib.sha256(','.join(sorted(
        {r['fingerprint'] for _, r in members})).encode()).hexdigest()[:8]
    selected.append(copy)
  return selected


LAST_PROCESS = ' (last process)'


def device_kinds(run: Mapping[str, Any]) -> list[str]:
  """The device kinds that trained a run, in order, from its results.json:
  one per entry of `device_history`. A run written before that history was
  kept records only the devices of the process that finished it, which may
  not be the ones that trained its earlier steps: its kind is marked `(last
  process)`. [] if nothing was recorded."""
  prov = run.get('provenance') or {}
  history = prov.get('device_history')
  last_only = not history and bool(prov.get('devices'))
  if last_only:
    history = [prov['devices']]
  kinds: list[str] = []
  for h in history or []:
    kind = h.get('device_kind') or h.get('platform') or '?'
    if h.get('num_devices', 1) > 1:
      kind = f'{h["num_devices"]}× {kind}'
    if not kinds or kinds[-1] != kind:
      kinds.append(kind)
  return [k + LAST_PROCESS for k in kinds] if last_only else kinds


def data_label(record: Mapping[str, Any]) -> str:
  """'' for release data; otherwise what the data was."""
  kind = record.get('kind')
  if kind == 'release':
    return ''
  if kind == 'generated':
    # The seed the data was generated with, not the runs' seeds.
    seed = record.get('generator', {}).get('seed', '?')
    return f'generated data, generator seed {seed}'
  return f'{kind} data'


def aggregate(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per (protocol, label, data source); per task, mean/std over
  seeds of runs with one fingerprint. Runs with different fingerprints are
  never averaged: a task cell that would mix them splits the row."""
  cells: dict[tuple[str, str, str, str], set[str]] = {}
  for run in runs:
    key = (run['protocol'], run['mechanism'], data_label(run['data_source']),
           run['task'])
    cells.setdefault(key, set()).add(run['fingerprint'])
  groups: dict[tuple[str, str, str], dict[str, list[dict[str, Any]]]] = {}
  for run in runs:
    dlabel = data_label(run['data_source'])
    label = run['mechanism']
    if len(cells[(run['protocol'], label, dlabel, run['task'])]) > 1:
      label = f'{label} [{run["fingerprint"]}]'
    groups.setdefault((run['protocol'], label, dlabel), {}).setdefault(
        run['task'], []).append(run)
  rows = []
  for (protocol, mechanism, dlabel), tasks in sorted(groups.items()):
    first = next(iter(tasks.values()))[0]
    row = {'protocol': protocol, 'mechanism': mechanism,
           'attention': first['attention'], 'data': dlabel,
           'data_kind': first['data_source'].get('kind'),
           'official': all(r['official'] for t in tasks.values() for r in t),
           'runlocal': all(r.get('runlocal') for t in tasks.values()
                           for r in t),
           'tasks': {}}
    for task, task_runs in tasks.items():
      acc = [100.0 * r['test_accuracy'] for r in task_runs]
      # Speeds are averaged only over runs known to be trained on one kind
      # of device, the same for all of them (a recorded device history);
      # else the cell has no speed.
      kinds = {tuple(device_kinds(r)) for r in task_runs}
      kind = next(iter(kinds)) if len(kinds) == 1 else ()
      device = (kind[0] if len(kind) == 1 and
                not kind[0].endswith(LAST_PROCESS) else None)
      speed = [r['train_steps_per_sec'] for r in task_runs
               if r.get('train_steps_per_sec')] if device else []
      row['tasks'][task] = {
          'floor': all(on_floor(r) for r in task_runs),
          'mean': statistics.fmean(acc),
          'std': statistics.stdev(acc) if len(acc) > 1 else 0.0,
          'n': len(acc),
          'seeds': [r.get('config', {}).get('seed') for r in task_runs],
          'reported': sorted({r.get('reported', '?') for r in task_runs}),
          'fingerprint': task_runs[0]['fingerprint'],
          'steps_per_sec': statistics.fmean(speed) if speed else None,
          'device': device,
          'num_params': task_runs[0].get('num_params'),
          'paths': [r['path'] for r in task_runs]}
    done = [t for t in AVERAGE_TASKS if t in row['tasks']]
    row['average'] = (statistics.fmean(row['tasks'][t]['mean'] for t in done)
                      if done else None)
    row['average_tasks'] = len(done)
    rows.append(row)
  return rows


# A run whose headline test accuracy is within this many points of its test
# split's majority-class rate never learned more than the label frequencies.
FLOOR_POINTS = 2.0
FLOOR_MARK = 'floor'
FLOOR_NOTE = (f'"{FLOOR_MARK}": every run of the cell ended within '
              f'{FLOOR_POINTS:g} points of its test split\'s majority-class '
              'rate: it learned the label frequencies and nothing of the '
              'inputs.')


def on_floor(run: Mapping[str, Any]) -> bool:
  """Whether a run ended on the majority-class floor (`FLOOR_POINTS`)."""
  rate = run.get('test_majority_rate')
  if rate is None or run.get('test_accuracy') is None:
    return False
  return 100.0 * (run['test_accuracy'] - rate) < FLOOR_POINTS


def _fmt_score(cell: Optional[Mapping[str, Any]]) -> str:
  if cell is None:
    return '—'
  mark = f' {FLOOR_MARK}' if cell.get('floor') else ''
  if cell['n'] > 1:
    return (f'{cell["mean"]:.2f} ± {cell["std"]:.2f} (n={cell["n"]})'
            f'{mark}')
  return f'{cell["mean"]:.2f}{mark}'


def _fmt_avg(value: Optional[float], count: int) -> str:
  if value is None:
    return '—'
  if count < len(AVERAGE_TASKS):
    return f'{value:.2f} ({count}/{len(AVERAGE_TASKS)} tasks)'
  return f'{value:.2f}'


def _score_cells(r: Mapping[str, Any]) -> list[str]:
  return ([_fmt_score(r['tasks'].get(t)) for t in TASKS]
          + [_fmt_avg(r['average'], r['average_tasks'])])


def _ours(r: Mapping[str, Any]) -> str:
  data = f'; {r["data"]}' if r['data'] else ''
  return f'**{r["mechanism"]}** (ours{data})'


def _protocol_order(protocol: str) -> int:
  titles = list(published.PROTOCOL_TITLES)
  return titles.index(protocol) if protocol in titles else len(titles)


# Data sources whose examples are the task's own (`data_label`).
REAL_DATA_KINDS = ('release', 'generated')


def markdown(rows: Sequence[Mapping[str, Any]],
             runs: Sequence[Mapping[str, Any]] = ()) -> str:
  """The tables: per protocol, official-config rows beside the published
  ones, then rows with changed settings (not comparable with those), then
  `runlocal` jobs and mock-data rows (quick and plumbing checks, under no
  published heading); then every run."""
  header = (['Model', 'Protocol', 'Source']
            + [published.TASK_TITLES[t] for t in TASKS] + ['Avg'])
  lines = ['# LRA results', '',
           'Test accuracy in %. "ours" rows: mean ± standard deviation over '
           'seeds (n runs) of runs with the same setting; Avg = mean of the '
           'five tasks without Path-X. Rows of different protocols are not '
           'comparable (docs/protocol.md §9.2): each row names its protocol. '
           'Only '
           'runs of an unmodified config file of the repository, on '
           'released or generated data, are listed beside the published '
           'numbers; generated data is named in the row.', '']
  if any(cell.get('floor') for r in rows for cell in r['tasks'].values()):
    lines += [FLOOR_NOTE, '']
  # Rows on real examples (released or generated), split into full runs and
  # runlocal jobs; the rest is mock data.
  on_real = [r for r in rows if r['data_kind'] in REAL_DATA_KINDS]
  real = [r for r in on_real if not r.get('runlocal')]
  for protocol in sorted({r['protocol'] for r in real}, key=_protocol_order):
    title = published.PROTOCOL_TITLES.get(protocol, protocol)
    official = [r for r in real if r['protocol'] == protocol and
                r['official']]
    changed = [r for r in real if r['protocol'] == protocol and
               not r['official']]
    if official:
      table = [[_ours(r), title, 'this repo, official config']
               + _score_cells(r) for r in official]
      refs = published.reference_rows(protocol,
                                      {r['attention'] for r in official})
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
                reporting.markdown_table(header, table), '']
      if notes:
        lines += [f'[{i}] {n}' for i, n in enumerate(notes, 1)] + ['']
      others = [r for r in published.ALL_ROWS
                if r.protocol != protocol and r.mechanism in
                {o['attention'] for o in official} - {'softmax'}]
      if others:
        lines += ['The same mechanisms as published under other protocols '
                  '(other model sizes and training: not comparable with '
                  'the table above):', '', reporting.markdown_table(header, [
                      [ref.model, published.PROTOCOL_TITLES.get(
                          ref.protocol, ref.protocol), ref.source]
                      + [f'{ref.scores[t]:.2f}' if t in ref.scores else '—'
                         for t in TASKS]
                      + ['—' if ref.avg is None else f'{ref.avg:.2f}']
                      for ref in others]), '']
    if changed:
      lines += [f'## {title} (`{protocol}`), changed settings', '',
                'Not comparable with the published rows: each label names '
                'the config file these runs differ from and what differs.',
                '', reporting.markdown_table(header, [
                    [_ours(r), title, 'this repo, changed'] + _score_cells(r)
                    for r in changed]), '']
  quick = [r for r in on_real if r.get('runlocal')]
  if quick:
    lines += ['## `runlocal` jobs: quick checks, not results', '',
              'Small models trained for minutes on small generated data (the '
              '`runlocal` option of a config file, docs/runlocal.md); never '
              'comparable with any published number.', '',
              reporting.markdown_table(header, [
                  [_ours(r), published.PROTOCOL_TITLES.get(
                      r['protocol'], r['protocol']), 'this repo, runlocal']
                  + _score_cells(r) for r in quick]), '']
  mock = [r for r in rows if r['data_kind'] not in REAL_DATA_KINDS]
  if mock:
    lines += ['## Mock or unknown data: plumbing checks, not results', '',
              'Examples that only have the task\'s file format; never '
              'comparable with any published number.', '',
              reporting.markdown_table(header, [
                  [_ours(r), r['protocol'], 'this repo'] + _score_cells(r)
                  for r in mock]), '']
  lines += ['## Runs', '', reporting.markdown_table(
      ['run', 'protocol', 'task', 'seed', 'best-val test', 'final test',
       'headline', 'steps/s', 'training time', 'device', 'data',
       'fingerprint', 'parameters'],
      [[f'`{r["mechanism"]}`', r['protocol'], r['task'],
        r.get('config', {}).get('seed', '—'),
        _pct(r.get('best', {}).get('test_accuracy')),
        _pct(r.get('final', {}).get('test_accuracy')), r.get('reported', '?'),
        _num(r.get('train_steps_per_sec'), '.2f'),
        _train_time(r),
        ' → '.join(device_kinds(r)) or '—',
        data_label(r['data_source']) or 'release', r['fingerprint'],
        _num(r.get('num_params'), ',')]
       for r in sorted(runs, key=lambda r: (r['protocol'], r['task'],
                                            r['mechanism']))]), '']
  return '\n'.join(lines)


def _pct(value: Optional[float]) -> str:
  return '—' if value is None else f'{100 * value:.2f}'


def _num(value: Optional[float], spec: str) -> str:
  return '—' if value is None else format(value, spec)


def _train_time(run: Mapping[str, Any]) -> str:
  """Training time (evaluations included) of a run; runs written before it
  was recorded give steps / (steps/s), the same loop time, marked ≈."""
  if run.get('train_seconds') is not None:
    return _duration(run['train_seconds'])
  steps, speed = run.get('final', {}).get('step'), run.get(
      'train_steps_per_sec')
  if steps and speed:
    return '≈' + _duration(steps / speed)
  return '—'


def _duration(seconds: Optional[float]) -> str:
  if seconds is None:
    return '—'
  hours, rest = divmod(int(round(seconds)), 3600)
  return f'{hours}:{rest // 60:02d}:{rest % 60:02d}'


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
              and base['tasks'][t]['steps_per_sec']
              and c.get('device') == base['tasks'][t].get('device')]
    if ratios:
      out[(r['protocol'], r['mechanism'])] = math.exp(
          statistics.fmean(math.log(x) for x in ratios))
  return out


def bubble_chart(rows: Sequence[Mapping[str, Any]], path: str,
                 bench: Optional[Mapping[str, Any]] = None,
                 bubble_length: Optional[int] = None) -> list[dict[str, Any]]:
  """Draws the accuracy-vs-speed chart; returns the plotted points."""
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
  plt = reporting.pyplot()
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
      text += f'\n{reporting.fmt_bytes(p["memory_bytes"])}'
    # Above its bubble (size is an area in points²), not through it.
    ax.annotate(text, (p['relative_speed'], p['average']), fontsize=7,
                xytext=(0, math.sqrt(size / math.pi) + 2),
                textcoords='offset points', ha='center', va='bottom')
  ax.set_xlabel('speed relative to softmax (×)')
  ax.set_ylabel('LRA average accuracy (%)')
  ax.set_title('LRA average vs speed; circle area = peak memory\n' + caption,
               fontsize=8)
  ax.grid(True, alpha=0.3)
  if points:
    xs = [p['relative_speed'] for p in points]
    ys = [p['average'] for p in points]
    ax.set_xlim(0, max(xs) * 1.25)
    # Room above the highest bubble for its label.
    ax.set_ylim(min(ys) - 3, max(ys) + 3 + 0.15 * (max(ys) - min(ys) + 6))
  else:
    ax.text(0.5, 0.5, 'No point to draw: no run has a speed comparable with '
            'a softmax run\n(the same protocol and tasks, and a device '
            'history of one kind of device, the same),\nand no --benchmark '
            'was given.', transform=ax.transAxes, ha='center', va='center',
            fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return points


# ------------------------------------------------------------------- curves

METRICS_FILE = 'metrics.jsonl'
# In the order of a 2 × 2 block: loss above accuracy, training on the left.
CURVE_PANELS = (('train/loss', 'training loss'), ('val/loss', 'validation loss'),
                ('train/accuracy', 'training accuracy'),
                ('val/accuracy', 'validation accuracy'))


def metrics_path(run_dir: str) -> Optional[str]:
  """The metrics.jsonl of a workdir (or of a collected copy), if any."""
  for rel in (os.path.join('tensorboard', METRICS_FILE), METRICS_FILE):
    path = os.path.join(run_dir, rel)
    if os.path.exists(path):
      return path
  return None


def read_metrics(path: str) -> list[dict[str, Any]]:
  """metrics.jsonl records in step order, each (step, set of names) once:
  where a resumed run wrote a step again, the last record is kept."""
  records: dict[tuple[int, tuple[str, ...]], dict[str, Any]] = {}
  with open(path) as f:
    for line_no, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f'{path}:{line_no}: not JSON ({e}).') from None
      records[(record['step'], tuple(sorted(record)))] = record
  return [records[k] for k in sorted(records)]


def find_run_dirs(paths: Iterable[str]) -> list[str]:
  """Folders under `paths` holding results.json or metrics (finished or
  not), sorted; a workdir's tensorboard/ folder counts as its workdir."""
  found = set()
  for path in paths:
    if os.path.isfile(path):
      path = os.path.dirname(path)
    for root, dirs, files in os.walk(path):
      dirs.sort()
      if RESULTS_FILE in files or METRICS_FILE in files:
        if os.path.basename(root) == 'tensorboard':
          root = os.path.dirname(root)
        found.add(os.path.abspath(root))
  return sorted(found)


def _run_label(run_dir: str, runs_by_dir: Mapping[str, Mapping[str, Any]]
               ) -> tuple[str, str, str, Any]:
  """(label, group, mechanism, seed) of a run folder: its table label,
  protocol/task, what its line's colour stands for and its seed.

  An unfinished run (no results.json) is named by its folder; its
  mechanism is the folder above a `seed<N>` folder (the suite's layout),
  else its attention.
  """
  run = runs_by_dir.get(run_dir)
  if run is not None:
    seed = run.get('config', {}).get('seed', '?')
    return (f'{run["mechanism"]} s{seed}',
            f'{run["protocol"]} / {run["task"]}', run['mechanism'], seed)
  config_path = os.path.join(run_dir, 'config.json')
  name = os.path.relpath(run_dir, os.path.dirname(os.path.dirname(run_dir)))
  config = {}
  if os.path.exists(config_path):
    with open(config_path) as f:
      config = json.load(f)
  parent, folder = os.path.split(run_dir)
  mechanism = (os.path.basename(parent) if folder.startswith('seed') else
               config.get('model', {}).get('attention', name))
  group = (f'{config.get("protocol", "?")} / {config.get("task", "?")}'
           if config else '?')
  return f'{name} (unfinished)', group, mechanism, config.get('seed', '?')


# Line styles of seeds (in the order of their numbers), then these dash
# patterns repeated: no two of the first eight seeds alike.
SEED_STYLES = ('-', '--', ':', '-.', (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)),
               (0, (8, 2)), (0, (3, 1, 3, 5)))


def _seed_key(seed: Any) -> tuple[int, Any]:
  return (0, seed) if isinstance(seed, int) else (1, str(seed))


def curves_chart(run_dirs: Sequence[str],
                 runs_by_dir: Mapping[str, Mapping[str, Any]],
                 path: str) -> list[dict[str, Any]]:
  """Loss and accuracy (training and validation) against step, one line per
  run, a 2 × 2 block of panels per protocol/task (loss above accuracy,
  training left of validation); returns what each line shows. Accuracy is
  in %, as in the tables.

  Every run is told apart: colour by mechanism (`reporting.line_styles`),
  line style by seed (`SEED_STYLES`), unfinished runs fainter; each
  block's legend stands outside its axes, to the right of its top row.
  """
  series = []
  for run_dir in run_dirs:
    mpath = metrics_path(run_dir)
    if mpath is None:
      continue
    label, group, mechanism, seed = _run_label(run_dir, runs_by_dir)
    records = read_metrics(mpath)
    lines = {key: [(r['step'], r[key]) for r in records if key in r]
             for key, _ in CURVE_PANELS}
    last = max((r['step'] for r in records), default=0)
    if run_dir not in runs_by_dir:
      label = label.replace('(unfinished)', f'(unfinished, step {last})')
    series.append({'label': label, 'group': group, 'mechanism': mechanism,
                   'seed': seed, 'lines': lines, 'last_step': last,
                   'finished': run_dir in runs_by_dir})
  groups = sorted({s['group'] for s in series})
  if not groups:
    return series
  plt = reporting.pyplot()
  looks = reporting.line_styles(sorted({s['mechanism'] for s in series}))
  seeds = sorted({s['seed'] for s in series}, key=_seed_key)
  dashes = {seed: SEED_STYLES[i % len(SEED_STYLES)]
            for i, seed in enumerate(seeds)}
  fig, axes = plt.subplots(2 * len(groups), 2,
                           figsize=(2 * 4.2, 2 * 3.0 * len(groups)),
                           squeeze=False)
  for row, group in enumerate(groups):
    members = sorted((x for x in series if x['group'] == group),
                     key=lambda x: (x['mechanism'], _seed_key(x['seed']),
                                    x['label']))
    block = {key: axes[2 * row + i // 2][i % 2]
             for i, (key, _) in enumerate(CURVE_PANELS)}
    for key, title in CURVE_PANELS:
      ax = block[key]
      scale = 100.0 if key.endswith('accuracy') else 1.0
      for s in members:
        points = s['lines'][key]
        if points:
          look = looks[s['mechanism']]
          ax.plot([p[0] for p in points], [scale * p[1] for p in points],
                  label=s['label'], color=look['color'],
                  marker=look['marker'], markersize=3,
                  markevery=max(1, len(points) // 8),
                  linestyle=dashes[s['seed']],
                  linewidth=1.0 if s['finished'] else 0.8,
                  alpha=1.0 if s['finished'] else 0.5)
      ax.set_title(f'{group}: {title}', fontsize=8)
      ax.set_xlabel('step', fontsize=8)
      ax.set_ylabel('accuracy (%)' if scale != 1.0 else 'loss', fontsize=8)
      ax.grid(True, alpha=0.3)
      ax.tick_params(labelsize=7)
    handles, labels = block['val/loss'].get_legend_handles_labels()
    if not handles:  # No validation yet: the training lines.
      handles, labels = block['train/loss'].get_legend_handles_labels()
    if not handles:  # Nothing logged yet in this block.
      continue
    block['val/loss'].legend(
        handles, labels, loc='upper left', bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0, fontsize=7, handlelength=3.0,
        ncol=1 + (len(handles) - 1) // 24,
        title='colour: mechanism; line: seed', title_fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches='tight')
  plt.close(fig)
  return [{k: v for k, v in s.items() if k != 'lines'} for s in series]


# ----------------------------------------------------------------- collect


def _scrub(value: Any) -> Any:
  """Absolute paths become `…/<last two parts>`: copies name no machine."""
  if isinstance(value, dict):
    return {k: _scrub(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_scrub(v) for v in value]
  if isinstance(value, str) and os.path.isabs(value):
    parts = [p for p in value.split(os.sep) if p]
    return '…/' + '/'.join(parts[-2:])
  return value


def _read_scrubbed(path: str) -> Optional[Any]:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return _scrub(json.load(f))


def collect(run_dirs: Sequence[str], roots: Sequence[str], dest: str
            ) -> list[str]:
  """Copies each run's results.json (paths scrubbed), config.json and
  deduplicated metrics.jsonl to `dest/<path under its --runs root>`, the
  small files from which this command rebuilds tables and curves.

  A copy only ever replaces an earlier copy of the same run: if two runs
  map to the same folder (e.g. two roots with the same layout), or the
  folder holds a run with another config, nothing is written and the
  command stops naming both.
  """
  targets = {}
  for run_dir in run_dirs:
    root = next((os.path.abspath(r) for r in roots
                 if run_dir.startswith(os.path.abspath(r) + os.sep)), None)
    rel = (os.path.relpath(run_dir, root) if root else
           os.path.basename(run_dir))
    out = os.path.join(dest, rel)
    if out in targets:
      raise SystemExit(
          f'--collect: {targets[out]} and {run_dir} would both be copied to '
          f'{out}; collect each --runs root into its own folder.')
    config = _read_scrubbed(os.path.join(run_dir, 'config.json'))
    held = _read_scrubbed(os.path.join(out, 'config.json'))
    if config is not None and held is not None and config != held:
      keys = fingerprint_lib.differing_keys(fingerprint_lib.flatten(config),
                                            fingerprint_lib.flatten(held))
      raise SystemExit(
          f'--collect: {out} holds a run with another config (differs in '
          f'{", ".join(keys[:5])}) than {run_dir}; collect into another '
          'folder, or delete that copy if it is meant to be replaced.')
    targets[out] = run_dir
  for out, run_dir in targets.items():
    os.makedirs(out, exist_ok=True)
    for name in (RESULTS_FILE, 'config.json'):
      data = _read_scrubbed(os.path.join(run_dir, name))
      if data is not None:
        with open(os.path.join(out, name), 'w') as f:
          json.dump(data, f, indent=1, sort_keys=True)
          f.write('\n')
    mpath = metrics_path(run_dir)
    if mpath is not None:
      with open(os.path.join(out, METRICS_FILE), 'w') as f:
        for record in read_metrics(mpath):
          f.write(json.dumps(record) + '\n')
  return list(targets)


DOC_BEGIN, DOC_END = '<!-- results:begin -->', '<!-- results:end -->'


def write_doc(path: str, text: str) -> None:
  """Replaces the text between the results markers of a markdown file;
  the tables' headings go one level down (## -> ###)."""
  with open(path) as f:
    doc = f.read()
  if DOC_BEGIN not in doc or DOC_END not in doc:
    raise SystemExit(f'{path} lacks the markers {DOC_BEGIN} and {DOC_END}.')
  body = text.split('\n', 2)[2] if text.startswith('# ') else text
  body = '\n'.join('#' + line if line.startswith('## ') else line
                   for line in body.splitlines())
  head, rest = doc.split(DOC_BEGIN, 1)
  _, tail = rest.split(DOC_END, 1)
  with open(path, 'w') as f:
    f.write(f'{head}{DOC_BEGIN}\n{body.strip()}\n{DOC_END}{tail}')


def main(argv: Sequence[str]) -> None:
  parser = argparse.ArgumentParser(
      prog='python -m lra_msmra_tools.results',
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
  parser.add_argument('--doc', default=None,
                      help='markdown file whose text between '
                           f'{DOC_BEGIN} and {DOC_END} to replace with the '
                           'tables (the "# LRA results" title left out)')
  parser.add_argument('--collect', default=None,
                      help='also copy every run\'s results.json, config.json '
                           'and metrics.jsonl (no checkpoints, no machine '
                           'paths) to this folder; the command rebuilds the '
                           'same tables and curves from the copy')
  args = parser.parse_args(argv[1:])
  for path in args.runs:
    if not os.path.exists(path):
      raise SystemExit(f'--runs: {path} does not exist.')
  run_dirs = find_run_dirs(args.runs)
  paths = [os.path.join(d, RESULTS_FILE) for d in run_dirs
           if os.path.exists(os.path.join(d, RESULTS_FILE))]
  if not run_dirs:
    raise SystemExit(f'No {RESULTS_FILE} or {METRICS_FILE} found under '
                     f'{args.runs}.')
  runs = [run for run in map(load_run, paths) if not is_pretraining(run)]
  # Pretraining runs, finished or not, have neither a row nor a curve:
  # their loss and accuracy are per token.
  curve_dirs = [d for d in run_dirs if not pretraining_dir(d)]
  label_runs(runs)
  rows = aggregate(runs + select_by_validation(runs))
  os.makedirs(args.out, exist_ok=True)
  text = markdown(rows, runs)
  runs_by_dir = {os.path.dirname(r['path']): r for r in runs}
  curves = curves_chart(curve_dirs, runs_by_dir,
                        os.path.join(args.out, 'results_curves.png'))
  unfinished = [c for c in curves if not c['finished']]
  if unfinished:
    text += '\n'.join(['', '## Unfinished runs (curves only, no table row)',
                       ''] + [f'- {c["label"]}: {c["group"]}, last logged '
                              f'step {c["last_step"]}' for c in unfinished]
                      + [''])
  if args.collect:
    collect(run_dirs, args.runs, args.collect)
  if args.doc:
    write_doc(args.doc, text)
  bench = None
  if args.benchmark:
    with open(args.benchmark) as f:
      bench = json.load(f)
  points = bubble_chart(rows, os.path.join(args.out, 'results_bubble.png'),
                        bench, args.bubble_length)
  with open(os.path.join(args.out, 'results.md'), 'w') as f:
    f.write(text + '\n')
  with open(os.path.join(args.out, TABLE_FILE), 'w') as f:
    json.dump({'runs': [_scrub(p) for p in paths], 'rows': _scrub(rows),
               'bubbles': points, 'curves': curves}, f, indent=2)
    f.write('\n')
  print(text)
  print(f'\nWrote results.md, {TABLE_FILE}, results_bubble.png and '
        f'results_curves.png to {args.out} ({len(runs)} finished runs, '
        f'{len(unfinished)} unfinished).')


if __name__ == '__main__':
  main(sys.argv)
