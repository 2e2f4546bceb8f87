r"""Turns what a user downloads into the folder every task config reads.

  python -m lra_msmra.data.prepare --lra_release PATH --out DIR [--tfds]

What to download (docs/protocol.md §2):

* The LRA release, `lra_release.gz` (a gzipped tar, ~8 GB, ~19 GB
  unpacked) from https://storage.googleapis.com/long-range-arena/
  lra_release.gz. `--lra_release` takes the archive itself (it is unpacked
  into `DIR/release/`) or a folder where it was unpacked (`tar xvf`), in
  either layout seen in the wild: nested (`lra_release/lra_release/
  {listops-1000,tsv_data,pathfinder*}` plus top-level copies of
  `listops-1000` and `pathfinder128`) or flat (the task folders directly
  under one folder).
* IMDb and CIFAR-10 are not in the release; they come from TFDS. `--tfds`
  downloads and prepares `imdb_reviews` and `cifar10` into
  `DIR/tensorflow_datasets/` (needs internet access, ~200 MB, and the
  optional TensorFlow and TFDS packages: `pip install -e .[tfds]`; without
  them the command stops at once, saying so). Nothing else here needs
  TensorFlow.

What it writes (`DIR/`):

  listops-1000/, tsv_data/, pathfinder32/ ... pathfinder256/
      symbolic links to the chosen copy of each release folder
  release/                 the unpacked archive (only when given the archive)
  tensorflow_datasets/     with --tfds
  prepared.json            where each folder comes from, counts per split,
                           duplicate copies found (P20)

Then point every task's config at it: `--config.data_dir=DIR` (ListOps also
takes `DIR/listops-1000` directly).

Generated data instead of the release (docs/protocol.md §6, §7.3):

  python -m lra_msmra.data.prepare --generate_listops --out DIR
  python -m lra_msmra.data.prepare --generate_pathfinder --out DIR \
      [--workers N] [--pathfinder_num_examples N] [--pathfinder_sets ...]

`--generate_listops` writes `listops-1000/`; `--generate_pathfinder` writes
`pathfinder32/{curv_baseline,curv_contour_length_9,curv_contour_length_14}`
and `pathfinder128/curv_contour_length_14` (200,000 images each, as the
release) in the release layout, with our seeded implementations of the
official generators. Each folder holds a `generator.json` stamp (settings,
seed, time taken, load average, label counts), and runs on it record the
data as generated. An interrupted `--generate_pathfinder` resumes where it
stopped when run again with the same settings.

Checks: the files of every task in `--tasks` must exist (the command fails
naming each missing path); per split it prints the number of examples, and
for Pathfinder the empty PNGs that the pipeline will skip (P21). Every other
Pathfinder PNG is decoded as training will decode it; the command fails
naming each file that does not decode to an R x R single-channel image
(the first MAX_LISTED of them, then their number).

Duplicates (P20): the nested archive holds two `pathfinder128` folders, and
nobody documents which one is right (a ResNet stays at chance on one of
them, LRA issue #38); the nested archive also holds two `listops-1000`
folders. We use the copy that sits with the other task folders
(`--pathfinder128_copy main`) and report whether the other copy holds
identical files (names, sizes, then bytes; this reads both copies once);
`--pathfinder128_copy extra` selects the other one.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import sys
import tarfile
from typing import Any, Optional, Sequence

from lra_msmra.data import listops
from lra_msmra.data import pathfinder
from lra_msmra.data import pathfinder_generator
from lra_msmra.data import retrieval
from lra_msmra.data import tfds_io

LISTOPS = 'listops-1000'
LISTOPS_SPLITS = ('train', 'val', 'test')
COMPONENT_RE = re.compile(
    r'^(listops-1000|tsv_data|pathfinder(32|64|128|256))$')
TASKS = ('listops', 'retrieval', 'pathfinder', 'pathx')
# Release folder each task needs.
TASK_FOLDERS = {'listops': LISTOPS, 'retrieval': retrieval.SUBDIR,
                'pathfinder': 'pathfinder32', 'pathx': 'pathfinder128'}
TFDS_DATASETS = ('imdb_reviews', 'cifar10')
MANIFEST = 'prepared.json'
# How deep below --lra_release the task folders may sit.
MAX_DEPTH = 4
# Bad files named one by one in an error; the rest are counted.
MAX_LISTED = 20


class PrepareError(Exception):
  """A problem with the user's data, explained in the message."""


