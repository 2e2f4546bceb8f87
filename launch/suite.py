r"""Runs mechanisms x tasks x seeds under one protocol, then the results table.

  python launch/suite.py --protocol lra \
      --mechanisms softmax,cst,long_short,adamra,combiner_fixed \
      --tasks listops,text,retrieval,image,pathfinder --seeds 0,1,2 \
      --root /tmp/lra_suite [--data_dir /data/lra_release] [--dry_run]

Every run is the main command, unchanged:

  python -m lra_msmra.main --config configs/<task>/<config>.py[:<options>] \
      --workdir <root>/<protocol>/<task>/<config>/seed<k> --config.seed=<k>

* `--mechanisms` are config names of each task folder (`softmax` stands for
  `transformer.py` and `combiner` for `combiner_fixed.py`); every
  (task, mechanism) config must exist, which is checked before anything runs.
* `--protocol` is `lra` (no option), `xiong` or `cst` (the config option of
  that name); `--options` adds more (e.g. `runlocal` for a quick CPU pass).
* `--data_dir` is passed as `--config.data_dir` when given; `--override`
  passes any further `--config.key=value` (repeatable).
* `--lr_bracket 0.5,1,2` runs every config at each factor times the
  learning rate its config file sets (the CST paper's search picks one of
  {0.5, 1, 2} x l0 by validation): factor 1 is the config as it is, in its
  usual workdir; another factor f sets the schedule's learning rate to
  f x l0 (`--config.schedule.<key>=...`) in the workdir
  `<config>_lr<f>x/seed<k>`, so the results table lists it under changed
  settings beside the config's row.
* Runs go one after another; re-running the suite resumes unfinished runs
  (the trainer resumes from its checkpoints) and skips finished ones (those
  with a results.json). `--distributed` is passed to every run on a TPU pod
  or SLURM cluster, where every host runs this same command.
* `--jobs N` runs up to N of them side by side (one GPU shared: set
  `XLA_PYTHON_CLIENT_PREALLOCATE=false`). Each run's output then goes to
  `<workdir>/run.log` (appended to, so a resumed run's log continues) and
  the suite prints one line when a run starts and one when it ends.
* `--stop_after SECONDS` sends SIGTERM to the runs still going at that
  deadline (each saves a checkpoint at its current step and exits), starts
  no run with under `--min_start_s` (default MIN_START_S = 120 s: loading
  the data and compiling take about a minute before the first step, and the
  checkpoint must still be written) left, and a run that has not exited
  `--stop_grace_s` (default 60 s) after SIGTERM is killed (it resumes from
  its previous checkpoint). Runs already begun (a `checkpoints/` folder in
  their workdir) go first, so that each stretch finishes what the last one
  started. A SIGTERM to the suite itself moves the deadline to now.
  The suite exits with status 3 (EXIT_UNFINISHED) when runs are left
  unfinished and none failed: re-run the same command to resume them.
  Status 1: a run (or the results table) failed.
* A workdir holding `carry_held.json` (HELD_FILE) is the stub of a run whose
  state `launch/carry.py` held back for lack of room: it is skipped, counted
  as unfinished, and takes one of the `--jobs` (so a held run resumes once
  the runs ahead of it have finished).
* `--spt` makes each (task, mechanism, seed) a self-pretraining job
  (docs/pretraining.md): first the config with the `spt` option in
  `<workdir>/pretrain`, then the config as it is, fine-tuned from it
  (`--config.init_from=<workdir>/pretrain`), in `<workdir>` =
  `<root>/<protocol>/<task>/<config>_spt/seed<k>`. The fine-tuning run
  starts once its pretraining has finished (with `--jobs`, other runs go
  meanwhile); when the pretraining fails, it is not started and counts as
  failed. `--pretrain_override` passes `--config.key=value` to the
  pretraining run only (e.g. `num_train_steps=500`).
* At the end `python -m lra_msmra_tools.results --runs <root>/<protocol> --out
  <root>/<protocol>/summary` writes the table and the bubble chart
  (`--benchmark` forwards a train_step.json for the chart's speed/memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence, TextIO

from lra_msmra import config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Exit status of the suite when runs are left unfinished (none failed):
# re-run the same command to resume them.
EXIT_UNFINISHED = 3
# With --stop_after, no run starts with fewer seconds than this left: the
# data and the compilation take about a minute before a run's first step,
# and its checkpoint must still be written before the deadline.
MIN_START_S = 120
# Seconds a run may take to save its checkpoint and exit after SIGTERM
# before it is killed (it then resumes from its previous checkpoint).
STOP_GRACE_S = 60
# With --jobs > 1, each run's stdout and stderr go to this file of its
# workdir (appended to).
LOG_FILE = 'run.log'
# With --spt, the pretraining run's folder inside each job's workdir.
PRETRAIN_DIR = 'pretrain'
# The stub of a run whose state launch/carry.py held back: its workdir is
# skipped (the state is where it was packed) and it takes one of --jobs.
HELD_FILE = 'carry_held.json'
# Exit statuses of a run that saved its checkpoint and stopped on a signal
# (lra_msmra.main: 128 + SIGTERM, SIGINT or SIGPIPE).
STOPPED_STATUSES = (128 + signal.SIGTERM, 128 + signal.SIGINT,
                    128 + signal.SIGPIPE)


def _split(text: str) -> list[str]:
  return [t.strip() for t in text.split(',') if t.strip()]


# Schedule keys that hold the learning rate, by schedule (config_lib).
LEARNING_RATE_KEYS = ('learning_rate', 'max_learning_rate',
                      'base_learning_rate')


def factors(text: str) -> list[float]:
  """`--lr_bracket` as factors; [1.0] when empty."""
  values = []
  for item in _split(text) or ['1']:
    try:
      value = float(item)
    except ValueError:
      raise SystemExit(f'--lr_bracket: {item!r} is not a number; give '
                       'factors of the config\'s learning rate, e.g. '
                       '0.5,1,2.') from None
    if value <= 0:
      raise SystemExit(f'--lr_bracket: factor {item} must be > 0.')
    values.append(value)
  return values


def learning_rate(config_path: str, arg: str) -> tuple[str, float]:
  """(schedule key, value) of the learning rate a config file sets."""
  stem = os.path.splitext(os.path.basename(config_path))[0]
  config = config_lib.load_sibling(os.path.join(ROOT, config_path),
                                   stem).get_config(arg or None)
  for key in LEARNING_RATE_KEYS:
    if key in config.schedule:
      return key, float(config.schedule[key])
  raise SystemExit(f'{config_path}: its schedule has none of '
                   f'{LEARNING_RATE_KEYS}; --lr_bracket cannot scale it.')


def _factor_label(factor: float) -> str:
  return f'{factor:g}'


def plan(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
  """(workdir, command) of every run; raises if a config is missing."""
  options = ([] if args.protocol == 'lra' else [args.protocol]) + _split(
      args.options)
  suffix = (':' + ','.join(options)) if options else ''
  bracket = factors(args.lr_bracket)
  spt = getattr(args, 'spt', False)
  runs, missing = [], []
  for task in _split(args.tasks):
    for mech in _split(args.mechanisms):
      stem = config_lib.CONFIG_ALIASES.get(mech, mech)
      config = os.path.join('configs', task, stem + '.py')
      if not os.path.exists(os.path.join(ROOT, config)):
        missing.append(config)
        continue
      base = (learning_rate(config, ','.join(options))
              if bracket != [1.0] else None)
      for factor in bracket:
        folder = stem if factor == 1 else f'{stem}_lr{_factor_label(factor)}x'
        folder += '_spt' if spt else ''
        for seed in _split(args.seeds):
          workdir = os.path.join(args.root, args.protocol, task, folder,
                                 f'seed{int(seed)}')

          def command(config_arg, where, extra=()):
            cmd = [sys.executable, '-m', 'lra_msmra.main',
                   '--config', config_arg, '--workdir', where,
                   f'--config.seed={int(seed)}']
            if factor != 1:
              key, value = base
              cmd.append(f'--config.schedule.{key}={factor * value:.6g}')
            if args.data_dir:
              cmd.append(f'--config.data_dir={args.data_dir}')
            cmd += [f'--config.{o}' for o in args.override]
            cmd += [f'--config.{o}' for o in extra]
            if args.distributed:
              cmd.append('--distributed')
            return cmd

          if spt:
            pretrain = os.path.join(workdir, PRETRAIN_DIR)
            runs.append((pretrain, command(
                f'{config}:{",".join(options + ["spt"])}', pretrain,
                args.pretrain_override)))
            runs.append((workdir, command(
                config + suffix, workdir, [f'init_from={pretrain}'])))
          else:
            runs.append((workdir, command(config + suffix, workdir)))
  if missing:
    raise SystemExit(f'Missing config files {missing}: check --tasks and '
                     '--mechanisms (names of files in configs/<task>/).')
  return runs


def check_data(args: argparse.Namespace) -> None:
  """Full configs need data: stop before the first run if none is given."""
  asked = (args.data_dir or 'runlocal' in _split(args.options) or
           any(o.replace(' ', '') == 'data.generate=True'
               for o in args.override))
  if not asked:
    raise SystemExit(
        'No --data_dir: full configs need their data (see README, Data). '
        'Prepare it with `python -m lra_msmra.data.prepare --lra_release '
        'lra_release.gz --out DIR` (ListOps also: `--generate_listops`) and '
        'pass --data_dir DIR, or use --options runlocal for the tiny CPU '
        'jobs.')


@dataclasses.dataclass
class _Run:
  workdir: str
  cmd: list[str]
  proc: subprocess.Popen
  started: float
  log: Optional[TextIO] = None
  term_at: Optional[float] = None
  killed: bool = False


@dataclasses.dataclass
class Outcome:
  """Workdirs of the runs by how they ended."""
  finished: list[str] = dataclasses.field(default_factory=list)
  failed: list[str] = dataclasses.field(default_factory=list)
  # Stopped at the deadline (resumable), or never started for lack of time.
  stopped: list[str] = dataclasses.field(default_factory=list)
  not_started: list[str] = dataclasses.field(default_factory=list)

  @property
  def unfinished(self) -> list[str]:
    return self.stopped + self.not_started


def source_of(cmd: Sequence[str]) -> Optional[str]:
  """The workdir a fine-tuning command starts from (its
  `--config.init_from=`), or None."""
  for arg in cmd:
    if arg.startswith('--config.init_from='):
      return arg.split('=', 1)[1] or None
  return None


def any_results(folder: str) -> bool:
  """Whether a results.json lies anywhere under `folder`."""
  return any('results.json' in files for _, _, files in os.walk(folder))


def begun_first(runs: list[tuple[str, list[str]]]
                ) -> list[tuple[str, list[str]]]:
  """`runs` with those that have a checkpoints/ folder first (stable)."""
  return sorted(runs, key=lambda r: not os.path.isdir(
      os.path.join(r[0], 'checkpoints')))


def _next_ready(pending: list[tuple[str, list[str]]], running: list[_Run],
                outcome: Outcome, say: Callable[[str], None]
                ) -> Optional[int]:
  """The index of the first pending run that can start: one whose
  pretraining run (`source_of`) has finished. Runs whose pretraining
  failed or was not started leave `pending`, as failed or not started."""
  i = 0
  while i < len(pending):
    workdir, cmd = pending[i]
    source = source_of(cmd)
    if source is None or os.path.exists(os.path.join(source,
                                                     'results.json')):
      return i
    if source in outcome.failed + outcome.unfinished:
      pending.pop(i)
      (outcome.failed if source in outcome.failed else
       outcome.not_started).append(workdir)
      say(f'not started {workdir}: its pretraining {source} did not finish')
      continue
    if not any(r.workdir == source for r in running) and not any(
        w == source for w, _ in pending):
      return i  # Not a run of this suite: the trainer says what is wrong.
    i += 1
  return None


def execute(runs: Sequence[tuple[str, list[str]]], *, jobs: int = 1,
            stop_after: Optional[float] = None,
            min_start_s: float = MIN_START_S,
            stop_grace_s: float = STOP_GRACE_S, logs: Optional[bool] = None,
            cwd: str = ROOT,
            popen: Callable[..., subprocess.Popen] = subprocess.Popen,
            clock: Callable[[], float] = time.monotonic,
            poll_s: float = 0.2) -> Outcome:
  """Runs the (workdir, command) pairs, up to `jobs` at once.

  With `logs` (default: `jobs` > 1) a run's output goes to
  `<workdir>/run.log` and one line is printed when a run starts and one
  when it ends; without, to this process's stdout and stderr, and only its
  command line is printed first (as without --jobs). `stop_after` (seconds
  from now): see the module docstring. A SIGTERM to this process moves the
  deadline to now.
  """
  outcome = Outcome()
  logs = jobs > 1 if logs is None else logs
  begin = clock()
  deadline = None if stop_after is None else begin + stop_after
  pending = list(runs)
  running: list[_Run] = []
  term = []
  handled = False
  try:
    previous = signal.signal(signal.SIGTERM, lambda *_: term.append(1))
    handled = True
  except ValueError:  # Not the main thread: no handler.
    pass

  def say(text: str) -> None:
    if logs or deadline is not None:
      print(f'[{clock() - begin:6.0f} s] {text}', flush=True)

  def start(workdir: str, cmd: list[str]) -> None:
    line = ' '.join(shlex.quote(c) for c in cmd)
    log = None
    if logs:
      os.makedirs(workdir, exist_ok=True)
      log = open(os.path.join(workdir, LOG_FILE), 'a')
      log.write(f'==== {time.strftime("%Y-%m-%d %H:%M:%S")} {line}\n')
      log.flush()
      say(f'start {workdir} (log {os.path.join(workdir, LOG_FILE)}): '
          f'{line}')
      proc = popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    else:
      print(line, flush=True)
      proc = popen(cmd, cwd=cwd)
    running.append(_Run(workdir, cmd, proc, clock(), log))

  def end(run: _Run, status: int) -> None:
    running.remove(run)
    if run.log is not None:
      run.log.close()
    took = f'{clock() - run.started:.0f} s'
    if status == 0:
      outcome.finished.append(run.workdir)
      if logs:
        say(f'finished {run.workdir} in {took}')
    elif status in STOPPED_STATUSES or (status < 0 and
                                        run.term_at is not None):
      outcome.stopped.append(run.workdir)
      say(f'stopped {run.workdir} after {took} (exit {status}): '
          'unfinished, resumes from its checkpoint')
    else:
      outcome.failed.append(run.workdir)
      where = (f', see {os.path.join(run.workdir, LOG_FILE)}'
               if run.log is not None else '')
      if logs or deadline is not None:
        say(f'failed {run.workdir} after {took} (exit {status}{where})')

  try:
    while pending or running:
      now = clock()
      if term and (deadline is None or deadline > now):
        deadline = now
      for run in list(running):
        status = run.proc.poll()
        if status is not None:
          end(run, status)
      now = clock()
      if deadline is not None and now >= deadline:
        for run in running:
          if run.term_at is None:
            run.term_at = now
            say(f'deadline: SIGTERM to {run.workdir}')
            run.proc.send_signal(signal.SIGTERM)
          elif not run.killed and now - run.term_at > stop_grace_s:
            run.killed = True
            say(f'{run.workdir} still running {stop_grace_s:g} s after '
                'SIGTERM: killed (it resumes from its previous checkpoint)')
            run.proc.kill()
      while pending and len(running) < jobs:
        if deadline is not None and deadline - now < min_start_s:
          for workdir, _ in pending:
            outcome.not_started.append(workdir)
            say(f'not started {workdir}: under {min_start_s:g} s left')
          pending = []
          break
        ready = _next_ready(pending, running, outcome, say)
        if ready is None:
          break
        start(*pending.pop(ready))
      if running:
        time.sleep(poll_s)
      elif pending and _next_ready(pending, running, outcome, say) is None:
        # Nothing running and nothing that can start (a safety net: a run
        # waits only on runs of the suite that are running).
        outcome.not_started.extend(w for w, _ in pending)
        break
  except KeyboardInterrupt:
    # Ctrl-C reached the runs too: let them save their checkpoints.
    for run in running:
      try:
        run.proc.wait(timeout=stop_grace_s)
      except subprocess.TimeoutExpired:
        pass
    raise
  finally:
    for run in running:  # Only after an exception: stop what is left.
      if run.proc.poll() is None:
        run.proc.kill()
    if handled:
      signal.signal(signal.SIGTERM, previous)
  return outcome


def main(argv: Sequence[str]) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--protocol', default='lra',
                 choices=config_lib.PROTOCOLS)
  p.add_argument('--mechanisms',
                 default='softmax,cst,long_short,adamra,combiner_fixed')
  p.add_argument('--tasks', default=','.join(config_lib.TASKS[:5]))
  p.add_argument('--seeds', default='0')
  p.add_argument('--root', required=True, help='folder for all workdirs')
  p.add_argument('--options', default='',
                 help='extra config options, e.g. runlocal')
  p.add_argument('--data_dir', default='')
  p.add_argument('--override', action='append', default=[],
                 help='key=value passed as --config.key=value (repeatable)')
  p.add_argument('--lr_bracket', default='',
                 help='factors of each config\'s learning rate to run, '
                 'e.g. 0.5,1,2 (the CST paper\'s search)')
  p.add_argument('--spt', action='store_true',
                 help='self-pretraining: each job pretrains (the spt '
                 'option) in <workdir>/pretrain, then fine-tunes from it')
  p.add_argument('--pretrain_override', action='append', default=[],
                 help='key=value passed to the pretraining runs only '
                 '(repeatable), e.g. num_train_steps=500')
  p.add_argument('--distributed', action='store_true')
  p.add_argument('--benchmark', default='',
                 help='train_step.json for the bubble chart')
  p.add_argument('--dry_run', action='store_true',
                 help='print the commands without running them')
  p.add_argument('--jobs', type=int, default=1,
                 help='runs side by side (default 1: one after another, '
                 'their output here); with more, each run writes to '
                 f'<workdir>/{LOG_FILE} and one line is printed per run '
                 'start and end')
  p.add_argument('--stop_after', type=float, default=None,
                 help='seconds after which the runs still going get SIGTERM '
                 '(they checkpoint and exit); unfinished runs give exit '
                 f'status {EXIT_UNFINISHED}: re-run to resume them')
  p.add_argument('--min_start_s', type=float, default=MIN_START_S,
                 help='with --stop_after, start no run with fewer seconds '
                 'left (default %(default)s)')
  p.add_argument('--stop_grace_s', type=float, default=STOP_GRACE_S,
                 help='seconds a run has to exit after SIGTERM before it is '
                 'killed (default %(default)s)')
  args = p.parse_args(argv)
  if args.jobs < 1:
    p.error('--jobs must be >= 1')
  if args.pretrain_override and not args.spt:
    p.error('--pretrain_override needs --spt')
  check_data(args)
  runs = plan(args)
  todo, held = [], []
  for workdir, cmd in runs:
    if os.path.exists(os.path.join(workdir, 'results.json')):
      print(f'done already: {workdir}', flush=True)
      continue
    if os.path.exists(os.path.join(workdir, HELD_FILE)):
      print(f'held elsewhere: {workdir} ({HELD_FILE}; launch/carry.py)',
            flush=True)
      held.append(workdir)
      continue
    if args.dry_run:
      print(' '.join(shlex.quote(c) for c in cmd), flush=True)
      continue
    todo.append((workdir, cmd))
  if args.stop_after is not None:
    todo = begun_first(todo)
  jobs = max(1, args.jobs - len(held))
  if jobs < args.jobs:
    print(f'{len(held)} held run(s) take {args.jobs - jobs} of --jobs '
          f'{args.jobs}: {jobs} side by side', flush=True)
  outcome = execute(todo, jobs=jobs, stop_after=args.stop_after,
                    logs=args.jobs > 1, min_start_s=args.min_start_s,
                    stop_grace_s=args.stop_grace_s)
  failed = list(outcome.failed)
  summary = [sys.executable, '-m', 'lra_msmra_tools.results', '--runs',
             os.path.join(args.root, args.protocol), '--out',
             os.path.join(args.root, args.protocol, 'summary')]
  if args.benchmark:
    summary += ['--benchmark', args.benchmark]
  if args.dry_run or any_results(os.path.join(args.root, args.protocol)):
    print(' '.join(shlex.quote(c) for c in summary), flush=True)
    if not args.dry_run:
      if subprocess.run(summary, cwd=ROOT).returncode != 0:
        failed.append('results table')
  else:
    print('No finished run yet: no results table.', flush=True)
  unfinished = outcome.unfinished + held
  if unfinished:
    print(f'Unfinished ({len(unfinished)}; re-run the same command '
          f'to resume them): {unfinished}', file=sys.stderr, flush=True)
  if failed:
    print(f'Failed: {failed}', file=sys.stderr)
    return 1
  if unfinished:
    return EXIT_UNFINISHED
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
