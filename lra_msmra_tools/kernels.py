r"""Does every Pallas kernel compile on every target? A deviceless sweep.

  python -m lra_msmra_tools.kernels --targets v5e-4,v4-8,h200:1 \
      --lengths 1K,4K,16K --head_dims 32,64,128 --dtypes bfloat16,float32 \
      [--dropouts 0,0.1] [--forms bidirectional,causal] [--heads 4] \
      [--batch 2] \
      --cache runs/kernel_matrix.json [--out F.md] [--doc docs/scaling.md] \
      [--cached_only]
  python -m lra_msmra_tools.kernels --targets v5e-4,h200 --configs all \
      --cache runs/kernel_configs.json [--doc docs/scaling.md]

For every case, one attention layer (`StandaloneAttention`, as the encoder
builds it) with `implementation='pallas'`: its forward pass and the
gradients of its parameters and input (every forward and backward kernel),
jitted over one compile-only device of the target and really compiled:

* TPU (libtpu): Mosaic's checks of every kernel (tiling, alignment of
  dynamic slices, scoped VMEM within the limit the kernel asks for);
* GPU (the CUDA plugin): Triton to sm_90a machine code, failing on shared
  memory beyond the block's opt-in limit and on any register spill
  (`Target.compiler_options`).

Cases: every mechanism variant of `VARIANTS` x length x head dim x dtype x
attention dropout x form (bidirectional, causal) x target, at `--heads`
heads (4) and a batch of `--batch` (2) with a padding mask (its values are
not part of a compiled program). A variant without a causal form leaves
out its causal cases, in a line.
`--configs` compiles instead the layer of each task config as its model
runs it (`config_case`): the config's knobs, heads, head dim, input width,
dtype, attention dropout and form, at the length its encoder's layers
see. The layer is applied as the train step applies it, its `metrics`
collected: a layer may then ask its kernels for more (Transformer-LS's
landmark mass). A spill in XLA's own fusions (not in a Pallas kernel) is a
note, not a failure (`compile.compile_step`). Each case compiles in a
worker process (`--jobs` at a time); finished cases are kept in `--cache`
(JSON) so that an interrupted sweep continues where it stopped
(`--cached_only`: the tables of what is in the cache, compiling nothing).
It prints a summary per target and a table, a row per case, and exits 1
if any case failed; `--doc` puts the summary into docs/scaling.md.
`tests/kernels/test_compile.py` runs a small matrix of it, and task
configs' layers, on v5e and the H200.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import itertools
import json
import os
import sys
import time
import types
from typing import Any, Optional, Sequence

from lra_msmra_tools import compile as compile_lib
from lra_msmra_tools import fits
from lra_msmra_tools import targets as targets_lib

# (label, registry name, knobs): every mechanism variant with a Pallas
# implementation (each class's IMPLEMENTATIONS lists 'pallas').
VARIANTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ('cst', 'cst', {'slice_length': 8}),
    ('long_short', 'long_short', {}),
    ('adamra', 'adamra', {}),
    ('combiner_fixed', 'combiner', {'variant': 'fixed'}),
    ('combiner_axial_vertical', 'combiner',
     {'variant': 'axial', 'axial_plan': 'vertical'}),
    ('combiner_axial_horizontal', 'combiner',
     {'variant': 'axial', 'axial_plan': 'horizontal'}),
    ('combiner_mixture', 'combiner', {'variant': 'mixture'}),
)
VARIANTS_BY_LABEL = {label: (mechanism, kw)
                     for label, mechanism, kw in VARIANTS}
BATCH = 2
HEADS = 4
DOC_START = '<!-- kernel-matrix:start -->'
DOC_END = '<!-- kernel-matrix:end -->'
# `--configs` puts its summary between these instead.
CONFIGS_DOC_START = '<!-- kernel-configs:start -->'
CONFIGS_DOC_END = '<!-- kernel-configs:end -->'


@dataclasses.dataclass(frozen=True)
class Case:
  """One compile: a mechanism variant at one shape on one target."""
  variant: str
  target: str
  length: int
  head_dim: int
  dtype: str
  heads: int = HEADS
  batch: int = BATCH
  dropout: float = 0.0
  causal: bool = False
  # The layer's input width (the model's emb_dim); 0: heads x head_dim.
  features: int = 0

  @property
  def key(self) -> str:
    return (f'{self.variant}|{self.target}|{self.length}|{self.head_dim}|'
            f'{self.dtype}|{self.heads}|{self.batch}|{self.dropout}|'
            f'{self.causal}' + (f'|{self.features}' if self.features else ''))


def _variant(label: str) -> tuple[str, dict[str, Any]]:
  """(registry name, knobs) of a variant of `VARIANTS`, or of a task
  config's layer (`config_case`: the label is the config, `task/x.py` or
  `task/x.py:options`)."""
  if '.py' in label:
    m = _load_config(label).model
    return m.attention, {k: v for k, v in m.attention_kw.items()
                         if k != 'implementation'}
  for name, mechanism, kw in VARIANTS:
    if name == label:
      return mechanism, kw
  raise ValueError(f'unknown variant {label!r}; valid: '
                   f'{", ".join(v[0] for v in VARIANTS)}.')


def _load_config(label: str):
  """The config of `task/x.py[:options]` (under configs/)."""
  from lra_msmra_tools import scaling  # pylint: disable=g-import-not-at-top
  path, _, options = label.partition(':')
  full = os.path.join(scaling.CONFIG_ROOT, path)
  if not os.path.exists(full):
    raise ValueError(f'--configs: no config file configs/{path}.')
  return scaling.load_config(full, options or None)


def task_configs() -> list[str]:
  """The layers of every task config whose mechanism has a Pallas
  implementation (the files of `configs/<task>/`), with each of its
  options and each pair of them that builds (`task/x.py`,
  `task/x.py:option`, `task/x.py:a,b`): one label per distinct layer
  (`config_case`), the first that builds it."""
  # pylint: disable=g-import-not-at-top
  from lra_msmra import attention
  from lra_msmra import config_lib
  from lra_msmra_tools import scaling
  # pylint: enable=g-import-not-at-top
  found: dict[tuple[Any, ...], str] = {}
  for task in fits.TASKS:
    for name in sorted(os.listdir(os.path.join(scaling.CONFIG_ROOT, task))):
      if not name.endswith('.py') or name == 'base.py':
        continue
      label = f'{task}/{name}'
      if 'pallas' not in attention.REGISTRY[
          _load_config(label).model.attention].IMPLEMENTATIONS:
        continue
      module = config_lib.load_sibling(
          os.path.join(scaling.CONFIG_ROOT, label), name[:-3])
      options = [o for o in getattr(module, 'OPTIONS', ())
                 if o != 'runlocal']
      for chosen in ([()] + [(o,) for o in options]
                     + list(itertools.combinations(options, 2))):
        full = f'{label}:{",".join(chosen)}' if chosen else label
        try:
          layer = layer_of(config_case(full, ''))
        except ValueError:  # Options that do not go together.
          continue
        found.setdefault(layer, full)
  return list(found.values())


def layer_of(case: Case) -> tuple[Any, ...]:
  """What a case compiles, apart from its target and name: the
  mechanism, its knobs and the shapes."""
  mechanism, kw = _variant(case.variant)
  return (mechanism, tuple(sorted((k, repr(v)) for k, v in kw.items())),
          case.length, case.head_dim, case.heads, case.dtype, case.dropout,
          case.causal, case.features, case.batch)


def config_case(label: str, target: str,
                dtype: Optional[str] = None) -> Case:
  """One attention layer of a task config (`task/x.py[:options]`) as its
  model runs it: the config's knobs, heads, head dim, input width,
  dtype (or `dtype`), attention dropout and form, at the length the
  encoder's layers see (the task's, plus the CLS position where the model
  has one)."""
  from lra_msmra import data as data_lib  # pylint: disable=g-import-not-at-top
  config = _load_config(label)
  m = config.model
  spec = data_lib.get_model_spec(config)
  cls = int(m.pooling == 'CLS' and not spec['dual'])
  return Case(label, target, spec['max_len'] + cls,
              m.qkv_dim // m.num_heads, dtype or m.dtype, heads=m.num_heads,
              dropout=m.attention_dropout_rate,
              causal=bool(m.causal or config.objective == 'causal'),
              features=m.emb_dim)


def _layer(case: Case, mechanism: str, kw: dict[str, Any]):
  """The case's attention layer (`StandaloneAttention`, as the encoder
  builds it, `implementation='pallas'`) and its parameters' shapes; the
  mechanism and knobs are its variant's (`_variant`)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax.core import FrozenDict  # pylint: disable=g-import-not-at-top
  from lra_msmra.attention import standalone  # pylint: disable=g-import-not-at-top
  dtype = jnp.dtype(case.dtype)
  features = case.features or case.heads * case.head_dim
  layer = standalone.StandaloneAttention(
      mechanism=mechanism, kw=FrozenDict(dict(kw, implementation='pallas')),
      num_heads=case.heads, qkv_features=case.heads * case.head_dim,
      dtype=dtype, max_len=case.length, dropout_rate=case.dropout,
      causal=case.causal)
  params = jax.eval_shape(lambda: layer.init(
      jax.random.PRNGKey(0), jnp.zeros((1, case.length, features), dtype),
      padding_mask=jnp.ones((1, case.length), bool)))
  return layer, params