def find_copies(root: str, skip: Optional[str] = None
                ) -> dict[str, list[str]]:
  """Release task folders under `root`: name -> every path holding one.

  Args:
    root: where to look (up to MAX_DEPTH levels down).
    skip: a folder not to enter (the output folder, which holds links).
  """
  found: dict[str, list[str]] = {}
  skip = os.path.realpath(skip) if skip else None

  def walk(path: str, depth: int) -> None:
    try:
      entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
      return
    for entry in entries:
      if not entry.is_dir() or os.path.realpath(entry.path) == skip:
        continue
      if COMPONENT_RE.match(entry.name):
        found.setdefault(entry.name, []).append(entry.path)
      elif depth < MAX_DEPTH:
        walk(entry.path, depth + 1)

  if COMPONENT_RE.match(os.path.basename(os.path.normpath(root))):
    found[os.path.basename(os.path.normpath(root))] = [root]
  else:
    walk(root, 1)
  return found


def choose_copies(found: dict[str, list[str]], pathfinder128_copy: str
                  ) -> tuple[dict[str, str], dict[str, list[str]]]:
  """Picks one copy per folder; returns (chosen, the other copies).

  The main copy of a folder is the one whose parent holds the most task
  folders (the inner `lra_release` of the nested layout).
  """
  parents: dict[str, int] = {}
  for paths in found.values():
    for p in paths:
      parent = os.path.dirname(p)
      parents[parent] = parents.get(parent, 0) + 1
  chosen, others = {}, {}
  for name, paths in found.items():
    ranked = sorted(paths, key=lambda p: (-parents[os.path.dirname(p)], p))
    pick = ranked[0]
    if name == 'pathfinder128' and pathfinder128_copy == 'extra':
      if len(ranked) < 2:
        raise PrepareError('--pathfinder128_copy extra: the release has only '
                           f'one pathfinder128 folder ({ranked[0]}).')
      pick = ranked[1]
    chosen[name] = pick
    others[name] = [p for p in ranked if p != pick]
  return chosen, others


def _file_sizes(folder: str) -> dict[str, int]:
  sizes = {}
  for dirpath, _, files in os.walk(folder):
    for f in files:
      path = os.path.join(dirpath, f)
      sizes[os.path.relpath(path, folder)] = os.path.getsize(path)
  return sizes


def compare_copies(a: str, b: str) -> dict[str, Any]:
  """Compares two copies of a folder file by file (P20).

  Names and sizes first; files that agree on both are compared byte by byte.
  """
  sa, sb = _file_sizes(a), _file_sizes(b)
  only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
  common = sorted(set(sa) & set(sb))
  size_differs = [k for k in common if sa[k] != sb[k]]
  content_differs = [
      k for k in common if sa[k] == sb[k] and not filecmp.cmp(
          os.path.join(a, k), os.path.join(b, k), shallow=False)]
  differ = only_a + only_b + size_differs + content_differs
  return {'used': a, 'other': b, 'files_used': len(sa), 'files_other': len(sb),
          'only_in_used': len(only_a), 'only_in_other': len(only_b),
          'size_differs': len(size_differs),
          'content_differs': len(content_differs),
          'identical': not differ, 'examples': differ[:5]}


def missing_files(name: str, folder: Optional[str]) -> list[str]:
  """What a task folder lacks (relative to the release), empty if complete."""
  if folder is None:
    return [f'{name}/']
  if name == LISTOPS:
    need = [f'basic_{s}.tsv' for s in LISTOPS_SPLITS]
  elif name == retrieval.SUBDIR:
    need = [os.path.basename(retrieval.split_path('', s))
            for s in retrieval.SPLITS.values()]
  else:
    need = []
    for sub in pathfinder.DIFFICULTIES.values():
      need += [f'{sub}/imgs/', f'{sub}/metadata/']
  return [f'{name}/{n}' for n in need
          if not os.path.exists(os.path.join(folder, n))]


def _count_lines(path: str) -> int:
  with open(path, 'rb') as f:
    return sum(1 for _ in f)


