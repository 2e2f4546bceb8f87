#!/usr/bin/env python3
r"""Carries the state of suite runs from one short-lived machine to the next.

  python launch/carry.py pack ROOT OUT_DIR [--part_mib 15] [--max_mib MIB]
      [--max_files N] [--finished_checkpoints]
  python launch/carry.py unpack IN_DIR ROOT [--held_stubs]

`pack` finds every workdir under ROOT (a folder holding config.json) and
writes what each needs to resume, or to be listed in the results table, as
one gzip tar split into parts of at most `--part_mib` MiB
(`carry.tar.gz.000`, `.001`, ...) plus `carry.json`, the manifest: the
archive's size and sha256, each part's, and every run with its step. Of a
workdir it keeps:

* its top-level files (config.json, model_spec.json, results.json when
  finished, run.log), but not `lock`;
* tensorboard/ (metrics.jsonl and the event files);
* of checkpoints/ and best/, only the newest step folder (the newest that
  orbax finished, i.e. holds _CHECKPOINT_METADATA) and any top-level file:
  a step folder is all that orbax needs to restore that step;
* nothing else (e.g. data/, generated data that a run writes again).

A finished run (results.json) needs no checkpoint: its checkpoints/ and
best/ are left out unless `--finished_checkpoints`, except the newest
checkpoint of a finished pretraining run (`launch/suite.py --spt`: the
`pretrain/` folder of a job's workdir) whose fine-tuning has not finished,
which starts from it.

Held runs. When the archive would exceed `--max_mib`, or `--max_files`
parts plus the manifest, the unfinished runs with the fewest steps are held
back one by one until it fits: each is packed as a stub, its config.json
and `carry_held.json` (HELD_FILE: its step and why), named on stderr and
in the manifest. launch/suite.py skips a workdir holding that file (its
state stays where it was packed) and counts it against `--jobs`, so a held
run is carried, and resumes, once the runs ahead of it have finished.

`unpack` checks the manifest, that every part is there with its size, and
the sha256 of the parts joined; it refuses (one line, status 2, nothing
written) a missing or damaged part and any member that is not a plain file
or folder under a relative path without `..`. It then merges run by run
into ROOT: a run's checkpoints/ and best/ are replaced by the carried
ones, its files overwritten, unless ROOT already holds a newer state of
that run (a later step, or finished), which is kept. The stub of a held
run is written only with `--held_stubs` (the machine that runs the suite:
launch/gpu_stretch.sh); elsewhere ROOT keeps what it has of that run, and
a run held back with no state in ROOT (its progress on the other machine
lost) is named and starts again. It prints what it restored.

Standard library only. Exit status: 0, or 2 with one line `carry: ...`.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import json
import math
import os
import posixpath
import shutil
import sys
import tarfile
import tempfile
from typing import Any, Iterable, Optional, Sequence

MANIFEST = 'carry.json'
ARCHIVE = 'carry.tar.gz'
FORMAT = 1
MIB = 1 << 20
PART_MIB = 15
CONFIG_FILE = 'config.json'
RESULTS_FILE = 'results.json'
# The stub of a run held back (launch/suite.py skips its workdir).
HELD_FILE = 'carry_held.json'
SKIPPED_FILES = ('lock',)
STEP_FOLDERS = ('checkpoints', 'best')
KEPT_FOLDERS = ('tensorboard',)
# Written by orbax when a step is finished.
FINISHED_STEP_MARK = '_CHECKPOINT_METADATA'
# launch/suite.py --spt: the pretraining run's folder in a job's workdir.
PRETRAIN_DIR = 'pretrain'
_CHUNK = 1 << 20


class CarryError(Exception):
  """A refusal, printed as one line."""


# ----------------------------------------------------------------- the runs


def find_workdirs(root: str) -> list[str]:
  """Workdirs (folders holding config.json) under `root`, relative, sorted.

  A workdir's own subfolders are not searched; hidden folders are skipped.
  """
  found = []
  for here, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
    if CONFIG_FILE in files and here != root:
      found.append(os.path.relpath(here, root).replace(os.sep, '/'))
      # The pretraining run of a self-pretraining job (launch/suite.py
      # --spt) lives inside the fine-tuning run's workdir.
      dirs[:] = [d for d in dirs if d == PRETRAIN_DIR]
  return found


def needed_for_fine_tuning(workdir: str) -> bool:
  """Whether `workdir` is the pretraining run of a fine-tuning run that
  has not finished (`launch/suite.py --spt`): that run starts from its
  newest checkpoint, which must then be carried even though the
  pretraining has finished."""
  parent = os.path.dirname(os.path.normpath(workdir))
  return (os.path.basename(os.path.normpath(workdir)) == PRETRAIN_DIR and
          not os.path.exists(os.path.join(parent, RESULTS_FILE)))


def steps_in(folder: str) -> list[int]:
  """Step folders (named by a number) in `folder`, newest first."""
  if not os.path.isdir(folder):
    return []
  return sorted((int(n) for n in os.listdir(folder)
                 if n.isdigit() and os.path.isdir(os.path.join(folder, n))),
                reverse=True)


def newest_step(folder: str) -> Optional[int]:
  """The newest step folder that orbax finished (else the newest one)."""
  steps = steps_in(folder)
  for step in steps:
    if os.path.exists(os.path.join(folder, str(step), FINISHED_STEP_MARK)):
      return step
  return steps[0] if steps else None


def _files_under(folder: str) -> Iterable[str]:
  for here, dirs, files in os.walk(folder):
    dirs.sort()
    for name in sorted(files):
      path = os.path.join(here, name)
      if os.path.isfile(path) and not os.path.islink(path):
        yield path


def run_state(entry: dict[str, Any]) -> str:
  """'finished' or 'step S of N' of a manifest entry."""
  if entry.get('finished'):
    return 'finished'
  total = entry.get('num_train_steps')
  return f'step {entry.get("step", 0)}' + (f' of {total}' if total else '')


def describe_run(root: str, run: str, finished_checkpoints: bool = False
                 ) -> tuple[dict[str, Any], list[str]]:
  """(manifest entry, files to pack relative to `root`) of one workdir."""
  workdir = os.path.join(root, run)
  finished = os.path.exists(os.path.join(workdir, RESULTS_FILE))
  entry: dict[str, Any] = {'run': run, 'finished': finished}
  try:
    with open(os.path.join(workdir, CONFIG_FILE)) as f:
      entry['num_train_steps'] = json.load(f).get('num_train_steps')
  except (OSError, ValueError):
    entry['num_train_steps'] = None
  step = newest_step(os.path.join(workdir, 'checkpoints'))
  entry['step'] = step or 0
  if os.path.exists(os.path.join(workdir, HELD_FILE)):  # A stub.
    try:
      with open(os.path.join(workdir, HELD_FILE)) as f:
        entry.update(step=int(json.load(f).get('step', 0)))
    except (OSError, ValueError, TypeError):
      pass
    paths = [os.path.join(workdir, n) for n in (CONFIG_FILE, HELD_FILE)]
    entry.update(held=True, bytes=sum(os.path.getsize(p) for p in paths))
    return entry, [os.path.relpath(p, root).replace(os.sep, '/')
                   for p in paths]
  paths = []
  for name in sorted(os.listdir(workdir)):
    path = os.path.join(workdir, name)
    if os.path.islink(path):
      continue
    if os.path.isfile(path):
      if name not in SKIPPED_FILES:
        paths.append(path)
    elif name in KEPT_FOLDERS:
      paths.extend(_files_under(path))
    elif name in STEP_FOLDERS and (
        finished_checkpoints or not finished or
        (name == 'checkpoints' and needed_for_fine_tuning(workdir))):
      for sub in sorted(os.listdir(path)):
        if os.path.isfile(os.path.join(path, sub)):
          paths.append(os.path.join(path, sub))
      kept = newest_step(path)
      if kept is not None:
        entry[name] = f'{name}/{kept}'
        paths.extend(_files_under(os.path.join(path, str(kept))))
  entry['bytes'] = sum(os.path.getsize(p) for p in paths)
  return entry, [os.path.relpath(p, root).replace(os.sep, '/')
                 for p in paths]


# --------------------------------------------------------------------- pack


def _write_archive(root: str, files: Sequence[str], path: str,
                   written: Optional[dict[str, bytes]] = None) -> None:
  """`files` (relative to `root`) and `written` ({name: content}) into a
  gzip tar at `path`."""
  with tarfile.open(path, 'w:gz', format=tarfile.PAX_FORMAT) as tar:
    for name in files:
      tar.add(os.path.join(root, name), arcname=name, recursive=False)
    for name, data in sorted((written or {}).items()):
      info = tarfile.TarInfo(name)
      info.size = len(data)
      info.mode = 0o644
      info.mtime = int(datetime.datetime.now().timestamp())
      tar.addfile(info, io.BytesIO(data))


def _old_carry_files(folder: str) -> list[str]:
  if not os.path.isdir(folder):
    return []
  return sorted(n for n in os.listdir(folder)
                if n == MANIFEST or n.startswith(ARCHIVE + '.'))


def pack(root: str, out_dir: str, part_mib: float = PART_MIB,
         max_mib: Optional[float] = None, max_files: Optional[int] = None,
         finished_checkpoints: bool = False) -> dict[str, Any]:
  """Writes the parts and the manifest of `root`'s runs; returns it."""
  if not os.path.isdir(root):
    raise CarryError(f'{root} is not a folder')
  part_bytes = int(part_mib * MIB)
  if part_bytes < 1:
    raise CarryError('--part_mib must be > 0')
  limit = None if max_mib is None else int(max_mib * MIB)
  if max_files is not None:
    if max_files < 2:
      raise CarryError('--max_files must be >= 2 (a part and the manifest)')
    by_files = (max_files - 1) * part_bytes
    limit = by_files if limit is None else min(limit, by_files)
  runs = {}
  for run in find_workdirs(root):
    runs[run] = describe_run(root, run, finished_checkpoints)
  held = []
  stubs: dict[str, bytes] = {}
  os.makedirs(out_dir, exist_ok=True)
  for name in _old_carry_files(out_dir):
    os.remove(os.path.join(out_dir, name))
  fd, tmp = tempfile.mkstemp(prefix='.carry-', suffix='.tar.gz', dir=out_dir)
  os.close(fd)
  try:
    while True:
      files = [f for _, names in runs.values() for f in names]
      _write_archive(root, files, tmp, stubs)
      size = os.path.getsize(tmp)
      if limit is None or size <= limit:
        break
      # Over the limit: hold back the unfinished run with the fewest steps.
      candidates = [e for e, _ in runs.values()
                    if not e['finished'] and not e.get('held')]
      if not candidates:
        raise CarryError(
            f'the archive takes {size / MIB:.1f} MiB with every unfinished '
            f'run held back, over the limit of {limit / MIB:.1f} MiB; pack '
            'without --finished_checkpoints or raise --max_mib/--max_files')
      entry = min(candidates, key=lambda e: (e['step'], e['run']))
      why = (f'the archive took {size / MIB:.1f} MiB, over the limit of '
             f'{limit / MIB:.1f} MiB')
      stub = f'{entry["run"]}/{HELD_FILE}'
      stubs[stub] = (json.dumps({'run': entry['run'], 'step': entry['step'],
                                 'why': why}, indent=1) + '\n').encode()
      runs[entry['run']] = (
          dict(entry, held=True, why=why,
               bytes=len(stubs[stub]) + os.path.getsize(
                   os.path.join(root, entry['run'], CONFIG_FILE))),
          [f'{entry["run"]}/{CONFIG_FILE}'])
      held.append(entry['run'])
      print(f'carry: HELD BACK {entry["run"]} (step {entry["step"]}, '
            f'{entry["bytes"] / MIB:.1f} MiB): {why}; packed as a stub that '
            'the suite skips, its state stays in ROOT', file=sys.stderr,
            flush=True)
    parts = []
    whole = hashlib.sha256()
    with open(tmp, 'rb') as f:
      for index in range(max(1, math.ceil(size / part_bytes))):
        name = f'{ARCHIVE}.{index:03d}'
        h = hashlib.sha256()
        left = part_bytes
        with open(os.path.join(out_dir, name), 'wb') as part:
          while left:
            block = f.read(min(_CHUNK, left))
            if not block:
              break
            part.write(block)
            h.update(block)
            whole.update(block)
            left -= len(block)
        parts.append({'file': name, 'bytes': part_bytes - left,
                      'sha256': h.hexdigest()})
  finally:
    os.remove(tmp)
  manifest = {
      'format': FORMAT, 'tool': 'launch/carry.py',
      'created': datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%dT%H:%M:%SZ'),
      'archive': ARCHIVE, 'bytes': size, 'sha256': whole.hexdigest(),
      'part_bytes': part_bytes, 'parts': parts,
      'runs': [entry for entry, _ in runs.values()],
      'held': held}
  with open(os.path.join(out_dir, MANIFEST), 'w') as f:
    json.dump(manifest, f, indent=1)
    f.write('\n')
  return manifest