def has_causal_form(variant: str) -> bool:
  """Whether the variant's layer builds with `causal=True` (a mechanism or
  knob without a causal form raises NotImplementedError, as in 'xla')."""
  try:
    _layer(Case(variant, '', 256, 16, 'float32', causal=True),
           *_variant(variant))
  except NotImplementedError:
    return False
  return True


def compile_case(case: Case) -> dict[str, Any]:
  """Compiles one case in this process; its record (status, seconds,
  error). Needs `targets.prepare_environment()` before JAX is imported.

  The compilers run with their optimizations, as a user's program does,
  even where the environment turns most of them off
  (`JAX_DISABLE_MOST_OPTIMIZATIONS`, which the test suite sets for speed):
  a kernel's registers and spills are those of the optimised machine code
  (unoptimised, ptxas spills where the real build does not)."""
  targets_lib.prepare_environment()
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_disable_most_optimizations', False)
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  target = targets_lib.parse(case.target)
  mechanism, kw = _variant(case.variant)
  record = dataclasses.asdict(case)
  start = time.perf_counter()
  try:
    device = target.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    dtype = jnp.dtype(case.dtype)
    features = case.features or case.heads * case.head_dim
    layer, params = _layer(case, mechanism, kw)
    place = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                           sharding=sharding)
    params = jax.tree.map(place, params)
    x = place(jax.ShapeDtypeStruct((case.batch, case.length, features),
                                   dtype))
    mask = place(jax.ShapeDtypeStruct((case.batch, case.length), jnp.bool_))

    def loss(p, x, mask):
      # As the train step calls it: its metrics collected (some layers then
      # ask their kernels for more, e.g. Transformer-LS's landmark mass).
      y, _ = layer.apply(p, x, padding_mask=mask,
                         deterministic=not case.dropout,
                         rngs={'dropout': jax.random.PRNGKey(1)},
                         mutable=['metrics'])
      return jnp.sum(y.astype(jnp.float32) ** 2)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    text = grad.trace(params, x, mask).lower().as_text()
    record['kernels'] = (text.count('tpu_custom_call')
                         + text.count('__gpu$xla.gpu.triton'))
    step = compile_lib.compile_step(
        types.SimpleNamespace(fn=grad, args=(params, x, mask)), target,
        kernel_stats=target.platform == 'cuda')
    stats = step.get('kernels', {}).get('kernels', [])
    if stats:
      record['registers'] = max(k.get('registers', 0) for k in stats)
      record['shared_memory'] = max(k.get('shared_memory', 0) for k in stats)
    record['notes'] = step['notes']
    if step.get('oom'):
      record['status'] = 'FAILED'
      record['error'] = f'does not fit: {step.get("message", "")}'
    elif step['failures']:
      record['status'] = 'FAILED'
      record['error'] = ' '.join(step['failures'])[:600]
    else:
      record['status'] = 'ok'
  except Exception as e:  # pylint: disable=broad-except
    record['status'] = 'FAILED'
    record['error'] = f'{type(e).__name__}: {" ".join(str(e).split())[:600]}'
  record['seconds'] = round(time.perf_counter() - start, 1)
  return record