def count_examples(name: str, folder: str) -> dict[str, Any]:
  """Examples per split of one release folder."""
  if name == LISTOPS:
    return {s: _count_lines(os.path.join(folder, f'basic_{s}.tsv')) - 1
            for s in LISTOPS_SPLITS}  # Minus the header.
  if name == retrieval.SUBDIR:
    return {s: _count_lines(retrieval.split_path(folder, s))
            for s in retrieval.SPLITS.values()}
  resolution = int(name[len('pathfinder'):])
  splits = {}
  for difficulty, sub in pathfinder.DIFFICULTIES.items():
    path = os.path.join(folder, sub)
    examples = pathfinder.read_metadata(path)
    for split, exs in pathfinder.split_examples(examples, difficulty).items():
      splits[difficulty, split] = [os.path.join(path, e.image) for e in exs]
  # Decoded as training will, so a bad file fails here, not mid-run; all in
  # one call, which spreads the files over its threads.
  empty, problems = pathfinder.check_pngs(
      [p for paths in splits.values() for p in paths], resolution)
  empty = set(empty)
  counts = {}
  for (difficulty, split), paths in splits.items():
    num_empty = sum(p in empty for p in paths)
    counts.setdefault(difficulty, {})[split] = {
        'images': len(paths) - num_empty, 'empty_pngs': num_empty}
  if problems:
    shown = problems[:MAX_LISTED]
    more = len(problems) - len(shown)
    raise PrepareError(
        f'{len(problems)} image(s) of {folder} cannot be read as '
        f'{resolution}x{resolution} single-channel PNGs; training would stop '
        'on them:\n  ' + '\n  '.join(shown) +
        (f'\n  ... and {more} more.' if more else '') +
        '\nDownload and unpack lra_release.gz again (or limit --tasks).')
  return counts


def unpack(archive: str, dest: str) -> None:
  """Unpacks the release tarball into `dest` (no paths outside it)."""
  print(f'Unpacking {archive} into {dest} ...', flush=True)
  os.makedirs(dest, exist_ok=True)
  try:
    with tarfile.open(archive, 'r:*') as tar:
      tar.extractall(dest, filter='data')
  except (tarfile.TarError, OSError, EOFError) as e:
    raise PrepareError(f'{archive} is not a readable tar archive ({e}). '
                       'Download lra_release.gz again.') from None


def _link(target: str, link: str) -> None:
  if os.path.islink(link):
    os.remove(link)
  elif os.path.exists(link):
    raise PrepareError(f'{link} exists and is not a link from an earlier '
                       'run; choose an empty --out folder.')
  os.symlink(os.path.abspath(target), link)


def prepare_release(release: str, out: str, tasks: Sequence[str],
                    pathfinder128_copy: str = 'main') -> dict[str, Any]:
  """Validates the release, links its folders into `out`, counts examples."""
  if not os.path.exists(release):
    raise PrepareError(f'--lra_release {release} does not exist.')
  source = release
  if os.path.isfile(release):
    source = os.path.join(out, 'release')
    unpack(release, source)
  found = find_copies(source, skip=out)
  chosen, others = choose_copies(found, pathfinder128_copy)
  missing = []
  for task in tasks:
    name = TASK_FOLDERS[task]
    missing += missing_files(name, chosen.get(name))
  if missing:
    raise PrepareError(
        f'The LRA release at {release} lacks what {", ".join(tasks)} '
        'need:\n  ' + '\n  '.join(missing) + '\nDownload lra_release.gz '
        '(https://storage.googleapis.com/long-range-arena/lra_release.gz), '
        'unpack it completely, or limit --tasks.')
  report: dict[str, Any] = {'lra_release': os.path.abspath(release),
                            'folders': {}, 'duplicates': {}}
  for name in sorted(chosen):
    complete = not missing_files(name, chosen[name])
    entry = {'source': chosen[name], 'complete': complete}
    if complete:
      print(f'Checking {chosen[name]} ...', flush=True)
      _link(chosen[name], os.path.join(out, name))
      entry['examples'] = count_examples(name, chosen[name])
    report['folders'][name] = entry
    for other in others[name]:
      report['duplicates'].setdefault(name, []).append(
          compare_copies(chosen[name], other))
  return report


