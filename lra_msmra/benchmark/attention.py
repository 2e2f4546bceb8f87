r"""Attention benchmark: time, memory and FLOPs of one layer over lengths.

  python -m lra_msmra.benchmark.attention \
      --mechanisms softmax,cst,long_short,adamra,combiner \
      --lengths 1024,2048,4096,8192,16384 --out /tmp/bench_attention

Each mechanism is built by registry name with its class defaults (the LRA
default settings); `name:key=value,key=value` sets knobs, e.g.
`combiner:variant=fixed`, `cst:slice_length=16`,
`adamra:compression_rates=(1/2,1/8)`. The layer is the one the encoder
builds (`lra_msmra.attention.standalone.StandaloneAttention`, with the
mechanism's shared module), with `--features` model width = qkv width,
`--heads` heads, a `[batch, length, features]` input of random normals and an
all-True padding mask (passed explicitly, as the encoder does).

Modes: `fwd` is the jitted forward pass; `fwd_bwd` is the forward pass and
its VJP with a random cotangent, returning the output and the gradients of
the parameters and of the input. The cotangent is made to depend on the
output (as a loss's gradient does), so the backward pass cannot start
before the forward pass ends. Dropout is off (deterministic).

Per point (mechanism, length, mode) a separate worker process records the
median time, the compile time, the net peak memory and the analytic matmul
FLOPs (`lra_msmra.benchmark.flops`), plus XLA's own FLOP estimate and
temporary-buffer size where the backend reports them; how time and memory
are measured and how points that would not fit are skipped is in
`lra_msmra.benchmark.common`. Ratios to `--baseline` (default softmax) use
figures of the same run.

PyTorch (optional, `--torch auto|on|off`): with PyTorch importable, every
point is also run with the straightforward PyTorch version of the same
computation (`lra_msmra.benchmark.torch_reference`) on the same weights, and
a check at `--torch_check_length` compares the two outputs. Without PyTorch
the comparison is skipped and the report says so.

Outputs in `--out`: `attention.json` (every record, the environment and the
command), `attention.md` (tables) and `attention_time.png`,
`attention_memory.png` (log-log plots).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from lra_msmra.benchmark import common

MODULE = 'lra_msmra.benchmark.attention'
MODES = ('fwd', 'fwd_bwd')
MODE_NAMES = {'fwd': 'forward', 'fwd_bwd': 'forward+backward'}
DEFAULT_MECHANISMS = 'softmax,cst,long_short,adamra,combiner'
DEFAULT_LENGTHS = '1024,2048,4096,8192,16384'


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog=f'python -m {MODULE}',
      description='Time, memory and FLOPs of attention layers over lengths.')
  p.add_argument('--mechanisms', default=DEFAULT_MECHANISMS,
                 help='comma-separated names, each optionally name:key=value'
                      ',key=value (default: %(default)s)')
  p.add_argument('--lengths', default=DEFAULT_LENGTHS,
                 help='comma-separated sequence lengths (default: '
                      '%(default)s)')
  p.add_argument('--out', required=True, help='output folder')
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--features', type=int, default=256,
                 help='model width D (= qkv width)')
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--dtype', default='float32',
                 choices=('float32', 'bfloat16'))
  p.add_argument('--modes', default=','.join(MODES),
                 help='comma-separated subset of fwd,fwd_bwd')
  common.add_measurement_flags(p)
  p.add_argument('--torch', default='auto', choices=('auto', 'on', 'off'),
                 help='PyTorch comparison: auto = if importable')
  p.add_argument('--torch_check_length', type=int, default=256,
                 help='length of the JAX-vs-PyTorch output check')
  p.add_argument('--baseline', default='softmax',
                 help='mechanism label the ratios refer to')
  p.add_argument('--growth_from', type=int, default=4096,
                 help='length the growth table divides by')
  args = p.parse_args(argv)
  args.specs = common.parse_specs(args.mechanisms)
  args.length_list = common.parse_lengths(args.lengths)
  args.mode_list = [m.strip() for m in args.modes.split(',') if m.strip()]
  bad = sorted(set(args.mode_list) - set(MODES))
  if bad or not args.mode_list:
    p.error(f'--modes: unknown {bad}; valid: {list(MODES)}')
  for name in ('batch', 'features', 'heads', 'repeats'):
    if getattr(args, name) < 1:
      p.error(f'--{name} must be >= 1')
  if args.features % args.heads:
    p.error(f'--features={args.features} is not divisible by '
            f'--heads={args.heads}')
  from lra_msmra import attention as attention_lib  # pylint: disable=g-import-not-at-top
  for spec in args.specs:
    if spec.name not in attention_lib.REGISTRY:
      p.error(f'unknown mechanism {spec.name!r}; registered: '
              f'{sorted(attention_lib.REGISTRY)}')
  return args


# ------------------------------------------------------------------ worker


def _setup(payload: Mapping[str, Any], length: int):
  """Layer, parameters and inputs of a point (in a worker process)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax.core import FrozenDict  # pylint: disable=g-import-not-at-top
  from lra_msmra.attention import standalone  # pylint: disable=g-import-not-at-top

  dtype = jnp.dtype(payload['dtype'])
  layer = standalone.StandaloneAttention(
      mechanism=payload['name'], kw=FrozenDict(payload['kw']),
      num_heads=payload['heads'], qkv_features=payload['features'],
      dtype=dtype, max_len=max(length, payload['length']))
  kx, kp, kg = jax.random.split(jax.random.PRNGKey(0), 3)
  shape = (payload['batch'], length, payload['features'])
  x = jax.random.normal(kx, shape, jnp.float32).astype(dtype)
  g = jax.random.normal(kg, shape, jnp.float32).astype(dtype)
  mask = jnp.ones(shape[:2], bool)
  # Under jit the forward pass inside init is dead code and is removed.
  variables = jax.jit(layer.init)(kp, x, padding_mask=mask)
  params = {'params': variables['params']}
  return layer, params, x, mask, g