def _worker(case: Case) -> dict[str, Any]:
  return compile_case(case)


def run(cases: Sequence[Case], jobs: int = 1,
        cache: Optional[str] = None, progress=None) -> list[dict[str, Any]]:
  """Every case's record, compiled in `jobs` worker processes; records
  already in `cache` are reused and new ones added to it as they finish."""
  done: dict[str, dict[str, Any]] = {}
  if cache and os.path.exists(cache):
    with open(cache) as f:
      done = {r['key']: r for r in json.load(f)}
  todo = [c for c in cases if c.key not in done]

  def keep(case: Case, record: dict[str, Any]) -> None:
    record['key'] = case.key
    done[case.key] = record
    if progress:
      progress(record)
    if cache:
      os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
      with open(cache + '.tmp', 'w') as f:
        json.dump(list(done.values()), f, indent=1)
      os.replace(cache + '.tmp', cache)

  if todo:
    import multiprocessing  # pylint: disable=g-import-not-at-top
    context = multiprocessing.get_context('spawn')  # No inherited JAX.
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=max(1, jobs), mp_context=context,
        initializer=targets_lib.prepare_environment) as pool:
      futures = {pool.submit(_worker, c): c for c in todo}
      for future in concurrent.futures.as_completed(futures):
        keep(futures[future], future.result())
  return [done[c.key] for c in cases]