def _import_tfds():
  """TFDS, or `tfds_io.ExtraMissing` naming the install command."""
  return tfds_io.import_extra('tensorflow_datasets',
                              'Preparing IMDb and CIFAR-10 (--tfds)')


def prepare_tfds(out: str) -> dict[str, Any]:
  """Downloads and prepares IMDb and CIFAR-10 with TFDS.

  Raises:
    tfds_io.ExtraMissing: TensorFlow or TFDS is not installed.
  """
  tfds = _import_tfds()
  data_dir = os.path.join(out, tfds_io.TFDS_SUBDIR)
  report = {}
  for name in TFDS_DATASETS:
    print(f'TFDS: preparing {name} in {data_dir} ...', flush=True)
    builder = tfds.builder(name, data_dir=data_dir)
    builder.download_and_prepare()
    report[name] = {s: info.num_examples
                    for s, info in builder.info.splits.items()}
  return report


def _print_report(report: dict[str, Any], out: str) -> None:
  for name, entry in report.get('release', {}).get('folders', {}).items():
    if not entry['complete']:
      print(f'{name}: incomplete, not linked ({entry["source"]})')
      continue
    print(f'{name}: {entry["source"]}')
    for split, n in entry['examples'].items():
      if isinstance(n, dict):  # Pathfinder: per difficulty, per split.
        n = ', '.join(f'{s} {c["images"]} (+{c["empty_pngs"]} empty PNG)'
                      for s, c in n.items())
      print(f'  {split}: {n}')
  for name, copies in report.get('release', {}).get('duplicates', {}).items():
    for c in copies:
      same = ('identical files' if c['identical'] else
              f'DIFFERENT: {c["only_in_used"]} files only in the used copy, '
              f'{c["only_in_other"]} only in the other, '
              f'{c["size_differs"] + c["content_differs"]} with other '
              'contents')
      print(f'{name}: a second copy exists at {c["other"]}: {same}. '
            f'Using {c["used"]}.')
  gen = report.get('listops_generated')
  if gen:
    print(f'{LISTOPS}: generated (seed {gen["settings"]["seed"]}) in '
          f'{gen["generation_seconds"]:.0f} s: ' + ', '.join(
              f'{s} {v["examples"]}' for s, v in gen['splits'].items()))
  for name, stamp in report.get('pathfinder_generated', {}).items():
    spec, details = stamp['spec'], stamp['details']
    print(f'{name}: generated (seed {spec["seed"]}), '
          f'{spec["num_examples"]} images, labels 0/1 '
          f'{details["labels"]["0"]}/{details["labels"]["1"]}, in '
          f'{details["generation_seconds"]:.0f} s with '
          f'{details["workers"]} worker(s)')
  for name, splits in report.get('tfds', {}).items():
    print(f'{name}: ' + ', '.join(f'{s} {n}' for s, n in splits.items()))
  tasks = prepared_tasks(report)
  if not tasks:
    print(f'\nWrote {os.path.join(out, MANIFEST)}; no task\'s data is '
          'complete.')
    return
  hint = f'--config.data_dir={out}'
  if 'listops' in tasks:
    hint += f' (ListOps: --config.data_dir={os.path.join(out, LISTOPS)})'
  print(f'\nWrote {os.path.join(out, MANIFEST)}. Use {hint} with the '
        'configs in ' + ', '.join(f'configs/{t}/' for t in tasks) + '.')


def prepared_tasks(report: dict[str, Any]) -> list[str]:
  """The tasks (config folders) whose data `report` says was prepared."""
  folder_task = {folder: task for task, folder in TASK_FOLDERS.items()}
  found = {folder_task.get(name) for name, entry in
           report.get('release', {}).get('folders', {}).items()
           if entry['complete']}
  found |= {{'imdb_reviews': 'text', 'cifar10': 'image'}.get(name)
            for name in report.get('tfds', {})}
  if report.get('listops_generated'):
    found.add('listops')
  found |= {folder_task.get(name.split('/')[0])
            for name in report.get('pathfinder_generated', {})}
  order = ('listops', 'text', 'retrieval', 'image', 'pathfinder', 'pathx')
  return [t for t in order if t in found]


