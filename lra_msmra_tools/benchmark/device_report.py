r"""The report of the GPU benchmark (`lra_msmra_tools.benchmark.device`): derived
figures, the verdict on each target of the kernels' work, markdown, the plot,
and the GPU section of docs/benchmarks.md.

  python -m lra_msmra_tools.benchmark.device_report --json DIR/device.json \
      --docs docs/benchmarks.md --image docs/img/gpu_benchmark.png

replaces the section `## GPU` of `--docs` (up to the next `## ` heading, or
the end) with the report of `--json`, and writes its plot to `--image`.
Without `--docs` it prints the section.

Figures derived from a measured point (`derive`), with the device's peaks
from `lra_msmra.hardware.peak` (none on the CPU: those cells show '—'):
achieved TFLOP/s, % of peak FLOP/s, % of peak bandwidth (compulsory bytes
over the time), the roofline time and measured / roofline
(`lra_msmra_tools.benchmark.roofline`); for layers, the speed-up over the cuDNN
softmax layer of the same shape (`BASELINE`) and the peak memory over the
XLA softmax layer's (`MEMORY_BASELINE`); for training steps, model FLOP/s
and MFU (the step's matmul FLOPs, counted on its 'xla' implementation,
over its time and the peak).

The targets (`TARGETS`) are checked on forward+backward in bfloat16 at
every batch the run has, for every variant but softmax.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from lra_msmra import hardware
from lra_msmra_tools import reporting
from lra_msmra_tools.benchmark import outputs
from lra_msmra_tools.benchmark import roofline

MODULE = 'lra_msmra_tools.benchmark.device_report'
# (variant, implementation) that time ratios refer to: cuDNN's fused
# attention inside the softmax layer's projections.
BASELINE = ('softmax', 'cudnn')
# (variant, implementation) that memory ratios refer to.
MEMORY_BASELINE = ('softmax', 'xla')
# Where the targets are checked: forward+backward in bfloat16.
TARGET_DTYPE, TARGET_MODE = 'bfloat16', 'fwd_bwd'
SECTION_HEADING = '## GPU'
# A point that ran out of time or memory counts against a target; one that
# was not run (budget, missing implementation) leaves it unmeasured.
FAILED = ('does not fit', 'out of memory', 'timed out', 'skipped')


class Target(NamedTuple):
  """A target of the issue, checked per (variant, implementation, batch).

  Attributes:
    name: short name (a column of the verdict table).
    text: what it asks.
    kind: 'speed' (speed-up over `BASELINE`), 'roofline' (measured /
      roofline time) or 'memory' (peak memory / `MEMORY_BASELINE`'s).
    min_length: lengths from this one on are checked...
    max_length: ...up to this one (None: every longer one).
    limit: speed: the least speed-up; roofline, memory: the largest ratio.
  """
  name: str
  text: str
  kind: str
  min_length: int
  max_length: Optional[int]
  limit: float


TARGETS = (
    Target('≥ cuDNN, N ≥ 2K', 'at least as fast as the cuDNN layer at every '
           'N ≥ 2,048', 'speed', 2048, None, 1.0),
    Target('≥ 3× cuDNN, 16K', 'at least 3× faster than the cuDNN layer at '
           'N = 16,384', 'speed', 16384, 16384, 3.0),
    Target('≤ 3× roofline, 16K', 'within 3× of its roofline time at '
           'N = 16,384', 'roofline', 16384, 16384, 3.0),
    Target('memory ≤ 1/10, 4K', 'peak memory at N = 4,096 at most 1/10 of '
           'the XLA softmax layer\'s', 'memory', 4096, 4096, 0.1),
)


# ----------------------------------------------------------------- derive


def _index(records: Sequence[Mapping[str, Any]]) -> dict[tuple, dict]:
  """(variant, implementation, setting, length) -> layer record."""
  return {(r['variant'], r['implementation'], r['setting'], r['length']): r
          for r in records if r.get('kind') == 'layer'}


def _ok(rec: Optional[Mapping[str, Any]], field: str) -> Optional[float]:
  if rec is None or rec.get('status') != 'ok':
    return None
  return rec.get(field)


def _div(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return a / b if a is not None and b else None


def peaks(report: Mapping[str, Any]) -> dict[str, Optional[hardware.Peak]]:
  """dtype -> the device's `hardware.Peak` (None if unknown)."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  kind = (report.get('device') or {}).get('device_kind', '')
  dtypes = {r['dtype'] for r in report['records'] if 'dtype' in r}
  # Named through ml_dtypes, which numpy alone does not know bfloat16 from.
  return {d: hardware.peak(kind, getattr(ml_dtypes, d, d))
          for d in sorted(dtypes)}


def derive(report: dict[str, Any]) -> dict[str, Any]:
  """Adds the figures derived from each measured point (module docstring)
  and `report['peaks']`; returns `report`."""
  table = peaks(report)
  report['peaks'] = {d: None if p is None else p._asdict()
                     for d, p in table.items()}
  idx = _index(report['records'])
  for rec in report['records']:
    if rec.get('status') != 'ok':
      continue
    peak = table.get(rec['dtype'])
    if rec['kind'] == 'train':
      rec['tflops_per_s'] = rec['flops'] / rec['time_s'] / 1e12
      rec['mfu_pct'] = (None if peak is None else
                        100 * rec['flops'] / rec['time_s'] / peak.flops_per_s)
      continue
    rec.update(roofline.rates(flops=rec.get('flops'),
                              num_bytes=rec.get('bytes'),
                              time_s=rec['time_s'], peak=peak))
    key = (rec['setting'], rec['length'])
    rec['speedup_over_baseline'] = _div(
        _ok(idx.get(BASELINE + key), 'time_s'), rec['time_s'])
    rec['memory_over_reference'] = _div(
        rec.get('xla_peak_bytes'),
        _ok(idx.get(MEMORY_BASELINE + key), 'xla_peak_bytes'))
  return report


# ---------------------------------------------------------------- verdicts


class Verdict(NamedTuple):
  status: str  # 'met', 'not met' or 'not measured'
  detail: str

  def __str__(self) -> str:
    return f'{self.status} ({self.detail})' if self.detail else self.status


def target_settings(report: Mapping[str, Any]) -> list[str]:
  """The run's settings the targets are checked in (one per batch)."""
  return [s for s in report['settings']['settings']
          if s.endswith(f':{TARGET_DTYPE}:{TARGET_MODE}')]


def verdict(target: Target, idx: Mapping[tuple, Mapping[str, Any]],
            variant: str, implementation: str, setting: str,
            lengths: Sequence[int]) -> Verdict:
  """Whether (variant, implementation) meets `target` in `setting`."""
  checked = [n for n in lengths if n >= target.min_length
             and (target.max_length is None or n <= target.max_length)]
  if not checked:
    return Verdict('not measured', f'no N in [{target.min_length}, '
                   f'{target.max_length or "∞"}] in this run')
  ratios = []
  for n in checked:
    rec = idx.get((variant, implementation, setting, n))
    if target.kind == 'speed':
      ref, field = idx.get(BASELINE + (setting, n)), 'time_s'
    elif target.kind == 'memory':
      ref, field = idx.get(MEMORY_BASELINE + (setting, n)), 'xla_peak_bytes'
    else:
      ref, field = None, 'over_roofline'
    status = rec['status'] if rec else 'absent'
    if status != 'ok':
      if status in FAILED:
        return Verdict('not met', f'N={n} {status}')
      return Verdict('not measured', f'N={n} {status}')
    value = rec.get(field)
    if value is None:
      return Verdict('not measured', f'N={n}: no {field} (no peak for '
                     'this device)' if field == 'over_roofline' else
                     f'N={n}: no {field}')
    if target.kind == 'roofline':
      ratios.append((value, n))
      continue
    ref_status = ref['status'] if ref else 'absent'
    if ref_status != 'ok' or ref.get(field) is None:
      if target.kind == 'memory' and ref_status in FAILED:
        # The reference did not fit where this one did.
        ratios.append((0.0, n))
        continue
      return Verdict('not measured', f'{"/".join(ref_key(target))} at N={n}'
                     f' {ref_status}')
    ratios.append(((ref[field] / value) if target.kind == 'speed'
                   else value / ref[field], n))
  if target.kind == 'speed':
    worst, n = min(ratios)
    met = worst >= target.limit
    detail = (f'{worst:.2f}× at N={n}' if len(ratios) == 1 else
              f'least {worst:.2f}×, at N={n}')
  else:
    worst, n = max(ratios)
    met = worst <= target.limit
    detail = ('the XLA softmax layer did not fit' if worst == 0.0 else
              f'{worst:.3g}× at N={n}')
  return Verdict('met' if met else 'not met', detail)


def ref_key(target: Target) -> tuple[str, str]:
  return BASELINE if target.kind == 'speed' else MEMORY_BASELINE


def verdicts(report: Mapping[str, Any]) -> list[dict[str, Any]]:
  """One row per (variant, implementation, target setting) of the
  mechanisms (softmax excluded): {'variant', 'implementation', 'setting',
  'verdicts': [Verdict per TARGETS]}."""
  idx = _index(report['records'])
  lengths = report['settings']['lengths']
  rows = []
  for setting in target_settings(report):
    for variant, implementation in _layer_variants(report):
      if variant == BASELINE[0]:
        continue
      rows.append({'variant': variant, 'implementation': implementation,
                   'setting': setting,
                   'verdicts': [verdict(t, idx, variant, implementation,
                                        setting, lengths) for t in TARGETS]})
  return rows


def _layer_variants(report: Mapping[str, Any]) -> list[tuple[str, str]]:
  return [(name, impl) for kind, name, impls in report['settings']['variants']
          if kind == 'layer' for impl in impls]


# ---------------------------------------------------------------- markdown


def fmt_ms(seconds: Optional[float]) -> str:
  if seconds is None:
    return '—'
  ms = seconds * 1e3
  return f'{ms:.3g} ms' if ms < 1000 else f'{seconds:.3g} s'


def _fmt(value: Optional[float], fmt: str) -> str:
  return '—' if value is None else format(value, fmt)


def _length(n: int) -> str:
  return f'{n // 1024}K' if n % 1024 == 0 else str(n)


def _setting_title(setting: str) -> str:
  batch, dtype, mode = setting.split(':')
  mode = {'fwd': 'forward', 'fwd_bwd': 'forward+backward'}[mode]
  return f'{mode}, {dtype}, batch {batch}'


def _missing(rec: Optional[Mapping[str, Any]]) -> str:
  return rec['status'] if rec else '—'


def _time_table(report, idx, setting: str) -> str:
  lengths = report['settings']['lengths']
  rows = []
  for variant, impl in _layer_variants(report):
    row = [f'`{variant}`', impl]
    for n in lengths:
      rec = idx.get((variant, impl, setting, n))
      t = _ok(rec, 'time_s')
      if t is None:
        row.append(_missing(rec))
        continue
      speedup = rec.get('speedup_over_baseline')
      row.append(fmt_ms(t) + ('' if speedup is None or (variant, impl) ==
                              BASELINE else f' ({speedup:.2f}×)'))
    rows.append(row)
  return reporting.markdown_table(
      ['layer', 'implementation'] + [_length(n) for n in lengths], rows)


def _roofline_table(report, idx, setting: str) -> str:
  rows = []
  for variant, impl in _layer_variants(report):
    for n in report['settings']['lengths']:
      rec = idx.get((variant, impl, setting, n))
      if rec is None:
        continue
      ok = rec.get('status') == 'ok'
      rows.append([
          f'`{variant}`', impl, _length(n),
          outputs.fmt_flops(rec.get('flops')),
          reporting.fmt_bytes(rec.get('bytes')),
          fmt_ms(_ok(rec, 'time_s')) if ok else rec['status'],
          _fmt(_ok(rec, 'tflops_per_s'), '.1f'),
          _fmt(_ok(rec, 'pct_peak_flops'), '.1f'),
          _fmt(_ok(rec, 'pct_peak_bandwidth'), '.1f'),
          fmt_ms(_ok(rec, 'roofline_s')),
          _fmt(_ok(rec, 'over_roofline'), '.1f'),
          reporting.fmt_bytes(rec.get('xla_peak_bytes')),
          _fmt(_ok(rec, 'memory_over_reference'), '.3g'),
          fmt_ms(rec.get('compile_s'))])
  return reporting.markdown_table(
      ['layer', 'impl.', 'N', 'FLOPs', 'bytes', 'time', 'TFLOP/s',
       '% peak FLOP/s', '% peak bandwidth', 'roofline', 'time / roofline',
       'peak memory (XLA)', '/ XLA softmax', 'compile'], rows)


def _train_table(report) -> str:
  rows = []
  for rec in report['records']:
    if rec.get('kind') != 'train':
      continue
    ok = rec.get('status') == 'ok'
    rows.append([
        f'`{rec["config"]}`', rec['implementation'], rec['dtype'],
        _fmt(_ok(rec, 'steps_per_s'), '.1f') if ok else rec['status'],
        fmt_ms(_ok(rec, 'time_s')),
        outputs.fmt_flops(rec.get('flops')),
        _fmt(_ok(rec, 'tflops_per_s'), '.1f'),
        _fmt(_ok(rec, 'mfu_pct'), '.1f'),
        reporting.fmt_bytes(rec.get('xla_peak_bytes')),
        fmt_ms(rec.get('compile_s'))])
  return reporting.markdown_table(
      ['config', 'impl.', 'dtype', 'steps/s', 'time/step',
       'model FLOPs/step', 'TFLOP/s', 'MFU %', 'peak memory (XLA)',
       'compile'], rows)


def _not_measured(report) -> list[str]:
  """One line per (variant, implementation, status, reason) group."""
  groups: dict[tuple, list[str]] = {}
  for rec in report['records']:
    if rec.get('status') == 'ok':
      continue
    where = (f'{rec["setting"]} N={rec["length"]}' if rec['kind'] == 'layer'
             else rec['dtype'])
    key = (rec['kind'], rec['variant'], rec['implementation'], rec['status'],
           rec.get('reason', '').split('\n')[0][:300])
    groups.setdefault(key, []).append(where)
  lines = []
  for (kind, variant, impl, status, reason), where in groups.items():
    lines.append(f'- {kind} `{variant}` {impl}, {status}: {reason} '
                 f'({", ".join(where)})')
  return lines


def markdown(report: Mapping[str, Any], *, image: Optional[str] = None,
             full: bool = True) -> str:
  """The report; `image`: the plot's path as the markdown links it;
  `full=False` leaves out the per-point tables of the settings the targets
  are not checked in (for docs/benchmarks.md)."""
  s, env = report['settings'], report['environment']
  device = report.get('device') or {}
  idx = _index(report['records'])
  versions = dict(env.get('versions', {}))
  if device.get('jax_version'):
    versions['jax'] = device['jax_version']
    versions['jaxlib'] = device['jaxlib_version']
  peak_lines = []
  for dtype, p in (report.get('peaks') or {}).items():
    peak_lines.append(
        f'{dtype} — ' if p is None else
        f'{dtype} {p["flops_per_s"] / 1e12:.0f} TFLOP/s, '
        f'{p["bytes_per_s"] / 1e12:.2f} TB/s ({p["source"]})')
  counts: dict[str, int] = {}
  for r in report['records']:
    counts[r['status']] = counts.get(r['status'], 0) + 1
  lines = [
      SECTION_HEADING, '',
      'Made by `launch/gpu_benchmark.sh` (`python -m '
      'lra_msmra_tools.benchmark.device`, lra_msmra_tools/benchmark/device.py says '
      'how it measures) and written here by `python -m '
      f'{MODULE}` from its JSON.', '',
      f'- Date (UTC): {env["date_utc"]}',
      f'- Device: {device.get("device_kind", "?")} '
      f'({device.get("platform", "?")}); host: {env.get("cpu")}, '
      f'{env.get("cores")}',
      '- Versions: ' + ', '.join(f'{k} {v}' for k, v in versions.items()
                                 if v),
      '- Peaks (`lra_msmra/hardware.py`): ' + (
          '; '.join(peak_lines) or '—'),
      f'- Layers: D = {s["features"]}, {s["heads"]} heads, all-real '
      'padding mask, dropout off; forward+backward returns the output and '
      'the gradients of the parameters and the input. Training steps: '
      f'configs/{s["train_task"]}/*.py:{s["train_options"]}, synthetic '
      'batches of the config\'s shape.',
      f'- Time: median of up to {s["repeats"]} calls (at least 3; fewer '
      f'past {s["max_point_seconds"]:g} s) after {s["warmup"]} warm-up '
      'calls, each waited for. FLOPs: matmul FLOPs of the '
      f'`{s["reference"]}` implementation. Bytes: the compulsory traffic '
      '(lra_msmra_tools/benchmark/roofline.py). Peak memory: arguments + '
      'outputs + temporaries XLA assigns to one call.',
      f'- Run: {s["budget_s"]:.0f} s budget; points: ' + ', '.join(
          f'{n} {k}' for k, n in sorted(counts.items())), '']
  if image:
    lines += [f'![GPU benchmark]({image})', '']
  rows = []
  for row in verdicts(report):
    rows.append([f'`{row["variant"]}`', row['implementation'],
                 _setting_title(row['setting'])]
                + [str(v) for v in row['verdicts']])
  lines += ['### Targets', '',
            'Each mechanism against the issue\'s targets, forward+backward '
            'in bfloat16: ' + '; '.join(
                f'**{t.name}**: {t.text}' for t in TARGETS) + '.', '']
  lines += ([reporting.markdown_table(
      ['layer', 'impl.', 'setting'] + [t.name for t in TARGETS], rows), '']
            if rows else ['No forward+backward bfloat16 setting was run.',
                          ''])
  for setting in s['settings']:
    lines += [f'### Time, {_setting_title(setting)} (speed-up over the '
              'cuDNN softmax layer)', '', _time_table(report, idx, setting),
              '']
  for setting in s['settings']:
    if not full and setting not in target_settings(report):
      continue
    lines += [f'### Roofline and memory, {_setting_title(setting)}', '',
              _roofline_table(report, idx, setting), '']
  if any(r.get('kind') == 'train' for r in report['records']):
    lines += ['### Training steps', '', _train_table(report), '']
  missing = _not_measured(report)
  if missing:
    lines += ['### Points not measured', ''] + missing + ['']
  notes = [f'- {w["kind"]} `{w["name"]}` stopped: '
           f'{w.get("killed") or w.get("fatal") or "exited"}'
           for w in report.get('workers', []) if w.get('state') == 'stopped']
  notes += [f'- {w["kind"]} `{w["name"]}` left {w["compiles_left_behind"]} '
            'compile(s) running past the compile phase, beside the timed '
            'points' for w in report.get('workers', [])
            if w.get('compiles_left_behind')]
  if notes:
    lines += ['### Workers', ''] + notes + ['']
  return '\n'.join(lines)


# -------------------------------------------------------------------- plot


def plot(report: Mapping[str, Any], path: str) -> None:
  """Time against N for each target setting, and time / roofline of the
  first, one line per (variant, implementation); solid lines are the
  reference implementation."""
  idx = _index(report['records'])
  settings = target_settings(report) or report['settings']['settings'][:1]
  reference = report['settings']['reference']
  panels = []
  for setting in settings:
    for field, ylabel, title in (
        ('time_s', 'median time (s)', _setting_title(setting)),
        ('over_roofline', 'time / roofline time',
         f'{_setting_title(setting)}: time / roofline')):
      if field == 'over_roofline' and (setting != settings[0] or not any(
          _ok(r, field) for r in idx.values())):
        continue
      series = []
      for variant, impl in _layer_variants(report):
        pts = [(n, _ok(idx.get((variant, impl, setting, n)), field))
               for n in report['settings']['lengths']]
        series.append({'label': f'{variant} ({impl})', 'points': pts,
                       'color_key': variant,
                       'style': '-' if impl == reference else '--'})
      panels.append({'title': title, 'ylabel': ylabel, 'series': series})
  device = (report.get('device') or {}).get('device_kind', '?')
  outputs.plot_panels(path, panels, 'sequence length N',
                      f'one attention layer on {device} (solid: '
                      f'{reference}; dashed: other implementations)')


def write_outputs(report: Mapping[str, Any], out: str) -> None:
  """`device.md` and `device.png` in `out`."""
  plot(report, os.path.join(out, 'device.png'))
  with open(os.path.join(out, 'device.md'), 'w') as f:
    f.write(markdown(report, image='device.png') + '\n')


# -------------------------------------------------------------------- docs


def replace_section(text: str, section: str,
                    heading: str = SECTION_HEADING) -> str:
  """`text` with its `heading` section (to the next `## ` heading or the
  end) replaced by `section`, or with `section` appended if it has none."""
  lines = text.split('\n')
  try:
    start = lines.index(heading)
  except ValueError:
    return text.rstrip('\n') + '\n\n' + section.rstrip('\n') + '\n'
  end = next((i for i in range(start + 1, len(lines))
              if lines[i].startswith('## ')), len(lines))
  tail = lines[end:]
  return '\n'.join(lines[:start] + section.rstrip('\n').split('\n')
                   + ([''] + tail if tail else [''])) 


def update_docs(report: Mapping[str, Any], docs: str, image: str) -> None:
  """Writes the plot to `image` and the section into `docs`."""
  plot(report, image)
  link = os.path.relpath(image, os.path.dirname(os.path.abspath(docs)))
  section = markdown(report, image=link, full=False)
  with open(docs) as f:
    text = f.read()
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(docs)))
  with os.fdopen(fd, 'w') as f:
    f.write(replace_section(text, section))
  shutil.move(tmp, docs)


def main(argv: Sequence[str]) -> None:
  import json  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(
      prog=f'python -m {MODULE}',
      description='The GPU section of docs/benchmarks.md from the JSON of '
                  'lra_msmra_tools.benchmark.device.')
  p.add_argument('--json', required=True, help="the run's device.json")
  p.add_argument('--docs', default=None,
                 help='markdown file whose "## GPU" section is replaced '
                      '(default: print the section)')
  p.add_argument('--image', default='docs/img/gpu_benchmark.png',
                 help='where the plot goes (with --docs)')
  args = p.parse_args(argv[1:])
  with open(args.json) as f:
    report = derive(json.load(f))
  if args.docs is None:
    print(markdown(report, full=False))
    return
  update_docs(report, args.docs, args.image)
  print(f'Wrote the {SECTION_HEADING!r} section of {args.docs} and '
        f'{args.image}')


if __name__ == '__main__':
  main(sys.argv)
