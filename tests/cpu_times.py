"""Sums the CPU seconds that `pytest --cpu-times PATH` recorded.

    python -m tests.cpu_times PATH [--top N]

prints the total, the seconds per test file and the N most expensive tests
(all their phases and parameters together), as markdown tables.
"""

import argparse
import collections
import json
import sys


def load(path: str) -> list[tuple[str, str, float]]:
  records = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      try:
        nodeid, phase, seconds = json.loads(line)
      except ValueError as e:
        raise SystemExit(f'{path}:{number}: not a [test id, phase, seconds] '
                         f'line ({e}); was it written by --cpu-times?')
      records.append((nodeid, phase, float(seconds)))
  return records


def summary(records, top: int = 20) -> str:
  files, tests = collections.Counter(), collections.Counter()
  for nodeid, _, seconds in records:
    files[nodeid.split('::')[0]] += seconds
    # Parameters and xdist group suffixes of one test function together.
    tests[nodeid.split('[')[0].split('@')[0]] += seconds
  total = sum(files.values())
  lines = [f'{total:,.0f} CPU seconds in {len(files)} files.', '',
           '| file | CPU s | share |', '|---|---:|---:|']
  lines += [f'| `{k}` | {v:,.1f} | {100 * v / total:.1f}% |'
            for k, v in files.most_common()]
  lines += ['', '| test | CPU s |', '|---|---:|']
  lines += [f'| `{k}` | {v:,.1f} |' for k, v in tests.most_common(top)]
  return '\n'.join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('path')
  p.add_argument('--top', type=int, default=20)
  args = p.parse_args(argv)
  records = load(args.path)
  if not records:
    print(f'{args.path}: no records', file=sys.stderr)
    return 1
  print(summary(records, args.top))
  return 0


if __name__ == '__main__':
  sys.exit(main())