def generate_listops(out: str, seed: int, **settings: int) -> dict[str, Any]:
  """Writes `out/listops-1000/basic_*.tsv` with our generator (official
  settings unless `settings` override them); returns its `generator.json`
  (settings, time, label histograms)."""
  folder = os.path.join(out, LISTOPS)
  if os.path.islink(folder) or (os.path.exists(folder) and
                                listops.read_stamp(folder) is None):
    raise PrepareError(f'{folder} already holds release data; choose another '
                       '--out.')
  print(f'Generating ListOps (seed {seed}) into {folder}: a few minutes.',
        flush=True)
  listops.generate_dataset(folder, seed=seed, **settings)
  return listops.read_stamp(folder)


# The sets --generate_pathfinder writes: (resolution, difficulty); LRA's
# Pathfinder is 32/hard, Path-X 128/hard.
PATHFINDER_SETS = ((32, 'easy'), (32, 'intermediate'), (32, 'hard'),
                   (128, 'hard'))


def parse_pathfinder_sets(text: str) -> list[tuple[int, str]]:
  """'32/hard,128/hard' -> [(32, 'hard'), (128, 'hard')]."""
  sets = []
  for item in text.split(','):
    res, _, difficulty = item.strip().partition('/')
    if (not res.isdigit() or (int(res), difficulty) not in
        PATHFINDER_SETS):
      valid = ','.join(f'{r}/{d}' for r, d in PATHFINDER_SETS)
      raise ValueError(f'--pathfinder_sets: {item.strip()!r} is not one of '
                       f'{valid}.')
    sets.append((int(res), difficulty))
  return sets


