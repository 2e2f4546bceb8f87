r"""Does a change keep behaviour? A snapshot of what the library computes,
and the comparison of two snapshots.

  python -m lra_msmra_tools.behaviour snapshot --out A.npz
  (change the code, or check out another commit)
  python -m lra_msmra_tools.behaviour snapshot --out B.npz
  python -m lra_msmra_tools.behaviour compare A.npz B.npz

A snapshot holds, for every config file of ListOps at its `runlocal` size
(every registered mechanism, through the task's configs) and for each
attention implementation the mechanism has that runs on this machine
(`'xla'`, and `'pallas'` in Pallas' interpreter on a CPU):

* the parameter tree (paths, shapes, dtypes, values) from a fixed seed;
* the logits of a fixed batch with padding, and the gradients of its
  training loss (dropout on, a fixed key) with respect to every parameter;

and for the trainer, one tiny ListOps run (tests/configs/tiny_listops.py,
4 steps): every `metrics.jsonl` record and the fields of `results.json`
that say what was computed (the accuracies and losses, steps, parameter
count, FLOPs per step, setting fingerprint), without the timing fields.

`compare` prints each difference (arrays: the largest absolute difference
and how many elements differ; records: the key and both values) and exits
1 when there is one; "0 differences" and status 0 otherwise. Arrays are
compared bit for bit. The script uses only what the library had before it
was written (`models.create_model`, `steps.loss_fn`, `config_lib`,
`train.train_and_evaluate`), so it can snapshot an older checkout: run it
by path with that checkout first on `PYTHONPATH`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
from typing import Any, Sequence

# Timing and machine fields of the records: they say how fast, not what.
VOLATILE = ('steps_per_sec', 'seconds', 'tflops', 'mfu', 'wall', 'time',
            'eta', 'examples_per_sec', 'tokens_per_sec', 'partial_window')
RESULT_FIELDS = ('final', 'best', 'reported', 'test_accuracy',
                 'test_examples', 'test_majority_label', 'test_majority_rate',
                 'num_params', 'train_flops_per_step', 'setting_fingerprint',
                 'task', 'attention', 'protocol')
LENGTH = 40


def _root() -> str:
  import lra_msmra  # pylint: disable=g-import-not-at-top
  return os.path.dirname(os.path.dirname(os.path.abspath(lra_msmra.__file__)))


def _flat(tree: Any, prefix: str) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    name = '/'.join(str(getattr(k, 'key', getattr(k, 'idx', k)))
                    for k in path)
    out[f'{prefix}/{name}'] = np.asarray(jax.device_get(leaf))
  return out


def _batch(spec: dict[str, Any]) -> dict[str, Any]:
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  length = min(LENGTH, spec['max_len'])
  ids = rng.randint(1, spec['vocab_size'], (2, length)).astype(np.int32)
  ids[1, length // 2:] = 0  # Padding in one row.
  batch = {'inputs': ids}
  if spec.get('dual'):
    batch['inputs2'] = ids[::-1].copy()
  batch['targets'] = np.asarray([0, 1], np.int32) % spec['num_classes']
  return batch


def mechanism_arrays(config_path: str, implementation: str
                     ) -> dict[str, Any]:
  """Parameters, logits and loss gradients of one config file's runlocal
  model under `implementation`."""
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from lra_msmra import config_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra import data as data_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra import models  # pylint: disable=g-import-not-at-top
  from lra_msmra import steps  # pylint: disable=g-import-not-at-top
  module = config_lib.load_sibling(config_path,
                                   os.path.basename(config_path)[:-3])
  config = module.get_config('runlocal')
  config.model.attention_kw.implementation = implementation
  spec = data_lib.get_model_spec(config)
  model = models.create_model(config.model, **spec)
  batch = _batch(spec)
  params = model.init({'params': jax.random.PRNGKey(0),
                       'dropout': jax.random.PRNGKey(1)},
                      {k: v for k, v in batch.items() if k != 'targets'},
                      deterministic=True)['params']
  logits = model.apply({'params': params}, batch, deterministic=True)
  grads, _ = jax.grad(functools.partial(steps.loss_fn, model=model),
                      has_aux=True)(params, batch, jax.random.PRNGKey(2))
  return {**_flat(params, 'params'), **_flat({'logits': logits}, 'out'),
          **_flat(grads, 'grads')}


def _implementations(name: str) -> list[str]:
  from lra_msmra import attention  # pylint: disable=g-import-not-at-top
  cls = attention.REGISTRY[name]
  return [i for i in cls.IMPLEMENTATIONS if i in ('xla', 'pallas')]


def trainer_records(workdir: str) -> dict[str, Any]:
  """metrics.jsonl and results.json of the tiny ListOps run, less timing."""
  from lra_msmra import config_lib  # pylint: disable=g-import-not-at-top
  from lra_msmra import train  # pylint: disable=g-import-not-at-top
  path = os.path.join(_root(), 'tests', 'configs', 'tiny_listops.py')
  config = config_lib.load_sibling(path, 'tiny_listops').get_config(None)
  results = train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'tensorboard', 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f if line.strip()]
  keep = lambda k: not any(v in k for v in VOLATILE)
  return {'metrics': [{k: v for k, v in r.items() if keep(k)}
                      for r in records],
          'results': {k: results.get(k) for k in RESULT_FIELDS}}


def snapshot(out: str) -> int:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from lra_msmra import config_lib  # pylint: disable=g-import-not-at-top
  arrays: dict[str, Any] = {}
  cases = []
  for path in sorted(glob.glob(os.path.join(_root(), 'configs', 'listops',
                                            '*.py'))):
    if os.path.basename(path) == 'base.py':
      continue
    module = config_lib.load_sibling(path, os.path.basename(path)[:-3])
    name = module.get_config('runlocal').model.attention
    for implementation in _implementations(name):
      case = f'{os.path.basename(path)[:-3]}:{implementation}'
      print(f'snapshot: {case}', file=sys.stderr, flush=True)
      arrays.update({f'{case}/{k}': v for k, v in
                     mechanism_arrays(path, implementation).items()})
      cases.append(case)
  with tempfile.TemporaryDirectory() as workdir:
    records = trainer_records(os.path.join(workdir, 'run'))
  np.savez_compressed(out, __records__=np.asarray(json.dumps(
      {'cases': cases, **records}, sort_keys=True)), **arrays)
  print(f'{len(cases)} cases, {len(arrays)} arrays, the trainer\'s '
        f'{len(records["metrics"])} records: {out}')
  return 0


def compare(a_path: str, b_path: str) -> int:
  import numpy as np  # pylint: disable=g-import-not-at-top
  a, b = np.load(a_path), np.load(b_path)
  ra = json.loads(str(a['__records__']))
  rb = json.loads(str(b['__records__']))
  diffs = []
  for key in sorted(set(a.files) | set(b.files)):
    if key == '__records__':
      continue
    if key not in a.files or key not in b.files:
      diffs.append(f'{key}: only in {a_path if key in a.files else b_path}')
      continue
    x, y = a[key], b[key]
    if x.shape != y.shape or x.dtype != y.dtype:
      diffs.append(f'{key}: {x.dtype}{list(x.shape)} → '
                   f'{y.dtype}{list(y.shape)}')
    elif not np.array_equal(x, y, equal_nan=True):
      d = np.abs(x.astype(np.float64) - y.astype(np.float64))
      diffs.append(f'{key}: {int(np.sum(x != y))} of {x.size} elements '
                   f'differ, largest by {float(np.nanmax(d)):.3g}')
  for part in ('cases', 'metrics', 'results'):
    if ra.get(part) != rb.get(part):
      diffs.append(f'{part}: {json.dumps(ra.get(part))[:300]} → '
                   f'{json.dumps(rb.get(part))[:300]}')
  for line in diffs:
    print(line)
  print(f'{len(diffs)} differences ({len(ra["cases"])} cases, '
        f'{len(a.files) - 1} arrays, {len(ra["metrics"])} trainer records).')
  return 1 if diffs else 0


def main(argv: Sequence[str]) -> int:
  p = argparse.ArgumentParser(prog='python -m lra_msmra_tools.behaviour',
                              description=__doc__.split('\n\n')[0])
  sub = p.add_subparsers(dest='command', required=True)
  s = sub.add_parser('snapshot', help='write what the library computes')
  s.add_argument('--out', required=True, help='.npz file to write')
  c = sub.add_parser('compare', help='compare two snapshots')
  c.add_argument('a')
  c.add_argument('b')
  args = p.parse_args(argv)
  if args.command == 'snapshot':
    return snapshot(args.out)
  return compare(args.a, args.b)


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
