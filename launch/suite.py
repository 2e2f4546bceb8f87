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
* At the end `python -m lra_msmra.results --runs <root>/<protocol> --out
  <root>/<protocol>/summary` writes the table and the bubble chart
  (`--benchmark` forwards a train_step.json for the chart's speed/memory).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from typing import Sequence

from lra_msmra import config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
        for seed in _split(args.seeds):
          workdir = os.path.join(args.root, args.protocol, task, folder,
                                 f'seed{int(seed)}')
          cmd = [sys.executable, '-m', 'lra_msmra.main',
                 '--config', config + suffix, '--workdir', workdir,
                 f'--config.seed={int(seed)}']
          if factor != 1:
            key, value = base
            cmd.append(f'--config.schedule.{key}={factor * value:.6g}')
          if args.data_dir:
            cmd.append(f'--config.data_dir={args.data_dir}')
          cmd += [f'--config.{o}' for o in args.override]
          if args.distributed:
            cmd.append('--distributed')
          runs.append((workdir, cmd))
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
  p.add_argument('--distributed', action='store_true')
  p.add_argument('--benchmark', default='',
                 help='train_step.json for the bubble chart')
  p.add_argument('--dry_run', action='store_true',
                 help='print the commands without running them')
  args = p.parse_args(argv)
  check_data(args)
  runs = plan(args)
  failed = []
  for workdir, cmd in runs:
    line = ' '.join(shlex.quote(c) for c in cmd)
    if os.path.exists(os.path.join(workdir, 'results.json')):
      print(f'done already: {workdir}', flush=True)
      continue
    print(line, flush=True)
    if args.dry_run:
      continue
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
      failed.append(workdir)
  summary = [sys.executable, '-m', 'lra_msmra.results', '--runs',
             os.path.join(args.root, args.protocol), '--out',
             os.path.join(args.root, args.protocol, 'summary')]
  if args.benchmark:
    summary += ['--benchmark', args.benchmark]
  print(' '.join(shlex.quote(c) for c in summary), flush=True)
  if not args.dry_run:
    if subprocess.run(summary, cwd=ROOT).returncode != 0:
      failed.append('results table')
  if failed:
    print(f'Failed: {failed}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