def generate_pathfinder(out: str, sets: Sequence[tuple[int, str]],
                        num_examples: int, seed: int, workers: int,
                        pathx_distractors: str = 'release'
                        ) -> dict[str, Any]:
  """Writes Pathfinder difficulty folders with our seeded generator (LRA's
  settings); returns each folder's `generator.json` (settings, time,
  label counts), keyed by `pathfinder<R>/<folder>`."""
  report = {}
  for resolution, difficulty in sets:
    top = os.path.join(out, f'pathfinder{resolution}')
    folder = pathfinder.folder_path(out, resolution, difficulty)
    if os.path.islink(top) or (os.path.isdir(folder) and
                               pathfinder.read_stamp(folder) is None and
                               not os.path.exists(os.path.join(
                                   folder, pathfinder.PROGRESS_FILE))
                               and os.listdir(folder)):
      raise PrepareError(f'{folder} already holds release data; choose '
                         'another --out.')
    print(f'Generating {num_examples} Pathfinder images (seed {seed}) into '
          f'{folder} with {workers} worker(s) ...', flush=True)
    pathfinder.generate_dataset(
        out, resolution=resolution, difficulty=difficulty,
        num_examples=num_examples, seed=seed, workers=workers,
        pathx_distractors=pathx_distractors, log=print)
    report[os.path.relpath(folder, out)] = pathfinder.read_stamp(folder)
  return report


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = argparse.ArgumentParser(
      prog='python -m lra_msmra.data.prepare',
      description='Validate the LRA release (and optionally fetch IMDb and '
      'CIFAR-10 with TFDS) into one folder that the configs read.')
  p.add_argument('--lra_release', help='lra_release.gz or the folder it was '
                 'unpacked into.')
  p.add_argument('--out', required=True, help='Folder to write.')
  p.add_argument('--tfds', action='store_true', help='Also download and '
                 'prepare imdb_reviews and cifar10 with TFDS (needs the '
                 'optional install: pip install -e .[tfds]).')
  p.add_argument('--generate_listops', action='store_true', help='Write '
                 'ListOps (96,000/2,000/2,000 expressions, the official '
                 'generator settings) into DIR/listops-1000 with our seeded '
                 'implementation of the LRA generator, instead of taking it '
                 'from the release. Results record it as generated data.')
  p.add_argument('--listops_seed', type=int, default=0,
                 help='Seed of --generate_listops.')
  p.add_argument('--generate_pathfinder', action='store_true', help='Write '
                 'pathfinder32 (curv_baseline, curv_contour_length_9, '
                 'curv_contour_length_14) and pathfinder128 '
                 '(curv_contour_length_14, Path-X) into DIR with our seeded '
                 'implementation of the Pathfinder generator and LRA\'s '
                 'settings, in the release layout, instead of taking them '
                 'from the release. Results record them as generated data.')
  p.add_argument('--pathfinder_sets',
                 default=','.join(f'{r}/{d}' for r, d in PATHFINDER_SETS),
                 help='Comma-separated resolution/difficulty sets of '
                 '--generate_pathfinder (default: all four).')
  p.add_argument('--pathfinder_num_examples', type=int,
                 default=pathfinder.RELEASE_EXAMPLES,
                 help='Images per set of --generate_pathfinder (default: '
                 'the release\'s 200,000; fewer for tests and timing).')
  p.add_argument('--pathfinder_seed', type=int, default=0,
                 help='Seed of --generate_pathfinder.')
  p.add_argument('--pathx_distractors', default='release',
                 choices=sorted(pathfinder_generator.PATHX_DISTRACTORS),
                 help='Path-X distractor snakes: as in the released data '
                 '(70 / distractor length, LRA issue #38; default) or as '
                 'documented in LRA\'s builder (35 / distractor length).')
  p.add_argument('--workers', type=int, default=os.cpu_count() or 1,
                 help='Processes of --generate_pathfinder (default: one per '
                 'CPU).')
  p.add_argument('--tasks', default=','.join(TASKS),
                 help=f'Comma-separated subset of {",".join(TASKS)} whose '
                 'files must be present (default: all).')
  p.add_argument('--pathfinder128_copy', choices=('main', 'extra'),
                 default='main', help='Which pathfinder128 copy to use when '
                 'the archive has two (P20).')
  args = p.parse_args(argv)
  tasks = [t.strip() for t in args.tasks.split(',') if t.strip()]
  unknown = sorted(set(tasks) - set(TASKS))
  if unknown:
    p.error(f'--tasks: unknown {unknown}; valid: {list(TASKS)}.')
  if not (args.lra_release or args.tfds or args.generate_listops or
          args.generate_pathfinder):
    p.error('Give --lra_release, --tfds, --generate_listops, '
            '--generate_pathfinder or several.')
  if args.lra_release and args.generate_listops and 'listops' in tasks:
    p.error('--generate_listops writes the listops-1000 folder the release '
            'also provides: leave listops out of --tasks, or drop one.')
  if args.lra_release and args.generate_pathfinder and (
      {'pathfinder', 'pathx'} & set(tasks)):
    p.error('--generate_pathfinder writes the pathfinder folders the release '
            'also provides: leave pathfinder and pathx out of --tasks, or '
            'drop one.')
  if args.workers < 1:
    p.error(f'--workers={args.workers} must be at least 1.')
  if args.pathfinder_num_examples < 1:
    p.error(f'--pathfinder_num_examples={args.pathfinder_num_examples} must '
            'be at least 1.')
  if args.pathfinder_seed < 0:
    p.error(f'--pathfinder_seed={args.pathfinder_seed} must be at least 0.')
  try:
    pathfinder_sets = parse_pathfinder_sets(args.pathfinder_sets)
  except ValueError as e:
    p.error(str(e))
  if args.tfds:
    try:
      _import_tfds()  # Before any other work, which can take long.
    except tfds_io.ExtraMissing as e:
      print(f'error: {e}', file=sys.stderr)
      return 1
  os.makedirs(args.out, exist_ok=True)
  report: dict[str, Any] = {}
  try:
    if args.lra_release:
      report['release'] = prepare_release(args.lra_release, args.out, tasks,
                                          args.pathfinder128_copy)
    if args.tfds:
      report['tfds'] = prepare_tfds(args.out)
    if args.generate_listops:
      report['listops_generated'] = generate_listops(args.out,
                                                     args.listops_seed)
    if args.generate_pathfinder:
      report['pathfinder_generated'] = generate_pathfinder(
          args.out, pathfinder_sets, args.pathfinder_num_examples,
          args.pathfinder_seed, args.workers, args.pathx_distractors)
  except (PrepareError, FileNotFoundError, ValueError,
          tfds_io.ExtraMissing) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  with open(os.path.join(args.out, MANIFEST), 'w') as f:
    json.dump(report, f, indent=2)
  _print_report(report, args.out)
  return 0


if __name__ == '__main__':
  sys.exit(main())
