"""Metric writers and the progress line, written from process 0 only."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Mapping, Optional

import jax


def is_chief() -> bool:
  return jax.process_index() == 0


class Writer:
  """TensorBoard scalars plus a JSON-lines copy (`metrics.jsonl`)."""

  def __init__(self, logdir: str):
    self._tb = None
    self._jsonl = None
    if is_chief():
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      os.makedirs(logdir, exist_ok=True)
      self._tb = SummaryWriter(logdir)
      self._jsonl = open(os.path.join(logdir, 'metrics.jsonl'), 'a')

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if self._tb is None:
      return
    for k, v in scalars.items():
      self._tb.add_scalar(k, float(v), step)
    self._jsonl.write(json.dumps({'step': step, **{
        k: float(v) for k, v in scalars.items()}}) + '\n')
    self._jsonl.flush()
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._jsonl.close()


class Progress:
  """Prints `step, loss, accuracy, steps/s, ETA` lines."""

  def __init__(self, total_steps: int, start_step: int,
               stream: Optional[Any] = None):
    self.total = total_steps
    self.stream = stream or sys.stdout
    self._t0 = time.time()
    self._s0 = start_step
    self._last_t = self._t0
    self._last_s = start_step

  def steps_per_sec(self, step: int) -> float:
    elapsed = time.time() - self._t0
    return (step - self._s0) / elapsed if elapsed > 0 else 0.0

  def update(self, step: int, scalars: Mapping[str, float]) -> float:
    """Prints a line for `step` (updates done); returns recent steps/s."""
    now = time.time()
    rate = (step - self._last_s) / max(now - self._last_t, 1e-9)
    self._last_t, self._last_s = now, step
    eta = (self.total - step) / rate if rate > 0 else float('inf')
    parts = [f'step {step}/{self.total}']
    for k in ('loss', 'accuracy'):
      if k in scalars:
        parts.append(f'{k} {scalars[k]:.4f}')
    parts.append(f'{rate:.2f} steps/s')
    parts.append(f'ETA {_fmt_time(eta)}')
    if is_chief():
      print(' | '.join(parts), file=self.stream, flush=True)
    return rate


def _fmt_time(seconds: float) -> str:
  if seconds == float('inf'):
    return '?'
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m}:{s:02d}'


def log(msg: str) -> None:
  """Prints a message from process 0."""
  if is_chief():
    print(msg, flush=True)
