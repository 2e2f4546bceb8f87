r"""Training-step benchmark in the style of LRA Table 2.

  python -m lra_msmra_tools.benchmark.train_step \
      --mechanisms softmax,cst,long_short,adamra,combiner \
      --lengths 1024,2048,3072,4096 --batch 4 --out /tmp/bench_train

LRA Table 2 (Tay et al.) reports, for the byte-level Text task at lengths 1K
to 4K, training steps per second and peak memory of every model relative to
the Transformer. This command measures the same on our trainer: one jitted
`lra_msmra.steps.train_step` (forward, backward, optimizer update, state
donated) of the full model a task config builds.

* Each name picks a config file of `--task` (default `text`): `softmax` ->
  `configs/<task>/transformer.py`, `combiner` -> `combiner_fixed.py` (the
  class default variant), any other name -> `<name>.py` (e.g. `cst_l16`,
  `combiner_axial`). `name:key=value,...` overrides
  `config.model.attention_kw`. `--options` passes config options, e.g.
  `xiong` or `cst` for those protocols' models (default: the LRA config).
* `data.max_length` is set to each length (and `data.pad_to_length` to 0),
  and `batch_size` to `--batch` (LRA used 32 on TPUs; on a CPU the softmax
  model does not fit at 4K with 32). Batches hold random token ids with no
  padding, and random labels: speed and memory do not depend on the data.
* Every point runs in its own process; time is the median step after
  compilation and a warm-up step (`lra_msmra_tools.benchmark.workers`); memory
  is the net peak, and points that would not fit are skipped
  (`lra_msmra_tools.benchmark.memory`). FLOPs are the step's matmul FLOPs
  counted from its jaxpr.

Outputs in `--out`: `train_step.json`, `train_step.md` and `train_step.png`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Any, Mapping, Sequence

from lra_msmra import config_lib
from lra_msmra_tools import published
from lra_msmra_tools import reporting
from lra_msmra_tools.benchmark import environment
from lra_msmra_tools.benchmark import memory
from lra_msmra_tools.benchmark import outputs
from lra_msmra_tools.benchmark import specs
from lra_msmra_tools.benchmark import workers

MODULE = 'lra_msmra_tools.benchmark.train_step'
# Registry names whose config file has another name.
DEFAULT_MECHANISMS = 'softmax,cst,long_short,adamra,combiner'
DEFAULT_LENGTHS = '1024,2048,3072,4096'
CONFIG_ROOT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))), 'configs')


def config_path(config_dir: str, task: str, name: str) -> str:
  """The config file a mechanism name stands for (raises if absent)."""
  stem = config_lib.CONFIG_ALIASES.get(name, name)
  path = os.path.join(config_dir, task, stem + '.py')
  if not os.path.exists(path):
    folder = os.path.join(config_dir, task)
    options = sorted(f[:-3] for f in os.listdir(folder)
                     if f.endswith('.py') and f != 'base.py') if (
                         os.path.isdir(folder)) else []
    raise ValueError(f'No config {path} for {name!r}; choose one of '
                     f'{options} or a registry name with an alias '
                     f'{sorted(config_lib.CONFIG_ALIASES)}.')
  return path


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog=f'python -m {MODULE}',
      description='Training steps/s and peak memory of task configs.')
  p.add_argument('--mechanisms', default=DEFAULT_MECHANISMS,
                 help='comma-separated config names of the task, each '
                      'optionally name:key=value (attention_kw overrides)')
  p.add_argument('--lengths', default=DEFAULT_LENGTHS)
  p.add_argument('--out', required=True)
  p.add_argument('--task', default='text')
  p.add_argument('--options', default='',
                 help='config options, e.g. xiong or cst (default: LRA)')
  p.add_argument('--batch', type=int, default=4)
  workers.add_measurement_flags(p)
  p.add_argument('--baseline', default='softmax')
  p.add_argument('--config_dir', default=CONFIG_ROOT)
  args = p.parse_args(argv)
  args.specs, args.length_list = specs.parse_flags(p, args.mechanisms,
                                                  args.lengths)
  if args.batch < 1 or args.repeats < 1:
    p.error('--batch and --repeats must be >= 1')
  for spec in args.specs:
    try:
      config_path(args.config_dir, args.task, spec.name)
    except ValueError as e:
      p.error(str(e))
  return args


def load_config(payload: Mapping[str, Any]):
  """The config of a point: the file, its options, length, batch, knobs."""
  from lra_msmra import config_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra import validation  # pylint: disable=g-import-not-at-top
  path = payload['config_path']
  module = config_lib.load_sibling(path, os.path.basename(path)[:-3])
  config = module.get_config(payload['options'] or None)
  config.data.max_length = payload['length']
  if 'pad_to_length' in config.data:
    config.data.pad_to_length = 0
  config.batch_size = payload['batch']
  for key, value in payload['kw'].items():
    if isinstance(value, tuple):
      value = list(value)
    config.model.attention_kw[key] = value
  validation.validate(config)
  return config


def _worker(payload: Mapping[str, Any]) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from lra_msmra import data as data_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra import models  # pylint: disable=g-import-not-at-top
  from lra_msmra import steps  # pylint: disable=g-import-not-at-top
  from lra_msmra import flops as flops_lib  # pylint: disable=g-import-not-at-top

  config = load_config(payload)
  spec = data_lib.get_model_spec(config)
  model, tx, schedule = steps.build(config, spec)
  init = functools.partial(steps.create_train_state, model=model, tx=tx,
                           batch=steps.example_batch(spec))
  state = jax.jit(init)(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  shape = (config.batch_size, spec['max_len'])
  batch = {'inputs': rng.integers(1, spec['vocab_size'], shape,
                                  dtype=np.int32),
           'targets': rng.integers(0, spec['num_classes'],
                                   (config.batch_size,), dtype=np.int32)}
  if spec['dual']:
    batch['inputs2'] = rng.integers(1, spec['vocab_size'], shape,
                                    dtype=np.int32)
  step_fn = functools.partial(steps.train_step, model=model, tx=tx,
                              schedule=schedule,
                              grad_accum_steps=config.grad_accum_steps)
  counted = flops_lib.matmul_flops(step_fn, state, batch)
  t0 = time.perf_counter()
  compiled = jax.jit(step_fn, donate_argnums=0).lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  holder = {'state': state}
  del state

  def call():
    holder['state'], m = compiled(holder['state'], batch)
    return m

  with memory.PeakMemory(jax.devices()[0]) as meter:
    timing = workers.time_calls(call, jax.block_until_ready,
                                warmup=payload['warmup'],
                                repeats=payload['repeats'],
                                max_seconds=payload['max_repeat_seconds'])
  result = {'compile_s': compile_s, 'flops': counted['flops'],
            'flops_notes': counted['notes'], 'memory': meter.result(),
            'process_peak_bytes': memory.process_peak_bytes(),
            'num_params': models.count_params(holder['state'].params),
            'attention': config.model.attention,
            'attention_kw': config.model.attention_kw.to_dict(),
            'model_length': spec['max_len'] + int(
                config.model.pooling == 'CLS' and not spec['dual']),
            'device': environment.jax_device_info(), **timing}
  result['steps_per_s'] = 1.0 / result['time_s']
  result['net_peak_bytes'] = result['memory']['net_peak_bytes']
  return result


def run(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
  env = environment.environment()
  available = env['memory_available_bytes']
  budget = memory.memory_budget(args.memory_budget_gb, available)
  records = []
  for spec in args.specs:
    path = config_path(args.config_dir, args.task, spec.name)
    history: list[tuple[int, float]] = []
    point_budget = budget  # The device's once a point measured it.
    blocked = None
    for length in args.length_list:
      rec = {'mechanism': spec.label, 'name': spec.name, 'kw': dict(spec.kw),
             'config': os.path.relpath(path, os.path.dirname(
                 args.config_dir)), 'length': length}
      predicted = memory.predict_bytes(history, length)
      if blocked:
        rec.update(status='skipped', reason=blocked)
      elif memory.over_budget(predicted, point_budget):
        rec.update(status='skipped', predicted_peak_bytes=predicted,
                   reason=memory.over_budget(predicted, point_budget))
      else:
        payload = {'config_path': path, 'options': args.options,
                   'kw': dict(spec.kw), 'length': length,
                   'batch': args.batch, 'repeats': args.repeats,
                   'warmup': args.warmup,
                   'max_repeat_seconds': args.max_repeat_seconds}
        rec.update(workers.run_worker(MODULE, payload,
                                      memory_budget_bytes=budget,
                                      timeout_s=args.timeout_s))
      if rec['status'] == 'ok':
        history.append((length, memory.measured_bytes(rec)))
        point_budget = memory.prediction_budget(rec, args.memory_budget_gb,
                                                budget)
      elif not blocked:
        blocked = memory.not_run_reason(length, rec)
      records.append(rec)
      head = f'[{spec.label}] N={length}: '
      workers.log(head + (f'{rec["steps_per_s"]:.3f} steps/s, net peak '
                          f'{reporting.fmt_bytes(rec["net_peak_bytes"])}'
                          if rec['status'] == 'ok' else
                          f'{rec["status"]} ({rec.get("reason", "")})'))
  return {'command': environment.command_line(argv, MODULE), 'environment': env,
          'load_average_end': list(os.getloadavg()),
          'settings': {'task': args.task, 'options': args.options,
                       'mechanisms': [s.label for s in args.specs],
                       'lengths': args.length_list, 'batch': args.batch,
                       'repeats': args.repeats, 'warmup': args.warmup,
                       'baseline': args.baseline,
                       'memory_budget_bytes': budget},
          'records': records}


def markdown(report: Mapping[str, Any]) -> str:
  s, env = report['settings'], report['environment']
  idx = {(r['mechanism'], r['length']): r for r in report['records']}
  mechs, lengths, base = s['mechanisms'], s['lengths'], s['baseline']
  device = next((r['device'] for r in report['records']
                 if r.get('status') == 'ok'), {})
  params = {m: next((r['num_params'] for r in report['records']
                     if r['mechanism'] == m and r.get('status') == 'ok'),
                    None) for m in mechs}
  lines = [
      '# Training-step benchmark (LRA Table 2 style)', '',
      f'Command: `{report["command"]}`', '',
      f'- Date (UTC): {env["date_utc"]}',
      f'- Device: {device.get("device_kind", "?")} '
      f'({device.get("backend", "?")}); CPU: {env["cpu"]}, '
      f'{env.get("cores", str(env["cpu_count"]) + " CPU cores")}',
      f'- Task `{s["task"]}`, config options '
      f'`{s["options"] or "(LRA)"}`, batch {s["batch"]}, lengths = '
      '`data.max_length` (the model adds a CLS token where the config '
      'pools on it)',
      '- Versions: ' + ', '.join(f'{k} {v}' for k, v in
                                  env['versions'].items() if v),
      '- Load average (1, 5, 15 min) at start: '
      + ', '.join(f'{x:.2f}' for x in env['load_average']) + '; at end: '
      + ', '.join(f'{x:.2f}' for x in report['load_average_end']),
      f'- Time: median of up to {s["repeats"]} steps after compilation and '
      f'{s["warmup"]} warm-up step(s); memory: net peak of the steps '
      '(one process per point).', '']

  def table(field, fmt, relative):
    rows = []
    for m in mechs:
      row = [f'`{m}`']
      for n in lengths:
        rec = idx.get((m, n))
        v = workers.ok_value(rec, field)
        if v is None:
          row.append(rec['status'] if rec else '—')
          continue
        b = workers.ok_value(idx.get((base, n)), field)
        rel = relative(v, b) if b and m != base else None
        row.append(fmt(v) + (f' ({rel:.2f}×)' if rel is not None else ''))
      rows.append(row)
    return reporting.markdown_table(['mechanism'] + [str(n) for n in lengths],
                                    rows)

  lines += [f'## Steps per second (relative to `{base}`)', '',
            table('steps_per_s', lambda v: f'{v:.3g}', lambda v, b: v / b),
            '', f'## Net peak memory (relative to `{base}`)', '',
            table('net_peak_bytes', reporting.fmt_bytes, lambda v, b: v / b),
            '', '## Matmul FLOPs per step', '',
            table('flops', outputs.fmt_flops, lambda v, b: v / b), '',
            '## Parameters', '',
            reporting.markdown_table(['mechanism', 'parameters'], [
                [f'`{m}`', f'{params[m]:,}' if params[m] else '—']
                for m in mechs]), '']
  lines += _published_table2(report)
  problems = [r for r in report['records'] if r['status'] != 'ok']
  if problems:
    lines += ['## Points not measured', ''] + [
        f'- `{r["mechanism"]}` N={r["length"]}: {r["status"]}: '
        f'{r.get("reason", "")}' for r in problems] + ['']
  return '\n'.join(lines)


def _published_table2(report: Mapping[str, Any]) -> list[str]:
  """The LRA paper's Table 2 ratios for the models of a Text run measured
  against softmax (registry names, default knobs); [] otherwise."""
  s = report['settings']
  attention = {}
  for r in report['records']:
    if r.get('attention') and not r.get('kw'):
      attention.setdefault(r['mechanism'], r['attention'])
  if (s['task'] != 'text' or s['options']
      or attention.get(s['baseline']) != 'softmax'):
    return []
  rows = []
  for m in s['mechanisms']:
    if m == s['baseline'] or m not in attention:
      continue
    cells = [published.lra_table2_ratios(attention[m], n)
             for n in s['lengths']]
    if any(cells):
      rows.append([f'`{m}`'] + [
          '—' if c is None else f'{c[0]:.2f}× / {c[1]:.2f}×' for c in cells])
  if not rows:
    return []
  return [
      '## Published: LRA paper, Table 2 (not measured here)', '',
      'Speed / peak memory relative to the Transformer, computed from the '
      f'published steps/s and GB. Source: {published.LRA_TABLE2_SOURCE}. A '
      'different device, batch and implementation, columns matched to the '
      'nearest thousand tokens: compare how the ratios grow with the '
      'length, not their values.', '',
      reporting.markdown_table(['mechanism'] + [str(n) for n in s['lengths']],
                               rows), '']


def plot(report: Mapping[str, Any], path: str) -> None:
  s = report['settings']
  idx = {(r['mechanism'], r['length']): r for r in report['records']}
  panels = []
  for field, ylabel, scale in (('steps_per_s', 'steps per second', 1),
                               ('net_peak_bytes', 'net peak memory (MiB)',
                                reporting.MIB)):
    series = []
    for m in s['mechanisms']:
      pts = []
      for n in s['lengths']:
        v = workers.ok_value(idx.get((m, n)), field)
        pts.append((n, None if v is None else v / scale))
      series.append({'label': m, 'points': pts, 'color_key': m})
    panels.append({'title': ylabel, 'ylabel': ylabel, 'series': series})
  outputs.plot_panels(path, panels, 'sequence length N',
                      f'{s["task"]} training step, batch {s["batch"]}')


def main(argv: Sequence[str]) -> None:
  payload = workers.worker_payload(argv)
  if payload is not None:
    workers.emit_result(_worker(payload))
    return
  args = parse_args(argv[1:])
  os.makedirs(args.out, exist_ok=True)
  report = run(args, argv)
  outputs.write_json(os.path.join(args.out, 'train_step.json'), report)
  with open(os.path.join(args.out, 'train_step.md'), 'w') as f:
    f.write(markdown(report) + '\n')
  plot(report, os.path.join(args.out, 'train_step.png'))
  workers.log(f'Wrote train_step.json, train_step.md and train_step.png to '
              f'{args.out}')


if __name__ == '__main__':
  main(sys.argv)