# ------------------------------------------------------------------- unpack


class _Joined(io.RawIOBase):
  """The parts, read one after another as one stream."""

  def __init__(self, paths: Sequence[str]):
    super().__init__()
    self._paths = list(paths)
    self._file = None

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    while True:
      if self._file is None:
        if not self._paths:
          return 0
        self._file = open(self._paths.pop(0), 'rb')
      n = self._file.readinto(buffer)
      if n:
        return n
      self._file.close()
      self._file = None

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
    super().close()


def read_manifest(in_dir: str) -> dict[str, Any]:
  path = os.path.join(in_dir, MANIFEST)
  if not os.path.exists(path):
    raise CarryError(f'no {MANIFEST} in {in_dir}: nothing packed there '
                     '(launch/carry.py pack writes it)')
  try:
    with open(path) as f:
      manifest = json.load(f)
  except ValueError as e:
    raise CarryError(f'{path} is not valid JSON ({e})') from None
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    raise CarryError(f'{path}: not a carry manifest of format {FORMAT}')
  return manifest


def _safe_name(name: str) -> bool:
  if not name or name.startswith('/') or '\\' in name or ':' in name.split(
      '/')[0]:
    return False
  return '..' not in posixpath.normpath(name).split('/') and all(
      part not in ('', '.', '..') for part in name.rstrip('/').split('/'))


