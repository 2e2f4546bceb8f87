r"""Times every `runlocal` job: the README's "minutes on a CPU" as a table.

  python -m lra_msmra_tools.benchmark.runlocal --out /tmp/runlocal \
      [--tasks listops,text,...] [--mechanisms transformer,cst,...] \
      [--doc docs/runlocal.md]

Each job is the user's command, `python -m lra_msmra.main --config
configs/<task>/<config>.py:runlocal --workdir DIR`, in a fresh process on
one CPU device, one after another. The table gives per job the wall time of
the whole command (start-up, data generation, compilation, training,
evaluation and test), the test accuracy against the majority-class rate of
the test split, and the steady-state steps/s `results.json` records.
`--doc` replaces the table between the markers `<!-- runlocal:begin -->` and
`<!-- runlocal:end -->` of a markdown file with this run's table, its
command, date, machine (the cores the command may use: run it under
`taskset` and the table says so) and load average. `OUT/runlocal.json` is
written after every job, so a command stopped part way keeps what it
measured; `--from_report OUT/runlocal.json --doc ...` writes its table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from lra_msmra import config_lib
from lra_msmra import records as records_lib
from lra_msmra_tools.benchmark import environment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TASKS = config_lib.TASKS
# One config per registered mechanism (variants share their code paths).
MECHANISMS = ('transformer', 'cst', 'long_short', 'adamra', 'combiner_fixed')
BEGIN, END = '<!-- runlocal:begin -->', '<!-- runlocal:end -->'
# The aim for a runlocal job on a 2-core CPU.
TARGET_SECONDS = 300


def run_job(task: str, config: str, workdir: str, timeout: int
            ) -> dict[str, Any]:
  """Runs one runlocal job; returns its timing and results."""
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env['TF_CPP_MIN_LOG_LEVEL'] = '3'
  path = f'configs/{task}/{config}.py'
  cmd = [sys.executable, '-m', 'lra_msmra.main', '--config',
         f'{path}:runlocal', '--workdir', workdir]
  record: dict[str, Any] = {'task': task, 'config': config,
                            'command': ' '.join(shlex.quote(c) for c in cmd)}
  if not os.path.exists(os.path.join(ROOT, path)):
    record['status'] = 'no such config'
    return record
  start = time.time()
  try:
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    record.update(status=f'timed out after {timeout} s',
                  wall_seconds=time.time() - start)
    return record
  record['wall_seconds'] = time.time() - start
  if done.returncode != 0:
    record['status'] = f'failed (exit {done.returncode})'
    record['stderr_tail'] = done.stderr[-2000:]
    return record
  with open(os.path.join(workdir, 'results.json')) as f:
    results = json.load(f)
  record.update(
      status='ok', test_accuracy=results['test_accuracy'],
      majority=results['test_majority_rate'],
      steps=results['final']['step'],
      steps_per_sec=results.get('train_steps_per_sec'),
      num_params=results.get('num_params'))
  return record


def _mmss(seconds: Optional[float]) -> str:
  if seconds is None:
    return '—'
  minutes, rest = divmod(int(round(seconds)), 60)
  return f'{minutes}:{rest:02d}'


def markdown(report: dict[str, Any]) -> str:
  head = report['settings']
  lines = [
      f'Measured {head["date"]} on {head["machine"]} (load average at start '
      f'{head["load_start"]}, at end {head.get("load_end") or "—"}), commit '
      f'`{head["commit"][:10]}`:', '', '```', head['command'], '```', '',
      '| task | config | wall time | test accuracy | majority class | '
      'beats majority | steps | steps/s |',
      '|---|---|---|---|---|---|---|---|']
  tasks, configs = head.get('tasks'), head.get('configs')
  notes = []
  if tasks is not None and configs is not None:
    jobs = len(tasks) * len(configs)
    if set(TASKS) - set(tasks) or set(MECHANISMS) - set(configs):
      notes.append(f'A partial run: {jobs} of the '
                   f'{len(TASKS) * len(MECHANISMS)} jobs of the full command '
                   f'(tasks {", ".join(tasks)}; configs {", ".join(configs)}). '
                   'The other jobs are not measured at this commit.')
    if len(report['records']) < jobs:
      notes.append(f'An unfinished run: the command was stopped after '
                   f'{len(report["records"])} of its {jobs} jobs; the table '
                   'has those.')
  if notes:
    lines[1:1] = ['', ' '.join(notes)]
  for r in report['records']:
    if r['status'] != 'ok':
      lines.append(f'| {r["task"]} | `{r["config"]}` | '
                   f'{_mmss(r.get("wall_seconds"))} | {r["status"]} | | | | |')
      continue
    margin = r['test_accuracy'] - r['majority']
    over = '' if r['wall_seconds'] <= TARGET_SECONDS else ' (over 5:00)'
    speed = (f'{r["steps_per_sec"]:.1f}' if r.get('steps_per_sec') else '—')
    lines.append(
        f'| {r["task"]} | `{r["config"]}` | {_mmss(r["wall_seconds"])}{over}'
        f' | {100 * r["test_accuracy"]:.1f}% | {100 * r["majority"]:.1f}% | '
        f'{"yes" if margin > 0 else "no"} ({100 * margin:+.1f}) | '
        f'{r["steps"]} | {speed} |')
  return '\n'.join(lines)


def write_doc(path: str, table: str) -> None:
  """Replaces the text between the runlocal markers of `path`."""
  with open(path) as f:
    text = f.read()
  if BEGIN not in text or END not in text:
    raise SystemExit(f'{path} lacks the markers {BEGIN} and {END}.')
  head, rest = text.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  with open(path, 'w') as f:
    f.write(f'{head}{BEGIN}\n{table}\n{END}{tail}')


def _write_report(out: str, report: dict[str, Any]) -> None:
  path = os.path.join(out, 'runlocal.json')
  with open(path + '.tmp', 'w') as f:
    json.dump(report, f, indent=1)
  os.replace(path + '.tmp', path)


def _load() -> str:
  return ', '.join(f'{x:.2f}' for x in os.getloadavg())


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(prog='python -m lra_msmra_tools.benchmark.runlocal',
                              description=__doc__.split('\n\n')[0])
  p.add_argument('--out', required=True,
                 help='folder for the workdirs and runlocal.json/.md')
  p.add_argument('--tasks', default=','.join(TASKS))
  p.add_argument('--mechanisms', default=','.join(MECHANISMS),
                 help='config names of configs/<task>/')
  p.add_argument('--timeout', type=int, default=1800,
                 help='seconds before a job is stopped')
  p.add_argument('--doc', default=None,
                 help='markdown file whose runlocal table to replace')
  p.add_argument('--from_report', default=None, metavar='JSON',
                 help='run nothing: write the table (and --doc) of a '
                 'runlocal.json an earlier command wrote, finished or not')
  args = p.parse_args(argv)
  if args.from_report:
    with open(args.from_report) as f:
      report = json.load(f)
    table = markdown(report)
    print(table)
    if args.doc:
      write_doc(args.doc, table)
    return 0
  tasks = [t for t in args.tasks.split(',') if t]
  configs = [m for m in args.mechanisms.split(',') if m]
  unknown = sorted(set(tasks) - set(TASKS))
  if unknown:
    p.error(f'--tasks: unknown {unknown}; valid: {list(TASKS)}.')
  command = 'python -m lra_msmra_tools.benchmark.runlocal ' + ' '.join(
      shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
  settings = {
      'date': datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%d %H:%M UTC'),
      'machine': f'{environment.cpu_cores()} ({platform.machine()})',
      'load_start': _load(), 'commit': records_lib.git_commit().get(
          'commit', 'unknown'),
      'command': command, 'tasks': tasks, 'configs': configs}
  records = []
  report = {'settings': settings, 'records': records}
  os.makedirs(args.out, exist_ok=True)
  for task in tasks:
    for config in configs:
      workdir = os.path.join(args.out, task, config)
      # A fresh workdir each time: a left-over checkpoint would be resumed.
      shutil.rmtree(workdir, ignore_errors=True)
      record = run_job(task, config, workdir, args.timeout)
      print(f'{task:10s} {config:16s} {record["status"]:8s} '
            f'{_mmss(record.get("wall_seconds"))}', flush=True)
      records.append(record)
      # After every job: a stopped command keeps what it measured
      # (`--from_report` writes its table).
      _write_report(args.out, report)
  settings['load_end'] = _load()
  _write_report(args.out, report)
  table = markdown(report)
  with open(os.path.join(args.out, 'runlocal.md'), 'w') as f:
    f.write(table + '\n')
  print(table)
  if args.doc:
    write_doc(args.doc, table)
  return 0 if all(r['status'] == 'ok' for r in records) else 1


if __name__ == '__main__':
  sys.exit(main())
