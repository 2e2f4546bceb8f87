"""The progress line's timing and ETA."""

import io

import pytest

from lra_msmra import console


class Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


@pytest.fixture
def clock(monkeypatch):
  c = Clock()
  monkeypatch.setattr(console.time, 'time', c)
  return c


def test_eta_leaves_out_compilation_and_evaluations(clock):
  out = io.StringIO()
  progress = console.Progress(total_steps=100, start_step=0, stream=out)
  clock.now += 600.0  # Compiling the training step and running step 1.
  progress.compiled(1)
  clock.now += 9.0  # Steps 2..10 at 1 step/s.
  assert progress.update(10, {'loss': 1.0}) == pytest.approx(1.0)
  # 90 steps at 1 step/s; no evaluation timed yet. The ETA's parts are
  # explained once, before its first line.
  assert out.getvalue().splitlines() == [
      console.ETA_NOTE, 'step 10/100 | loss 1.0000 | 1.00 steps/s | '
      'ETA 1:30 + eval']
  assert '"+ eval"' in console.ETA_NOTE
  clock.now += 300.0  # A slow evaluation ...
  progress.exclude(300.0)
  clock.now += 10.0  # ... then steps 11..20 at 1 step/s.
  # The evaluations left (measured speed) are added to the ETA.
  assert progress.update(20, {}, eval_seconds_left=40.0) == pytest.approx(1.0)
  assert out.getvalue().splitlines()[2:] == [
      'step 20/100 | 1.00 steps/s | ETA 2:00']
  assert progress.steps_per_sec(20) == pytest.approx(1.0)


def test_no_rate_before_a_steady_step_and_no_eta_on_the_last(clock):
  out = io.StringIO()
  progress = console.Progress(total_steps=5, start_step=3, stream=out)
  clock.now += 100.0
  progress.compiled(4)
  assert progress.update(4, {}) is None
  assert out.getvalue().strip() == (
      'step 4/5 | steps/s and ETA from the next line')
  assert progress.steps_per_sec(4) is None
  clock.now += 2.0
  progress.update(5, {}, eval_seconds_left=65.0)
  assert out.getvalue().splitlines()[-1] == 'step 5/5 | 0.50 steps/s'
  assert console.ETA_NOTE not in out.getvalue()


def test_evaluation_progress_is_throttled(clock, capsys):
  progress = console.EvalProgress('test', total=100)
  clock.now += 60.0  # The first batch (compilation) does not count.
  progress.start()
  clock.now += console.EVAL_PROGRESS_SECONDS - 1
  assert not progress.due(10)
  clock.now += 1
  assert progress.due(11)
  progress.report(11)
  assert capsys.readouterr().out == (
      '  test: 11/100 batches, 0:10 elapsed, ~1:29 left\n')
  assert not progress.due(12)
  clock.now += console.EVAL_PROGRESS_SECONDS
  assert progress.due(50) and not progress.due(100)


def test_early_lines_come_before_the_first_regular_one(clock):
  out = io.StringIO()
  progress = console.Progress(total_steps=100, start_step=0, stream=out)
  clock.now += 60.0  # Compiling and step 1.
  progress.compiled(1)
  assert progress.early_due(1)
  progress.note(1, {'loss': 2.5})
  assert out.getvalue().splitlines()[-1] == (
      'step 1/100 | loss 2.5000 | steps/s and ETA from the next line')
  clock.now += 1.0
  assert not progress.early_due(2)
  clock.now += console.EARLY_LINE_SECONDS  # A slow step: a line anyway.
  assert progress.early_due(3)
  progress.note(3, None)
  assert not progress.early_due(4)
  clock.now += 7.0
  assert progress.early_due(10)
  progress.note(10, {})
  # Steady rate since step 1: 9 steps in 38 s.
  assert out.getvalue().splitlines()[-1] == (
      'step 10/100 | 0.24 steps/s | ETA 6:20 + eval')
  clock.now += 40.0
  # The regular line's rate counts from step 1, not from the early lines.
  assert progress.update(50, {}) == pytest.approx(49 / 78.0)
  clock.now += console.EARLY_LINE_SECONDS
  assert not progress.early_due(100)  # Regular lines only from here on.


def test_early_lines_count_the_steps_of_the_process(clock):
  progress = console.Progress(total_steps=1000, start_step=650,
                              stream=io.StringIO())
  progress.compiled(651)
  assert [s for s in range(651, 800) if progress.early_due(s)] == [
      651, 660, 750]


def test_progress_line_gives_model_tflops_and_mfu(clock):
  out = io.StringIO()
  # 2 TFLOP per step over 2 devices; a device's peak of 4 TFLOP/s.
  progress = console.Progress(total_steps=100, start_step=0, stream=out,
                              flops_per_step=2e12, num_devices=2,
                              peak_flops_per_s=4e12)
  progress.compiled(1)
  clock.now += 9.0
  rate = progress.update(10, {})
  assert rate == pytest.approx(1.0)
  assert progress.throughput(rate) == pytest.approx(
      {'tflops_per_device': 1.0, 'mfu': 0.25})
  assert '| 1.00 TFLOP/s/device, MFU 25.0% |' in out.getvalue()
  # Peak unknown (e.g. a CPU): TFLOP/s only.
  progress.peak_flops_per_s = None
  assert progress.throughput(2.0) == {'tflops_per_device': 2.0}
  assert progress.throughput(None) == {}
  # A CPU's rate gets its own prefix, not a fraction of a TFLOP/s.
  progress.flops_per_step, progress.peak_flops_per_s = 2.44e10, None
  clock.now += 10.0
  progress.update(20, {})
  assert '| 12.2 GFLOP/s/device |' in out.getvalue().splitlines()[-1]
  assert console.format_tflops(3.55e-5) == '0.0000355'
  assert [console.format_flops(v) for v in (412e12, 1.2e15, 35.5e3, 7.0)] == [
      '412 TFLOP/s', '1.20 PFLOP/s', '35.5 kFLOP/s', '7.00 FLOP/s']
