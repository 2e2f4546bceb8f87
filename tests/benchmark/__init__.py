"""Benchmark tests; `run_benchmark` runs one benchmark command end to end."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def run_benchmark(module: str, mechanisms, lengths, out, *args: str) -> None:
  """Runs `python -m module` on `mechanisms` x `lengths` into `out`.

  Fails the test with the command's stderr if it exits non-zero.
  """
  cmd = [sys.executable, '-m', module, '--mechanisms', ','.join(mechanisms),
         '--lengths', ','.join(map(str, lengths)), *args,
         '--memory_budget_gb', '8', '--out', str(out)]
  # The command and its worker processes inherit the tests' fast-compile
  # settings (tests/conftest.py).
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
