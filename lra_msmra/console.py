"""The console: progress lines and messages, printed by process 0 only.

A closed stdout (e.g. `main ... | head`) is not an error here: the first
print that meets it marks stdout closed (`stdout_closed`), points the file
descriptor at /dev/null so that nothing else fails on it, and sends the
trainer's later messages (`log`) to stderr; the trainer then saves and
stops as on SIGTERM. A closed stderr too (`main ... 2>&1 | head`) is
pointed at /dev/null the same way: the run still saves and exits with 141.

Why not CLU's `periodic_actions.ReportProgress` (the flax examples'
choice): its steps/s is the wall time between two reports, the compiling
first step and the evaluations inside it, and its ETA is the steps left at
that rate; `Progress` leaves both out and adds the evaluations left at their
measured speed. Run locally, its note (steps/s, percent done, ETA) goes to
absl INFO logging, which a run hides without `--verbose`, and nothing there
gives a long evaluation's batches done (`EvalProgress`) or the early lines
of a slow start. The metric records themselves are `lra_msmra.records`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Mapping, Optional

import jax

# Before the first regular progress line of a process (every
# log_every_steps), lines also come after its steps 1, 10, 100, ... and at
# least this often (seconds): a slow step is not hours of silence.
EARLY_LINE_SECONDS = 30.0

_stdout_closed = False


def is_chief() -> bool:
  return jax.process_index() == 0


def stdout_closed() -> bool:
  """Whether a print to stdout found it closed (a broken pipe)."""
  return _stdout_closed


def _emit(text: str, stream: Any) -> None:
  """Prints a line; a broken stdout marks it closed instead of raising, and
  a broken stderr (`main ... 2>&1 | head`) drops the line."""
  global _stdout_closed
  if stream is sys.stdout and _stdout_closed:
    return
  try:
    print(text, file=stream, flush=True)
  except BrokenPipeError:
    if stream is sys.stdout:
      _stdout_closed = True
    elif stream is not sys.stderr:
      raise
    # What is left in the buffer, later messages and Python's own flush at
    # exit go to /dev/null instead of failing again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


class Progress:
  """Prints `step, loss, accuracy, steps/s, model FLOP/s, ETA` lines.

  Steps per second are steady-state figures: the first step of a process
  (which waits for the compilation of the training step) and the time spent
  in evaluations are left out. The ETA is the remaining steps at the
  steady-state rate since compilation, plus the remaining evaluations at
  their measured speed (`eval_seconds_left` of `update`); until an
  evaluation has been timed the ETA covers training only and says `+ eval`.
  The first line with an ETA comes after a line that says so (`ETA_NOTE`).
  A line before any timed step says when steps/s and the ETA come instead
  of giving them; the last step's line has no ETA.

  With `flops_per_step` (the model's matmul FLOPs of one training step over
  all devices), lines also give model FLOP/s per device (with an SI prefix:
  12.2 GFLOP/s/device), and with
  `peak_flops_per_s` (one device's peak, `lra_msmra.hardware`) the model
  FLOPs utilisation (MFU).

  `update` prints the regular lines (every log_every_steps); `early_due` and
  `note` add lines before the first of them, which leave the rate of the
  next regular line unchanged.
  """

  def __init__(self, total_steps: int, start_step: int,
               stream: Optional[Any] = None,
               flops_per_step: Optional[float] = None,
               num_devices: int = 1,
               peak_flops_per_s: Optional[float] = None):
    self.total = total_steps
    self.stream = stream or sys.stdout
    self.flops_per_step = flops_per_step
    self.num_devices = num_devices
    self.peak_flops_per_s = peak_flops_per_s
    self._start = start_step
    self._steady_t0: Optional[float] = None  # When the first step finished.
    self._steady_s0 = start_step
    self._excluded = 0.0  # Seconds excluded since then.
    self._last_t: Optional[float] = None
    self._last_s = start_step
    self._last_excluded = 0.0
    self._regular = False  # Whether `update` printed a line yet.
    self._eta_noted = False  # Whether ETA_NOTE was printed.
    self._printed_t = time.time()

  def compiled(self, step: int) -> None:
    """Call once the first step of this process is done (`step` = its
    number of updates); steady-state timing starts here."""
    now = time.time()
    self._steady_t0 = self._last_t = now
    self._steady_s0 = self._last_s = step
    self._excluded = self._last_excluded = 0.0

  def exclude(self, seconds: float) -> None:
    """Leaves `seconds` (an evaluation) out of the training time."""
    if self._steady_t0 is not None:
      self._excluded += seconds

  def steady(self, step: int) -> tuple[int, float]:
    """(steps, seconds) of this process's steady-state training up to
    `step`, now; (0, 0.0) before any such step."""
    if self._steady_t0 is None or step <= self._steady_s0:
      return 0, 0.0
    elapsed = time.time() - self._steady_t0 - self._excluded
    return step - self._steady_s0, max(elapsed, 1e-9)

  def steps_per_sec(self, step: int) -> Optional[float]:
    """Steady-state training steps per second up to `step` (None if no step
    after the first one was timed)."""
    steps, seconds = self.steady(step)
    return steps / seconds if steps else None

  def throughput(self, rate: Optional[float]) -> dict[str, float]:
    """Model TFLOP/s per device at `rate` steps/s, and the MFU where the
    device's peak is known ({} without a rate or a FLOP count)."""
    if rate is None or not self.flops_per_step:
      return {}
    flops = rate * self.flops_per_step / self.num_devices
    out = {'tflops_per_device': flops / 1e12}
    if self.peak_flops_per_s:
      out['mfu'] = flops / self.peak_flops_per_s
    return out

  def update(self, step: int, scalars: Mapping[str, float],
             eval_seconds_left: Optional[float] = None) -> Optional[float]:
    """Prints a line for `step` (updates done); returns the steps/s since
    the previous line (steady state, None if not measured yet)."""
    now = time.time()
    rate = None
    if self._last_t is not None and step > self._last_s:
      elapsed = now - self._last_t - (self._excluded - self._last_excluded)
      rate = (step - self._last_s) / max(elapsed, 1e-9)
      self._last_t, self._last_s = now, step
      self._last_excluded = self._excluded
    self._regular = True
    self._print(step, scalars, rate, eval_seconds_left)
    return rate

  def early_due(self, step: int) -> bool:
    """Whether to print an early line after `step`: before the first
    regular line, after the process's steps 1, 10, 100, ... and once
    EARLY_LINE_SECONDS have passed since the last line."""
    if self._regular:
      return False
    done = step - self._start
    if done >= 1 and str(done).strip('0') == '1':
      return True
    return time.time() - self._printed_t >= EARLY_LINE_SECONDS

  def note(self, step: int, scalars: Optional[Mapping[str, float]],
           eval_seconds_left: Optional[float] = None) -> None:
    """Prints an early line: the steady-state steps/s so far, and the
    metrics averaged over the steps since the last record."""
    self._print(step, scalars or {}, self.steps_per_sec(step),
                eval_seconds_left)

  def _print(self, step: int, scalars: Mapping[str, float],
             rate: Optional[float], eval_seconds_left: Optional[float]
             ) -> None:
    self._printed_t = time.time()
    steady = self.steps_per_sec(step)
    parts = [f'step {step}/{self.total}']
    for k in ('loss', 'accuracy'):
      if k in scalars:
        parts.append(f'{k} {scalars[k]:.4f}')
    if rate is not None:
      parts.append(f'{rate:.2f} steps/s')
    speed = self.throughput(rate)
    if speed:
      flops = 1e12 * speed['tflops_per_device']
      text = f'{format_flops(flops)}/device'
      if 'mfu' in speed:
        text += f', MFU {100 * speed["mfu"]:.1f}%'
      parts.append(text)
    left = max(self.total - step, 0)
    note = None
    if left and steady is None:
      if rate is None:
        parts.append('steps/s and ETA from the next line')
    elif left:
      seconds = left / steady + (eval_seconds_left or 0.0)
      eta = f'ETA {format_seconds(seconds)}'
      if eval_seconds_left is None:
        eta += ' + eval'
      parts.append(eta)
      if not self._eta_noted:
        self._eta_noted = True
        note = ETA_NOTE
    if is_chief():
      if note:
        _emit(note, self.stream)
      _emit(' | '.join(parts), self.stream)


# Printed once, before the first progress line with an ETA.
ETA_NOTE = ('ETA: the training steps left at the steady steps/s, plus the '
            'evaluations left at their measured speed; "+ eval" means no '
            'evaluation was timed yet, so they are not included.')


# Evaluations print their progress at most this often (seconds).
EVAL_PROGRESS_SECONDS = 10.0


class EvalProgress:
  """`<label>: i/n batches` lines for evaluations that take long.

  The clock starts with `start` (after a first batch that may have waited
  for a compilation, reported on its own). The first line comes after
  EVAL_PROGRESS_SECONDS, then at most one per EVAL_PROGRESS_SECONDS; short
  evaluations print nothing.
  """

  def __init__(self, label: str, total: int):
    self.label = label
    self.total = total
    self.start()

  def start(self) -> None:
    self._start = self._last = time.time()

  def due(self, done: int) -> bool:
    """Whether to report after `done` batches (never after the last one)."""
    return (done < self.total and
            time.time() - self._last >= EVAL_PROGRESS_SECONDS)

  def report(self, done: int) -> None:
    """Prints a line (call when `due()`, with `done` batches finished)."""
    now = time.time()
    self._last = now
    elapsed = now - self._start
    # Batch 1 ran before the clock started.
    left = ((self.total - done) * elapsed / (done - 1) if done > 1 else
            float('inf'))
    log(f'  {self.label}: {done}/{self.total} batches, '
        f'{format_seconds(elapsed)} elapsed, ~{format_seconds(left)} left')


def format_flops(value: float) -> str:
  """FLOP/s with an SI prefix and three significant digits (12.2 GFLOP/s,
  412 TFLOP/s, 35.5 kFLOP/s)."""
  for scale, prefix in ((1e18, 'E'), (1e15, 'P'), (1e12, 'T'), (1e9, 'G'),
                        (1e6, 'M'), (1e3, 'k')):
    if value >= scale:
      return f'{format_tflops(value / scale)} {prefix}FLOP/s'
  return f'{format_tflops(value)} FLOP/s'


def format_tflops(value: float) -> str:
  """Three significant digits, without an exponent (0.0000355, 0.412, 41.2,
  412)."""
  if value <= 0 or not math.isfinite(value):
    return f'{value:g}'
  digits = max(0, 2 - math.floor(math.log10(value)))
  return f'{value:.{digits}f}'


def format_seconds(seconds: Optional[float]) -> str:
  if seconds is None or not math.isfinite(seconds):
    return '?'
  seconds = int(round(seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m}:{s:02d}'


def log(msg: str) -> None:
  """Prints a message from process 0 (on stderr once stdout is closed)."""
  if is_chief():
    _emit(msg, sys.stderr if _stdout_closed else sys.stdout)