def verify(in_dir: str) -> tuple[dict[str, Any], list[str]]:
  """(manifest, part paths) once every part and every member checks out."""
  manifest = read_manifest(in_dir)
  parts = manifest.get('parts') or []
  paths = []
  for i, part in enumerate(parts):
    name = part['file']
    if not _safe_name(name) or '/' in name:
      raise CarryError(f'{MANIFEST} names a part {name!r} outside {in_dir}')
    path = os.path.join(in_dir, name)
    if not os.path.exists(path):
      raise CarryError(
          f'part {name} ({i + 1} of {len(parts)} in {MANIFEST}) is missing '
          f'from {in_dir}: bring back every part')
    size = os.path.getsize(path)
    if size != part['bytes']:
      raise CarryError(f'part {name} has {size} bytes, {MANIFEST} says '
                       f'{part["bytes"]}: an incomplete copy')
    paths.append(path)
  whole = hashlib.sha256()
  damaged = []
  for part, path in zip(parts, paths):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
      for block in iter(lambda: f.read(_CHUNK), b''):
        h.update(block)
        whole.update(block)
    if h.hexdigest() != part.get('sha256'):
      damaged.append(part['file'])
  if whole.hexdigest() != manifest.get('sha256') or damaged:
    raise CarryError(
        f'sha256 of the parts in {in_dir} differs from {MANIFEST} '
        f'(damaged: {", ".join(damaged) or "the whole"}); copy them again')
  runs = [r['run'] for r in manifest.get('runs', [])]
  for run in runs:
    if not _safe_name(run):
      raise CarryError(f'refusing unsafe run path {run!r} in {MANIFEST}')
  with tarfile.open(fileobj=io.BufferedReader(_Joined(paths)),
                    mode='r|gz') as tar:
    for member in tar:
      if not (member.isfile() or member.isdir()) or not _safe_name(
          member.name):
        raise CarryError(
            f'refusing member {member.name!r} of the archive (only plain '
            'files and folders under relative paths without ".." are '
            'extracted); nothing extracted')
      if not any(member.name == r or member.name.startswith(r + '/')
                 for r in runs):
        raise CarryError(f'refusing member {member.name!r}: in no run that '
                         f'{MANIFEST} lists; nothing extracted')
  return manifest, paths