def _jax_worker(payload: Mapping[str, Any]) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  from lra_msmra.attention import base  # pylint: disable=g-import-not-at-top
  from lra_msmra.benchmark import flops as flops_lib  # pylint: disable=g-import-not-at-top

  layer, params, x, mask, g = _setup(payload, payload['length'])

  def forward(params, x, mask):
    return layer.apply(params, x, padding_mask=mask)

  def forward_backward(params, x, mask, g):
    y, pullback = jax.vjp(lambda p, x: forward(p, x, mask), params, x)
    # In training the cotangent comes from the loss, after the whole forward
    # pass. A cotangent that is just an input would let XLA start the
    # backward pass early and hold its buffers through the forward pass, so
    # it is made to depend on the output (the values are unchanged).
    g, = base.after(y, g)
    return y, pullback(g)

  if payload['mode'] == 'fwd':
    fn, args = forward, (params, x, mask)
  else:
    fn, args = forward_backward, (params, x, mask, g)
  counted = flops_lib.matmul_flops(fn, *args)
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  xla_flops = xla_temp = None
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flops = float(cost['flops']) if cost and 'flops' in cost else None
  except Exception:  # pylint: disable=broad-except
    pass  # Not every backend reports a cost model.
  try:
    xla_temp = int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:  # pylint: disable=broad-except
    pass
  with common.PeakMemory(jax.devices()[0]) as meter:
    timing = common.time_calls(
        lambda: compiled(*args), jax.block_until_ready,
        warmup=payload['warmup'], repeats=payload['repeats'],
        max_seconds=payload['max_repeat_seconds'])
  result = {'compile_s': compile_s, 'flops': counted['flops'],
            'flops_notes': counted['notes'], 'xla_flops': xla_flops,
            'xla_temp_bytes': xla_temp, 'memory': meter.result(),
            'process_peak_bytes': common.process_peak_bytes(),
            'device': common.jax_device_info(), **timing}
  result['net_peak_bytes'] = result['memory']['net_peak_bytes']
  return result