def _label(r: dict[str, Any]) -> str:
  """'cst on h200, N=1000, d=64, bfloat16, dropout 0.1, causal'."""
  return (f'{r["variant"]} on {r["target"]}, N={r["length"]}, '
          f'd={r["head_dim"]}, {r["dtype"]}'
          + (f', dropout {r["dropout"]}' if r.get('dropout') else '')
          + (', causal' if r.get('causal') else ''))


def summary(records: Sequence[dict[str, Any]]) -> str:
  """A row per target: cases compiled, and on GPUs the most registers and
  shared memory of any kernel and the cases where XLA's own fusions
  spill."""
  lines = ['| target | cases | compile | lengths | head dims | dtypes | '
           'dropout | most registers / thread (GPU) | most shared memory '
           '(GPU) | XLA\'s own fusions spill (GPU) |',
           '|---|---|---|---|---|---|---|---|---|---|']
  join = lambda values: ', '.join(str(v) for v in sorted(set(values)))
  for target in dict.fromkeys(r['target'] for r in records):
    mine = [r for r in records if r['target'] == target]
    ok = sum(r['status'] == 'ok' for r in mine)
    registers = [r['registers'] for r in mine if r.get('registers')]
    smem = [r['shared_memory'] for r in mine if r.get('shared_memory')]
    theirs = sum(bool(r.get('notes')) for r in mine)
    gpu = bool(registers)
    lines.append(
        f'| {target} | {len(mine)} | {ok} of {len(mine)} | '
        f'{join(r["length"] for r in mine)} | '
        f'{join(r["head_dim"] for r in mine)} | '
        f'{join(r["dtype"] for r in mine)} | '
        f'{join(r.get("dropout", 0) for r in mine)} | '
        f'{max(registers) if gpu else "—"} | '
        f'{f"{max(smem):,} B" if smem else "—"} | '
        f'{f"{theirs} cases" if gpu else "—"} |')
  return '\n'.join(lines)