def _local_state(workdir: str) -> tuple[bool, int]:
  return (os.path.exists(os.path.join(workdir, RESULTS_FILE)),
          newest_step(os.path.join(workdir, 'checkpoints')) or 0)


def unpack(in_dir: str, root: str, held_stubs: bool = False) -> list[str]:
  """Merges the carried runs into `root`; returns the lines it printed.

  A held run's stub is written (its HELD_FILE added to the workdir, which
  the suite then skips) only with `held_stubs`, on the machine that runs
  the suite; elsewhere ROOT keeps what it has of that run.
  """
  manifest, paths = verify(in_dir)
  os.makedirs(root, exist_ok=True)
  said = []

  def say(text: str) -> None:
    said.append(text)
    print(text, flush=True)

  say(f'carry: {len(manifest["runs"])} run(s) from {in_dir} '
      f'({manifest["bytes"] / MIB:.1f} MiB in {len(paths)} part(s), '
      'sha256 ok)')
  staging = tempfile.mkdtemp(prefix='.carry-unpack-', dir=root)
  try:
    with tarfile.open(fileobj=io.BufferedReader(_Joined(paths)),
                      mode='r|gz') as tar:
      if hasattr(tarfile, 'data_filter'):
        tar.extractall(staging, filter='data')
      else:  # Python < 3.11.4; members were checked by verify().
        tar.extractall(staging)
    for entry in manifest['runs']:
      run, step = entry['run'], entry.get('step', 0)
      state = run_state(entry)
      target = os.path.join(root, run)
      if entry.get('held'):
        if held_stubs:
          os.makedirs(target, exist_ok=True)
          shutil.copyfile(os.path.join(staging, run, HELD_FILE),
                          os.path.join(target, HELD_FILE))
          if not os.path.exists(os.path.join(target, CONFIG_FILE)):
            shutil.copyfile(os.path.join(staging, run, CONFIG_FILE),
                            os.path.join(target, CONFIG_FILE))
          say(f'held {run}: its state (step {step}) stays where it was '
              'packed; the suite skips it')
        elif os.path.exists(os.path.join(target, CONFIG_FILE)):
          say(f'kept {run}: held back from the carry at step {step}; '
              f'step {_local_state(target)[1]} here')
        else:
          say(f'not carried {run}: held back at step {step} for lack of '
              'room, its state there is lost; it starts again')
        continue
      done_here, step_here = _local_state(target)
      if done_here and not entry.get('finished'):
        say(f'kept {run}: finished here; the carried state is at {state}')
        continue
      if step_here > step and not entry.get('finished'):
        say(f'kept {run}: step {step_here} here; the carried state is at '
            f'{state}')
        continue
      source = os.path.join(staging, run)
      if os.path.exists(os.path.join(target, HELD_FILE)):
        os.remove(os.path.join(target, HELD_FILE))
      for name in STEP_FOLDERS:
        if os.path.isdir(os.path.join(source, name)):
          shutil.rmtree(os.path.join(target, name), ignore_errors=True)
      shutil.copytree(source, target, dirs_exist_ok=True)
      say(f'restored {run}: {state}')
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return said