def _torch_worker(payload: Mapping[str, Any]) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from lra_msmra.benchmark import torch_reference  # pylint: disable=g-import-not-at-top

  if payload['dtype'] != 'float32':
    raise NotImplementedError('The PyTorch comparison runs in float32 only.')
  mode = payload['mode']
  length = payload['check_length'] if mode == 'check' else payload['length']
  layer, params, x, mask, g = _setup(payload, length)
  np_params = jax.device_get(params['params'])
  fn, tensors = torch_reference.build(payload['name'], payload['kw'],
                                      np_params)
  tx = torch.from_numpy(np.array(x))
  tmask = torch.from_numpy(np.array(mask))
  if mode == 'check':
    # A partly padded batch checks the masking as well.
    cut = max(1, length - length // 4)
    np_mask = np.ones(mask.shape, bool)
    np_mask[-1, cut:] = False
    y_jax = np.array(layer.apply(params, x, padding_mask=np_mask))
    with torch.no_grad():
      y_torch = fn(tx, torch.from_numpy(np_mask)).numpy()
    diff = float(np.max(np.abs(y_jax - y_torch)))
    scale = float(np.max(np.abs(y_jax)))
    return {'check_length': length, 'max_abs_diff': diff,
            'max_abs_output': scale, 'relative_diff': diff / max(scale, 1e-30)}
  del layer, params, x, mask
  tg = torch.from_numpy(np.array(g))
  if mode == 'fwd':
    def call():
      with torch.no_grad():
        return fn(tx, tmask)
  else:
    for t in tensors:
      t.requires_grad_(True)
    tx.requires_grad_(True)

    def call():
      for t in tensors + [tx]:
        t.grad = None
      y = fn(tx, tmask)
      y.backward(tg)
      return y
  with common.PeakMemory() as meter:
    timing = common.time_calls(call, lambda _: None,
                               warmup=payload['warmup'],
                               repeats=payload['repeats'],
                               max_seconds=payload['max_repeat_seconds'])
  result = {'memory': meter.result(),
            'process_peak_bytes': common.process_peak_bytes(),
            'torch_threads': torch.get_num_threads(),
            'torch_version': torch.__version__, **timing}
  result['net_peak_bytes'] = result['memory']['net_peak_bytes']
  return result


def worker_main(payload: Mapping[str, Any]) -> None:
  """Runs one point and prints its result line."""
  worker = _torch_worker if payload['backend'] == 'torch' else _jax_worker
  try:
    result = worker(payload)
  except NotImplementedError as e:
    result = {'status': 'unsupported', 'reason': str(e)}
  common.emit_result(result)


# ------------------------------------------------------------ orchestration


def _torch_available() -> bool:
  return importlib.util.find_spec('torch') is not None


def _payload(args, spec: common.Spec, backend: str, mode: str, length: int
             ) -> dict[str, Any]:
  return {'backend': backend, 'mode': mode, 'name': spec.name,
          'kw': dict(spec.kw), 'length': length, 'batch': args.batch,
          'features': args.features, 'heads': args.heads,
          'dtype': args.dtype, 'repeats': args.repeats,
          'warmup': args.warmup,
          'max_repeat_seconds': args.max_repeat_seconds,
          'check_length': args.torch_check_length}


def run(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
  """Measures every point and returns the report data."""
  env = common.environment()
  available = env['memory_available_bytes']
  budget = common.memory_budget(args.memory_budget_gb, available)
  torch_note = None
  backends = ['jax']
  if args.torch == 'off':
    torch_note = 'PyTorch comparison turned off (--torch off).'
  elif _torch_available():
    backends.append('torch')
  elif args.torch == 'on':
    raise SystemExit('--torch on, but PyTorch is not installed; install it '
                     '(pip install torch) or use --torch auto/off.')
  else:
    torch_note = ('PyTorch comparison skipped: torch is not installed '
                  '(pip install torch to enable it).')
  if torch_note:
    common.log(torch_note)

  records, checks = [], {}
  for spec in args.specs:
    if 'torch' in backends:
      check = common.run_worker(
          MODULE, _payload(args, spec, 'torch', 'check', 0),
          memory_budget_bytes=budget, timeout_s=args.timeout_s)
      checks[spec.label] = check
      common.log(f'[{spec.label}] torch check: {check.get("status")} '
           f'{check.get("max_abs_diff", check.get("reason", ""))}')
    history: dict[tuple[str, str], list[tuple[int, float]]] = {}
    # Device memory once a point measured it (GPU/TPU), else host memory.
    budgets: dict[tuple[str, str], Optional[float]] = {}
    blocked: dict[str, str] = {}
    for length in args.length_list:
      for backend in backends:
        for mode in args.mode_list:
          rec = {'mechanism': spec.label, 'name': spec.name,
                 'kw': dict(spec.kw), 'backend': backend, 'mode': mode,
                 'length': length}
          check = checks.get(spec.label)
          key = (backend, mode)
          # The JAX points of this length run first: their growth guides
          # the PyTorch prediction when PyTorch has a single shorter point.
          hint = common.growth_exponent(history.get(('jax', mode), []))
          predicted = common.predict_bytes(history.get(key, []), length,
                                           hint if backend == 'torch'
                                           else None)
          if backend == 'torch' and check and check['status'] != 'ok':
            rec.update(status='unsupported' if check['status'] ==
                       'unsupported' else 'skipped',
                       reason=f'PyTorch check {check["status"]}: '
                              f'{check.get("reason", "")}')
          elif key in blocked:
            rec.update(status='skipped', reason=blocked[key])
          elif common.over_budget(predicted, budgets.get(key, budget)):
            rec.update(status='skipped', predicted_peak_bytes=predicted,
                       reason=common.over_budget(
                           predicted, budgets.get(key, budget)))
          else:
            result = common.run_worker(
                MODULE, _payload(args, spec, backend, mode, length),
                memory_budget_bytes=budget, timeout_s=args.timeout_s)
            rec.update(result)
            if predicted:
              rec['predicted_peak_bytes'] = predicted
          if rec['status'] == 'ok':
            history.setdefault(key, []).append(
                (length, common.measured_bytes(rec)))
            budgets[key] = common.prediction_budget(
                rec, args.memory_budget_gb, budget)
          elif key not in blocked:
            blocked[key] = common.not_run_reason(length, rec)
          records.append(rec)
          common.log(_describe(rec))
  end_load = list(os.getloadavg())
  return {
      'command': common.command_line(argv, MODULE),
      'environment': env, 'load_average_end': end_load,
      'settings': {
          'mechanisms': [s.label for s in args.specs],
          'lengths': args.length_list, 'modes': args.mode_list,
          'batch': args.batch, 'features': args.features,
          'heads': args.heads, 'head_dim': args.features // args.heads,
          'dtype': args.dtype, 'repeats': args.repeats,
          'warmup': args.warmup, 'baseline': args.baseline,
          'memory_budget_bytes': budget, 'backends': backends,
          'torch_note': torch_note},
      'torch_checks': checks,
      'records': records,
  }


def _describe(rec: Mapping[str, Any]) -> str:
  head = (f'[{rec["mechanism"]}] {rec["backend"]} {rec["mode"]} '
          f'N={rec["length"]}: ')
  if rec['status'] != 'ok':
    return head + f'{rec["status"]} ({rec.get("reason", "")})'
  return head + (f'{common.fmt_time(rec["time_s"])}, net peak '
                 f'{common.fmt_bytes(rec["net_peak_bytes"])}')


# ------------------------------------------------------------------ report


def _index(records):
  return {(r['mechanism'], r['backend'], r['mode'], r['length']): r
          for r in records}


def _div(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return None if a is None or b is None or b == 0 else a / b


def _cell_missing(rec: Optional[Mapping[str, Any]]) -> str:
  if rec is None:
    return '—'
  return {'skipped': 'skipped', 'failed': 'failed',
          'unsupported': 'n/a'}.get(rec.get('status'), '—')


def _length_table(idx, mechs, lengths, backend: str, mode: str,
                  field: str, cell: Callable[[str, str, int, float], str]
                  ) -> str:
  """A row per mechanism, a column per length, of one measured field.

  `cell(mode, mechanism, length, value)` formats a measured point's
  `field`; points without it show why (`_cell_missing`).
  """
  rows = []
  for m in mechs:
    row = [f'`{m}`']
    for n in lengths:
      rec = idx.get((m, backend, mode, n))
      value = common.ok_value(rec, field)
      row.append(_cell_missing(rec) if value is None
                 else cell(mode, m, n, value))
    rows.append(row)
  return common.markdown_table(['mechanism'] + [str(n) for n in lengths],
                               rows)


def markdown(report: Mapping[str, Any]) -> str:
  s = report['settings']
  env = report['environment']
  idx = _index(report['records'])
  mechs, lengths, base = s['mechanisms'], s['lengths'], s['baseline']
  has_base = base in mechs
  device = next((r['device'] for r in report['records']
                 if r.get('status') == 'ok' and r.get('device')), {})
  lines = [
      '# Attention benchmark', '',
      f'Command: `{report["command"]}`', '',
      f'- Date (UTC): {env["date_utc"]}',
      f'- Device: {device.get("device_kind", "?")} '
      f'({device.get("backend", "?")}); CPU: {env["cpu"]}, '
      f'{env["cpu_count"]} cores',
      f'- Shapes: batch {s["batch"]}, width {s["features"]}, '
      f'{s["heads"]} heads of {s["head_dim"]}, dtype {s["dtype"]}; '
      'all-real padding mask; dropout off',
      '- Versions: ' + ', '.join(f'{k} {v}' for k, v in
                                   env['versions'].items() if v),
      '- Load average (1, 5, 15 min) at start: '
      + ', '.join(f'{x:.2f}' for x in env['load_average'])
      + '; at end: ' + ', '.join(f'{x:.2f}' for x in
                                  report['load_average_end']),
      f'- Memory budget for skipping: '
      f'{common.fmt_bytes(s["memory_budget_bytes"])}',
      f'- Time: median of up to {s["repeats"]} calls after compilation and '
      f'{s["warmup"]} warm-up call(s). Memory: net peak (resident '
      'high-water mark during the calls minus resident size before them, '
      'one process per point; device peak on GPU/TPU).', '']
  if not has_base:
    lines += [f'Baseline `{base}` was not measured: no ratios.', '']
  def base_value(mode, n, field):
    return common.ok_value(idx.get((base, 'jax', mode, n)), field)

  def time_cell(mode, m, n, t):
    speedup = _div(base_value(mode, n, 'time_s'), t)
    return common.fmt_time(t) + (
        f' ({common.fmt_ratio(speedup, 1)})' if speedup and m != base else '')

  def memory_cell(mode, m, n, b):
    frac = _div(b, base_value(mode, n, 'net_peak_bytes'))
    return common.fmt_bytes(b) + (
        f' ({frac:.3f} of `{base}`)' if frac is not None and m != base
        else '')

  def flops_cell(mode, m, n, f):
    t = common.ok_value(idx.get((m, 'jax', mode, n)), 'time_s')
    return f'{common.fmt_flops(f)}, {f / t / 1e9:.1f} GFLOP/s'

  for title, field, cell in (
      (f'time (speed-up over `{base}` in this run)', 'time_s', time_cell),
      ('net peak memory', 'net_peak_bytes', memory_cell),
      ('matmul FLOPs and achieved rate', 'flops', flops_cell)):
    for mode in s['modes']:
      lines += [f'## {MODE_NAMES[mode].capitalize()} {title}', '',
                _length_table(idx, mechs, lengths, 'jax', mode, field, cell),
                '']
  longer = [n for n in lengths if n > s.get('growth_from', 4096)]
  ref = report.get('growth_from', 4096)
  if ref in lengths and longer:
    for mode in s['modes']:
      rows = []
      for m in mechs:
        t0 = common.ok_value(idx.get((m, 'jax', mode, ref)), 'time_s')
        rows.append([f'`{m}`'] + [
            common.fmt_ratio(_div(common.ok_value(idx.get((m, 'jax', mode, n)),
                                      'time_s'), t0), 1) for n in longer])
      lines += [f'## {MODE_NAMES[mode].capitalize()} time growth from '
                f'N={ref}', '',
                common.markdown_table(['mechanism'] + [
                    f'{n} / {ref}' for n in longer], rows), '']
  rows = []
  for m in mechs:
    for mode in s['modes']:
      rows.append([f'`{m}`', mode] + [
          common.fmt_time(common.ok_value(idx.get((m, 'jax', mode, n)),
                                          'compile_s'))
          for n in lengths])
  lines += ['## Compile time', '',
            common.markdown_table(['mechanism', 'mode'] + [
                str(n) for n in lengths], rows), '']
  lines += _torch_section(report, idx, mechs, lengths)
  problems = [r for r in report['records'] if r['status'] != 'ok']
  if problems:
    lines += ['## Points not measured', '']
    lines += [f'- `{r["mechanism"]}` {r["backend"]} {r["mode"]} '
              f'N={r["length"]}: {r["status"]}: {r.get("reason", "")}'
              for r in problems]
    lines.append('')
  return '\n'.join(lines)


def _torch_section(report, idx, mechs, lengths) -> list[str]:
  s = report['settings']
  lines = ['## PyTorch comparison', '']
  if 'torch' not in s['backends']:
    return lines + [s['torch_note'] or 'Not run.', '']
  rows = []
  for m in mechs:
    c = report['torch_checks'].get(m, {})
    if c.get('status') == 'ok':
      rows.append([f'`{m}`', c['check_length'], f'{c["max_abs_diff"]:.2e}',
                   f'{c["relative_diff"]:.2e}'])
    else:
      rows.append([f'`{m}`', '—', c.get('status', '—'),
                   c.get('reason', '')[:120]])
  version = next((r.get('torch_version') for r in report['records']
                  if r.get('torch_version')), '?')
  threads = next((r.get('torch_threads') for r in report['records']
                  if r.get('torch_threads')), '?')
  lines += [f'PyTorch {version}, {threads} threads. Output check on the '
            'same weights (last batch row padded over its final quarter):',
            '', common.markdown_table(['mechanism', 'length',
                                       'max |JAX - PyTorch|', 'relative'],
                                      rows), '']
  def torch_cell(mode, m, n, tt):
    tj = common.ok_value(idx.get((m, 'jax', mode, n)), 'time_s')
    return f'{common.fmt_time(tt)} (JAX {common.fmt_ratio(_div(tt, tj), 2)})'

  for mode in s['modes']:
    lines += [f'### PyTorch {MODE_NAMES[mode]} time (JAX speed-up over '
              'PyTorch: > 1× means JAX is faster)', '',
              _length_table(idx, mechs, lengths, 'torch', mode, 'time_s',
                            torch_cell), '']
  return lines


def plot(report: Mapping[str, Any], out: str) -> list[str]:
  s = report['settings']
  idx = _index(report['records'])
  paths = []
  for field, ylabel, name in (('time_s', 'median time (s)', 'time'),
                              ('net_peak_bytes', 'net peak memory (MiB)',
                               'memory')):
    panels = []
    for mode in s['modes']:
      series = []
      for m in s['mechanisms']:
        for backend in s['backends']:
          pts = []
          for n in s['lengths']:
            v = common.ok_value(idx.get((m, backend, mode, n)), field)
            if v is not None and field == 'net_peak_bytes':
              v = v / common.MIB
            pts.append((n, v))
          series.append({'label': m + (' (PyTorch)' if backend == 'torch'
                                       else ''),
                         'points': pts, 'color_key': m,
                         'style': '--' if backend == 'torch' else '-'})
      panels.append({'title': MODE_NAMES[mode], 'ylabel': ylabel,
                     'series': series})
    path = os.path.join(out, f'attention_{name}.png')
    common.plot_panels(
        path, panels, 'sequence length N',
        f'batch {s["batch"]}, D={s["features"]}, {s["heads"]} heads, '
        f'{s["dtype"]} (solid: JAX, dashed: PyTorch)')
    paths.append(path)
  return paths


def main(argv: Sequence[str]) -> None:
  payload = common.worker_payload(argv)
  if payload is not None:
    worker_main(payload)
    return
  args = parse_args(argv[1:])
  os.makedirs(args.out, exist_ok=True)
  report = run(args, argv)
  report['growth_from'] = args.growth_from
  report['settings']['growth_from'] = args.growth_from
  common.write_json(os.path.join(args.out, 'attention.json'), report)
  with open(os.path.join(args.out, 'attention.md'), 'w') as f:
    f.write(markdown(report) + '\n')
  plot(report, args.out)
  common.log(f'Wrote attention.json, attention.md and plots to {args.out}')


if __name__ == '__main__':
  main(sys.argv)
