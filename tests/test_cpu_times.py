"""`pytest --cpu-times PATH` records CPU seconds per test phase, and
`python -m tests.cpu_times` sums them (tests/conftest.py)."""

import json
import subprocess
import sys

import pytest

from tests import cpu_times
from tests import helpers

TEST = 'tests/test_launch.py::test_tpu_pod_commands'


def test_every_phase_of_a_test_is_recorded(tmp_path):
  path = tmp_path / 'cpu.jsonl'
  proc = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-n', '0', TEST,
       f'--cpu-times={path}'], cwd=helpers.ROOT, capture_output=True,
      text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  records = [json.loads(line) for line in path.read_text().splitlines()]
  assert [r[:2] for r in records] == [[TEST, 'setup'], [TEST, 'call'],
                                      [TEST, 'teardown']]
  assert all(r[2] >= 0 for r in records)
  text = cpu_times.summary(cpu_times.load(str(path)))
  assert '| `tests/test_launch.py` |' in text
  assert '| `tests/test_launch.py::test_tpu_pod_commands` |' in text


def test_summary_sums_files_and_parameters(tmp_path):
  path = tmp_path / 'cpu.jsonl'
  rows = [['tests/a.py::t[1]', 'call', 1.5], ['tests/a.py::t[2]', 'call', 2.0],
          ['tests/b.py::u@group', 'setup', 0.5]]
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  text = cpu_times.summary(cpu_times.load(str(path)))
  assert text.splitlines()[0] == '4 CPU seconds in 2 files.'
  assert '| `tests/a.py` | 3.5 | 87.5% |' in text
  assert '| `tests/a.py::t` | 3.5 |' in text
  assert '| `tests/b.py::u` | 0.5 |' in text


def test_a_malformed_line_is_named(tmp_path):
  path = tmp_path / 'cpu.jsonl'
  path.write_text('["tests/a.py::t", "call", 1.0]\nnot json\n')
  with pytest.raises(SystemExit, match=r'cpu.jsonl:2: not a \[test id'):
    cpu_times.load(str(path))