# ---------------------------------------------------------------------- CLI


def _summary(manifest: dict[str, Any], out_dir: str) -> str:
  unfinished = [r for r in manifest['runs'] if not r['finished']]
  held = f', {len(manifest["held"])} held back' if manifest['held'] else ''
  return (f'carry: {len(manifest["runs"])} run(s) '
          f'({len(unfinished)} unfinished{held}) in {len(manifest["parts"])} '
          f'part(s) of {manifest["bytes"] / MIB:.1f} MiB in all, '
          f'{out_dir}/{MANIFEST}')


def main(argv: Sequence[str]) -> int:
  p = argparse.ArgumentParser(
      prog='launch/carry.py', description=__doc__.split('\n\n')[0],
      epilog=__doc__.split('\n\n', 2)[2],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest='verb', required=True)
  pk = sub.add_parser('pack', help='ROOT OUT_DIR: pack the runs under ROOT')
  pk.add_argument('root')
  pk.add_argument('out_dir')
  pk.add_argument('--part_mib', type=float, default=PART_MIB,
                  help='largest part, MiB (default %(default)s)')
  pk.add_argument('--max_mib', type=float, default=None,
                  help='largest archive, MiB; beyond it the unfinished runs '
                  'with the fewest steps are held back (stubs)')
  pk.add_argument('--max_files', type=int, default=None,
                  help='most files written (parts plus the manifest); '
                  'beyond it runs are held back as for --max_mib')
  pk.add_argument('--finished_checkpoints', action='store_true',
                  help='also pack the checkpoints of finished runs')
  up = sub.add_parser('unpack', help='IN_DIR ROOT: check and merge')
  up.add_argument('in_dir')
  up.add_argument('root')
  up.add_argument('--held_stubs', action='store_true',
                  help='write the stubs of held runs (on the machine that '
                  'runs the suite, which skips them)')
  args = p.parse_args(argv)
  try:
    if args.verb == 'pack':
      manifest = pack(args.root, args.out_dir, args.part_mib, args.max_mib,
                      args.max_files, args.finished_checkpoints)
      for entry in manifest['runs']:
        print(f'{"held" if entry.get("held") else "packed"} {entry["run"]}: '
              f'{run_state(entry)}, {entry["bytes"] / MIB:.1f} MiB',
              flush=True)
      print(_summary(manifest, args.out_dir), flush=True)
      return 0
    unpack(args.in_dir, args.root, args.held_stubs)
    return 0
  except CarryError as e:
    print(f'carry: {e}', file=sys.stderr, flush=True)
    return 2


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