def markdown(records: Sequence[dict[str, Any]]) -> str:
  """A row per case; the failures and notes below the table."""
  lines = ['| variant | target | N | head dim | dtype | dropout | form | '
           'kernels | GPU registers (max) | GPU shared memory (max) | '
           'compiles | seconds |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|']
  errors, notes = [], []
  for r in records:
    smem = r.get('shared_memory')
    lines.append(
        f'| {r["variant"]} | {r["target"]} | {r["length"]} | '
        f'{r["head_dim"]} | {r["dtype"]} | {r.get("dropout", 0)} | '
        f'{"causal" if r.get("causal") else "bidirectional"} | '
        f'{r.get("kernels", "—")} | {r.get("registers", "—")} | '
        f'{"—" if smem is None else f"{smem:,} B"} | {r["status"]} | '
        f'{r["seconds"]} |')
    if r['status'] != 'ok':
      errors.append(f'- {_label(r)}: {r["error"]}')
    notes += [f'- {_label(r)}: {n}' for n in r.get('notes', [])]
  if errors:
    lines += ['', 'Failures:', ''] + errors
  if notes:
    lines += ['', 'Notes:', ''] + notes
  return '\n'.join(lines)


def _ints(text: str) -> list[int]:
  out = []
  for part in text.split(','):
    part = part.strip().upper()
    out.append(int(part[:-1]) * 1024 if part.endswith('K') else int(part))
  return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog='python -m lra_msmra_tools.kernels',
      description='Compile every Pallas kernel (forward and backward) for '
                  'TPU and GPU targets, on this CPU.')
  p.add_argument('--targets', default='v4-8,v5e-4,v5p-8,v6e:2x2,h100,h200',
                 help='comma-separated target names (lra_msmra_tools.targets)')
  p.add_argument('--variants', default=','.join(v[0] for v in VARIANTS),
                 help='comma-separated mechanism variants')
  p.add_argument('--lengths', default='1K,4K,16K',
                 help='sequence lengths, e.g. 1000,4K,16K')
  p.add_argument('--head_dims', default='32,64,128')
  p.add_argument('--dtypes', default='bfloat16,float32')
  p.add_argument('--dropouts', default='0,0.1',
                 help='attention dropout rates (dropout adds the keep-mask '
                      'hashing to the kernels)')
  p.add_argument('--configs', default=None,
                 help='instead of the variant sweep: the layer of each of '
                      'these task configs (task/x.py[:options], comma-'
                      'separated, or "all": every task\'s config of a '
                      'mechanism with a Pallas implementation) at its own '
                      'length, heads, head dim, dtype (or those of '
                      '--dtypes) and dropout')
  p.add_argument('--forms', default='bidirectional',
                 help='bidirectional, causal or both (comma-separated)')
  p.add_argument('--heads', type=int, default=HEADS,
                 help='attention heads of each layer')
  p.add_argument('--batch', type=int, default=BATCH,
                 help='batch of each layer (with a padding mask)')
  p.add_argument('--jobs', type=int, default=os.cpu_count() or 1)
  p.add_argument('--cache', default=None,
                 help='JSON of finished cases: a rerun continues from it')
  p.add_argument('--out', default=None, help='also write the table here')
  p.add_argument('--doc', default=None,
                 help='also put the summary between the markers '
                      f'{DOC_START} and {DOC_END} of this file '
                      '(docs/scaling.md)')
  p.add_argument('--cached_only', action='store_true',
                 help='compile nothing: the tables of the cases already in '
                      '--cache (a sweep still under way)')
  args = p.parse_args(argv)
  try:
    for name in args.targets.split(','):
      targets_lib.parse(name)
    for name in args.variants.split(','):
      _variant(name)
    args.config_list = (task_configs() if args.configs == 'all' else
                        args.configs.split(',') if args.configs else [])
    given = [a.split('=')[0] for a in argv]
    sweep = [a for a in given if a in ('--variants', '--lengths',
                                       '--head_dims', '--dropouts',
                                       '--forms', '--heads', '--batch')]
    if args.configs and sweep:
      p.error(f'--configs compiles each config\'s own layer (its length, '
              f'head dim, dropout and form); drop {", ".join(sweep)}.')
    # With --configs: each config's own dtype unless --dtypes is given.
    args.config_dtypes = ('--dtypes' in given and args.dtypes.split(',')
                          or [None])
    for name in args.config_list:
      _load_config(name)
    args.length_list = _ints(args.lengths)
    args.head_dim_list = _ints(args.head_dims)
  except ValueError as e:
    p.error(str(e))
  try:
    args.dropout_list = [float(r) for r in args.dropouts.split(',')]
  except ValueError:
    p.error(f'--dropouts: {args.dropouts!r} is not a list of rates.')
  if not all(0.0 <= r < 1.0 for r in args.dropout_list):
    p.error(f'--dropouts: {args.dropouts!r}: each rate in [0, 1).')
  if args.heads < 1 or args.batch < 1:
    p.error(f'--heads {args.heads} / --batch {args.batch}: each at least 1.')
  args.form_list = args.forms.split(',')
  for form in args.form_list:
    if form not in ('bidirectional', 'causal'):
      p.error(f'--forms: {form!r} is not bidirectional or causal.')
  for dtype in args.dtypes.split(','):
    if dtype not in ('bfloat16', 'float32'):
      p.error(f'--dtypes: {dtype!r} is not bfloat16 or float32.')
  return args


def main(argv: Sequence[str]) -> int:
  args = parse_args(argv[1:])
  targets_lib.prepare_environment()
  if args.config_list:
    cases = [config_case(c, t, dtype) for t in args.targets.split(',')
             for c in args.config_list for dtype in args.config_dtypes]
  else:
    cases = [Case(v, t, n, d, dt, heads=args.heads, batch=args.batch,
                  dropout=r, causal=form == 'causal')
             for t in args.targets.split(',')
             for v in args.variants.split(',')
             for n in args.length_list for d in args.head_dim_list
             for dt in args.dtypes.split(',')
             for r in args.dropout_list for form in args.form_list]
  lacking = sorted(v for v in {c.variant for c in cases if c.causal}
                   if not has_causal_form(v))
  for variant in lacking:
    print(f'{variant} has no causal form (causal=True raises): its causal '
          'cases are left out.', flush=True)
  cases = [c for c in cases if not (c.causal and c.variant in lacking)]
  for name in {c.target for c in cases}:
    try:
      targets_lib.parse(name).check_packages()
    except targets_lib.MissingPackage as e:
      raise SystemExit(f'error: {e}') from None

  def progress(r):
    print(f'{r["status"]:6} {_label(r)} ({r["seconds"]} s)',
          file=sys.stderr, flush=True)
  if args.cached_only:
    if not (args.cache and os.path.exists(args.cache)):
      raise SystemExit(f'error: --cached_only needs an existing --cache '
                       f'file, got {args.cache!r}.')
    with open(args.cache) as f:
      done = {r['key']: r for r in json.load(f)}
    records = [done[c.key] for c in cases if c.key in done]
  else:
    records = run(cases, args.jobs, args.cache, progress)
  shown, skip = [], False
  for arg in argv[1:]:  # The command as typed, less its housekeeping.
    if skip or arg == '--cached_only':
      skip = False
      continue
    if arg in ('--jobs', '--doc'):
      skip = True
      continue
    if not arg.startswith(('--jobs=', '--doc=')):
      shown.append(arg)
  command = ' '.join(shown)
  left = len(cases) - len(records)
  text = (f'`python -m lra_msmra_tools.kernels {command}` '
          f'({time.strftime("%Y-%m-%d")}, {compile_lib.versions()}): forward and gradients of one layer, '
          + (f'as each config\'s model runs it, batch {BATCH} with padding'
             if args.config_list else
             f'batch {args.batch} with padding, {args.heads} heads')
          + f'; {len(records)} of '
          f'{len(cases)} cases compiled'
          + (f' ({left} not run yet: the same command compiles them)'
             if left else '') + '.\n\n'
          + summary(records) + '\n\n' + markdown(records))
  print(text)
  if args.doc:
    start, end = ((CONFIGS_DOC_START, CONFIGS_DOC_END) if args.config_list
                  else (DOC_START, DOC_END))
    fits.replace_in_doc(args.doc, f'{text.split(chr(10) * 2)[0]}\n\n'
                        f'{summary(records)}', start, end)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text + '\n')
  return 1 if any(r['status'] != 'ok' for r in records) else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
