"""ListOps: the LRA generator algorithm and a reader of the released TSVs.

Generator (docs/protocol.md §6): the LRA tree sampler (`lra_benchmarks/data/
listops.py`) with the same random draws in the same order, the same
serialisation and the same label semantics (MED = int(numpy.median), SM = sum
mod 10), writing the official format: `{task}_{train,val,test}.tsv`, a header
`Source<TAB>Target`, `\\r\\n` line ends. Unlike LRA it is seeded, and it keeps
sampled trees in sampling order instead of Python set order, so a seed always
gives the same files.

Reader (docs/protocol.md §5.1): `]` becomes `X`, parentheses are dropped, tokens
are split on whitespace and mapped through a fixed, sorted vocabulary, so token
ids never depend on the process (fixes P6). Ids 1..15 are the 15 symbols, 0 is
padding and 16 is the out-of-vocabulary id LRA's encoder reserves, giving LRA's
vocabulary size of 17; our reader rejects unknown tokens instead of mapping
them there. Sequences are zero-padded to `max_length` (2000).

Surface baselines (`surface_baselines`): lookup tables fitted on the train
split that read only the root operator (and the digits directly under it).
They say how much accuracy needs no evaluation of the expression at all.

Command lines::

  python -m lra_msmra.data.listops --output_dir DIR [--num_train 96000 ...]
  python -m lra_msmra.data.listops --baselines DIR
"""

from __future__ import annotations

import csv
import gzip
import inspect
import os
import random
import sys
import time
from typing import Any, Mapping, Optional

import numpy as np

from lra_msmra import config_lib
from lra_msmra.data import pipeline

MIN, MAX, MED, SUM_MOD = '[MIN', '[MAX', '[MED', '[SM'
OPERATORS = (MIN, MAX, MED, SUM_MOD)  # [FIRST and [LAST are unused in LRA.
END = ']'
VALUES = tuple(range(10))
VALUE_P = 0.25

# Fixed vocabulary: sorted symbols get ids 1..15; 0 = padding; 16 = OOV slot.
SYMBOLS = tuple(sorted([str(v) for v in VALUES] + ['X'] + list(OPERATORS)))
VOCAB = {s: i + 1 for i, s in enumerate(SYMBOLS)}
VOCAB_SIZE = len(SYMBOLS) + 2
NUM_CLASSES = 10
SPLITS = ('train', 'val', 'test')
HEADER = ['Source', 'Target']

# ----------------------------------------------------------------- generator


def _median(args: list[int]) -> int:
  """int(numpy.median(args)) for non-negative integers, in pure Python."""
  v = sorted(args)
  n = len(v)
  return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) // 2


def _tree_sampler(rng: random.Random, max_depth: int, max_args: int):
  """A sampler that draws exactly as LRA's tree sampler and returns, in one
  pass, (serialised string, label, token length) instead of the tree.

  LRA draws random() (only below max_depth), then either choice(values), or
  randint(2, max_args), the children in order, and finally
  choice(operators); it writes every pair (a, b) of its nested-pair tree as
  `( a b )` and labels the tree by a left fold. This sampler calls
  `rng.random` and `rng.getrandbits` in the order `random.Random`'s own
  `choice`/`randint` would (both reduce to `_randbelow`: draw
  `n.bit_length()` bits until the value is below n), so a seed gives the same
  examples as a tree-based reference written as LRA's code reads
  (tests/data/listops_reference.py), about five times faster. A test
  compares the two over many seeds and settings.
  """
  draw = rng.random
  bits = rng.getrandbits
  width = max_args - 1  # randint(2, max_args) = 2 + randbelow(width)
  width_bits = width.bit_length()
  digits = tuple(str(v) for v in VALUES)
  fold = {MIN: min, MAX: max, MED: _median,
          SUM_MOD: lambda args: sum(args) % 10}

  def below(n: int, k: int) -> int:
    r = bits(k)
    while r >= n:
      r = bits(k)
    return r

  def node(depth: int) -> tuple[str, int, int]:
    if depth >= max_depth or draw() > VALUE_P:
      v = below(10, 4)
      return digits[v], v, 1
    num_children = 2 + below(width, width_bits)
    strings, values, length = [], [], 2
    for _ in range(num_children):
      s, v, n = node(depth + 1)
      strings.append(s)
      values.append(v)
      length += n
    op = OPERATORS[below(4, 3)]
    text = ('( ' * num_children + '( ' + op + ' ' + strings[0] + ' )' +
            ''.join(' ' + s + ' )' for s in strings[1:]) + ' ] )')
    return text, fold[op](values), length

  return lambda: node(1)


def generate_examples(num_examples: int, *, min_length: int = 500,
                      max_length: int = 2000, max_depth: int = 10,
                      max_args: int = 10, seed: int = 0
                      ) -> list[tuple[str, int]]:
  """Distinct (source, label) pairs with min_length < length < max_length.

  Trees are drawn as LRA draws them (`_tree_sampler`) and kept in sampling
  order; a tree is identified by its serialisation, which is one-to-one
  (fully parenthesised).
  """
  if min_length + 1 >= max_length:
    raise ValueError(f'min_length={min_length} leaves no length below '
                     f'max_length={max_length} (both are exclusive).')
  sample = _tree_sampler(random.Random(seed), max_depth, max_args)
  examples: dict[str, int] = {}
  attempts = 0
  while len(examples) < num_examples:
    source, label, length = sample()
    attempts += 1
    if min_length < length < max_length:
      examples.setdefault(source, label)
    if attempts > 1000 * max(num_examples, 100) and not examples:
      raise ValueError('No tree fits the length band; widen '
                       'min_length/max_length or raise max_depth.')
  return list(examples.items())


def write_tsv(path: str, rows: list[tuple[str, int]]) -> None:
  """Writes the official format: header, tab separated, \\r\\n line ends.

  The file appears atomically, so processes of a multi-host run that
  generate the same data into a shared folder never read a partial file.
  """
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w', newline='') as f:
    writer = csv.writer(f, delimiter='\t', lineterminator='\r\n')
    writer.writerow(HEADER)
    writer.writerows(rows)
  os.replace(tmp, path)


def label_histogram(rows: list[tuple[str, int]]) -> list[int]:
  counts = [0] * NUM_CLASSES
  for _, label in rows:
    counts[label] += 1
  return counts


def generate_dataset(output_dir: str, *, num_train: int = 96000,
                     num_valid: int = 2000, num_test: int = 2000,
                     task_name: str = 'basic', **kwargs) -> dict[str, str]:
  """Writes `{task_name}_{train,val,test}.tsv` once; returns their paths.

  `generator.json` (written last, see `pipeline.generate_once`) records the
  generator settings, seed included, and the generation time and, per
  split, the example count, label histogram and token-length range. A
  folder that already holds the data of these settings is left as it is.
  Readers use the stamp to record the data as generated.
  """
  settings = dict(num_train=num_train, num_valid=num_valid,
                  num_test=num_test, **kwargs)
  paths = {split: os.path.join(output_dir, f'{task_name}_{split}.tsv')
           for split in SPLITS}

  def write() -> dict[str, Any]:
    os.makedirs(output_dir, exist_ok=True)
    start = time.time()
    examples = generate_examples(num_train + num_valid + num_test, **kwargs)
    seconds = time.time() - start
    cuts = {'train': examples[:num_train],
            'val': examples[num_train:num_train + num_valid],
            'test': examples[num_train + num_valid:]}
    splits = {}
    for split, rows in cuts.items():
      write_tsv(paths[split], rows)
      lengths = [len(tokenize(source)) for source, _ in rows]
      splits[split] = {'examples': len(rows),
                       'label_histogram': label_histogram(rows),
                       'min_tokens': min(lengths), 'max_tokens': max(lengths),
                       'mean_tokens': round(sum(lengths) / len(lengths), 1)}
    return {'generation_seconds': round(seconds, 1), 'splits': splits}

  pipeline.generate_once(output_dir,
                         {'settings': settings, 'task_name': task_name},
                         write)
  return paths


def _keyword_defaults(fn: Any) -> dict[str, Any]:
  return {name: p.default for name, p in inspect.signature(fn).parameters.items()
          if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}


# What `generate_dataset` uses for each generator setting a call leaves out
# (the official generator's settings, seed 0), read from the signatures.
GENERATOR_DEFAULTS = {
    k: v for k, v in {**_keyword_defaults(generate_examples),
                      **_keyword_defaults(generate_dataset)}.items()
    if k != 'task_name'}


def read_stamp(folder: str) -> dict[str, Any] | None:
  """The generator settings and record of a folder our generator wrote
  (`{'settings', 'task_name', 'generation_seconds', 'splits'}`), or None
  for any other folder (released data)."""
  stamp = pipeline.read_generator_stamp(folder)
  if stamp is None:
    return None
  return {**stamp['spec'], **stamp['details']}


# -------------------------------------------------------------------- reader


def tokenize(source: str) -> list[str]:
  """LRA preprocessing: `]` -> `X`, drop parentheses, split on whitespace."""
  return source.replace(']', 'X').replace('(', '').replace(')', '').split()


def read_tsv(path: str, max_length: int = 2000
             ) -> tuple[list[np.ndarray], np.ndarray]:
  """Reads one split; returns (token id arrays, labels).

  Raises:
    FileNotFoundError: the file is missing.
    ValueError: malformed content, with the file and line.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(
        f'ListOps file {path} not found (nor {os.path.basename(path)}.gz). '
        'Point config.data_dir at the `listops-1000` folder of the LRA '
        'release, or at the folder `python -m lra_msmra.data.prepare` '
        'wrote; see the README for how to get the data.')
  opener = gzip.open if path.endswith('.gz') else open
  try:
    return _read_rows(path, opener, max_length)
  except UnicodeDecodeError as e:
    raise ValueError(_not_utf8(path, opener, e)) from None


def _not_utf8(path: str, opener: Any, error: UnicodeDecodeError) -> str:
  """The message for a file that is not UTF-8: its first bad line."""
  with opener(path, 'rb') as f:
    for line_no, line in enumerate(f, start=1):
      try:
        line.decode('utf-8')
      except UnicodeDecodeError as e:
        return (f'{path}:{line_no}: byte 0x{line[e.start]:02x} at column '
                f'{e.start + 1} is not UTF-8 text. ListOps files are ASCII: '
                'copy the file again from the LRA release, or regenerate it '
                'with `python -m lra_msmra.data.prepare --generate_listops`.')
  return f'{path}: not UTF-8 text ({error}).'


def _read_rows(path: str, opener: Any, max_length: int
               ) -> tuple[list[np.ndarray], np.ndarray]:
  """`read_tsv`'s parsing and checks; decoding errors propagate."""
  ids, labels = [], []
  with opener(path, 'rt', encoding='utf-8', newline='') as f:
    reader = csv.reader(f, delimiter='\t')
    header = next(reader, None)
    if header != HEADER:
      raise ValueError(f'{path}:1: expected the header {HEADER}, got '
                       f'{header}.')
    for line_no, row in enumerate(reader, start=2):
      if len(row) != 2:
        raise ValueError(f'{path}:{line_no}: expected 2 tab-separated '
                         f'columns (Source, Target), got {len(row)}.')
      source, target = row
      try:
        label = int(target)
      except ValueError:
        raise ValueError(f'{path}:{line_no}: Target {target!r} is not an '
                         'integer.') from None
      if not 0 <= label < NUM_CLASSES:
        raise ValueError(f'{path}:{line_no}: Target {label} is outside '
                         f'0..{NUM_CLASSES - 1}.')
      tokens = tokenize(source)
      unknown = sorted({t for t in tokens if t not in VOCAB})
      if unknown:
        raise ValueError(f'{path}:{line_no}: unknown token(s) {unknown}; '
                         f'valid symbols: {list(SYMBOLS)}.')
      if len(tokens) > max_length:
        raise ValueError(
            f'{path}:{line_no}: {len(tokens)} tokens exceed '
            f'config.data.max_length={max_length}. These files need the full '
            'ListOps length: use a config without `runlocal`, or pass '
            '--config.data.max_length=2000.')
      ids.append(np.array([VOCAB[t] for t in tokens], dtype=np.uint8))
      labels.append(label)
  if not labels:
    raise ValueError(f'{path}: no examples after the header.')
  return ids, np.array(labels, dtype=np.int32)


def _check_data(data: Any) -> None:
  """ListOps's own checks of config.data: file prefix and generator."""
  if not isinstance(data.task_name, str) or not data.task_name:
    raise ValueError(f'config.data.task_name={data.task_name!r} must be the '
                     "file prefix of the TSVs, e.g. 'basic'.")
  gen = data.generator
  for key, low in (('num_train', 1), ('num_valid', 1), ('num_test', 1),
                   ('min_length', 0), ('max_depth', 1), ('max_args', 2),
                   ('seed', 0)):
    if not config_lib.is_int(gen[key]) or gen[key] < low:
      raise ValueError(f'config.data.generator.{key}={gen[key]!r} must be an '
                       f'integer >= {low}.')
  if (not config_lib.is_int(gen.max_length) or
      gen.max_length <= gen.min_length + 1):
    raise ValueError(
        f'config.data.generator.max_length={gen.max_length!r} must be an '
        f'integer above min_length + 1 = {gen.min_length + 1} (both bounds '
        'are exclusive).')
  # Generated expressions have at most generator.max_length - 1 tokens; the
  # reader rejects any longer than data.max_length (checked after this).
  if (data.generate and config_lib.is_int(data.max_length) and
      gen.max_length - 1 > data.max_length):
    raise ValueError(
        f'config.data.generator.max_length={gen.max_length} allows '
        f'expressions of {gen.max_length - 1} tokens, more than '
        f'config.data.max_length={data.max_length}; lower the first or raise '
        'the second.')


TASK = pipeline.Task(
    name='listops', vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
    dual=False,
    data_keys=frozenset({'task_name', 'max_length', 'pad_to_length'}),
    generator_keys=frozenset({'num_train', 'num_valid', 'num_test',
                              'min_length', 'max_length', 'max_depth',
                              'max_args', 'seed'}),
    synthetic='generated',
    prepare=(pipeline.RELEASE_HINT + ', or write it with our seeded '
             'implementation of the LRA generator: `python -m '
             'lra_msmra.data.prepare --generate_listops --out DIR`'),
    length=lambda data: data.max_length, extra_check=_check_data,
    generator_defaults=GENERATOR_DEFAULTS)
get_model_spec = TASK.model_spec


def _generated_dir(config: Any, workdir: str) -> str:
  """Generates (once) the data described by config.data.generator."""
  out = os.path.join(workdir, 'data', 'listops')
  generate_dataset(out, task_name=config.data.task_name,
                   **config.data.generator.to_dict())
  return out


def get_datasets(config: Any, workdir: str,
                 spec: Optional[Mapping[str, Any]] = None
                 ) -> pipeline.TaskData:
  """The ListOps splits for `config` (see the module docstring).

  With `config.data.generate`, a dataset is generated from
  `config.data.generator` into `<workdir>/data/listops` (once) and read back.
  `spec` is `get_model_spec(config)` if the caller has it (see
  `pipeline.Task.begin`).
  """
  source, spec = TASK.begin(config, spec)
  if source == 'generated':
    data_dir = _generated_dir(config, workdir)
  else:
    data_dir = _release_dir(config.data_dir, config.data.task_name)
  splits, labels = {}, {}
  for split in SPLITS:
    path = split_path(data_dir, config.data.task_name, split)
    ids, labels[split] = read_tsv(path, config.data.max_length)
    splits[split] = pipeline.ArraySource({
        'inputs': pipeline.pad_or_truncate(ids, spec['max_len'], np.uint8),
        'targets': labels[split]})
  # Files our generator wrote carry its stamp, wherever they were written.
  stamp = read_stamp(data_dir)
  notes = {'data_dir': data_dir,
           'data_source': 'release' if stamp is None else 'generated',
           'vocabulary': 'fixed sorted (P6 fix)'}
  if stamp is not None:
    notes['generator'] = TASK.generator_settings(stamp['settings'])
  return pipeline.TaskData(
      train=splits['train'], eval=splits['val'], test=splits['test'],
      spec=spec, notes=notes)


def split_path(data_dir: str, task_name: str, split: str) -> str:
  """`{task_name}_{split}.tsv` in `data_dir`, or its `.tsv.gz` if only that
  exists (the released files are often kept compressed)."""
  path = os.path.join(data_dir, f'{task_name}_{split}.tsv')
  if not os.path.exists(path) and os.path.exists(path + '.gz'):
    return path + '.gz'
  return path


def _release_dir(data_dir: str, task_name: str) -> str:
  """The folder holding the TSVs: `data_dir` or its `listops-1000/`."""
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(
        f'config.data_dir={data_dir!r} is not a directory. It must hold '
        f'{task_name}_{{train,val,test}}.tsv (the `listops-1000` folder of '
        'the LRA release), or be the folder written by `python -m '
        'lra_msmra.data.prepare`.')
  # The prepared folder (lra_msmra.data.prepare) holds listops-1000/.
  nested = os.path.join(data_dir, 'listops-1000')
  if (not os.path.exists(split_path(data_dir, task_name, 'train')) and
      os.path.exists(split_path(nested, task_name, 'train'))):
    return nested
  return data_dir


# ------------------------------------------------------- surface baselines


def root_features(tokens: list[str]) -> dict[str, Any]:
  """What an expression shows without being evaluated.

  `tokens` are the reader's tokens (`tokenize`). Returns the root operator
  (None for a bare digit) and the digits that are direct arguments of the
  root (not inside a sub-expression).
  """
  if not tokens or tokens[0] not in OPERATORS:
    return {'root': None, 'direct_digits': [int(t) for t in tokens[:1]]}
  depth, digits = 0, []
  for token in tokens[1:]:
    if token in OPERATORS:
      depth += 1
    elif token == 'X':
      depth -= 1
    elif depth == 0:
      digits.append(int(token))
  return {'root': tokens[0], 'direct_digits': digits}


def _root_key(f: dict[str, Any]) -> Any:
  return f['root']


def _root_extremes_key(f: dict[str, Any]) -> Any:
  d = f['direct_digits']
  return (f['root'], min(d) if d else None, max(d) if d else None)


BASELINES = {
    'most frequent train label': lambda f: None,
    'root operator': _root_key,
    'root operator, min and max of its direct digits': _root_extremes_key,
}


def surface_baselines(splits: dict[str, list[tuple[list[str], int]]]
                      ) -> dict[str, dict[str, float]]:
  """Accuracy of lookup-table classifiers that never evaluate an expression.

  Each baseline maps a key of the expression (`BASELINES`: nothing, the
  root operator, the root operator with the smallest and largest digit
  directly under it) to the most frequent label of that key on
  `splits['train']` (ties: the smaller label; unseen keys: the train
  majority class), and is scored on every split.

  Args:
    splits: split name -> [(tokens, label)], with a 'train' split.

  Returns:
    baseline name -> split name -> accuracy.
  """
  if not splits.get('train'):
    raise ValueError('surface_baselines needs a non-empty train split.')
  features = {name: [(root_features(t), y) for t, y in rows]
              for name, rows in splits.items()}

  def best(counts):
    return min(counts, key=lambda y: (-counts[y], y))

  out = {}
  for name, key in BASELINES.items():
    tables, overall = {}, {}
    for f, y in features['train']:
      table = tables.setdefault(key(f), {})
      table[y] = table.get(y, 0) + 1
      overall[y] = overall.get(y, 0) + 1
    fallback = best(overall)
    predict = {k: best(v) for k, v in tables.items()}
    out[name] = {
        split: sum(predict.get(key(f), fallback) == y for f, y in rows) /
        len(rows) for split, rows in features.items()}
  return out


def read_tokens(path: str) -> list[tuple[list[str], int]]:
  """One split's (tokens, label) pairs, checked as `read_tsv` checks them."""
  ids, labels = read_tsv(path, max_length=sys.maxsize)
  return [([SYMBOLS[i - 1] for i in row], int(y))
          for row, y in zip(ids, labels)]


def print_baselines(data_dir: str, task_name: str = 'basic') -> None:
  if not os.path.isdir(data_dir):
    raise SystemExit(f'error: --baselines {data_dir}: not a directory; give '
                     f'the folder holding {task_name}_{{train,val,test}}.tsv.')
  folder = _release_dir(data_dir, task_name)
  splits = {s: read_tokens(split_path(folder, task_name, s)) for s in SPLITS}
  table = surface_baselines(splits)
  print(f'ListOps surface baselines, {folder} '
        f'({", ".join(f"{s} {len(r):,}" for s, r in splits.items())}); '
        'accuracy in %, tables fitted on train:\n')
  print('| baseline | ' + ' | '.join(SPLITS) + ' |')
  print('|---|' + '---|' * len(SPLITS))
  for name, accs in table.items():
    print(f'| {name} | ' +
          ' | '.join(f'{100 * accs[s]:.2f}' for s in SPLITS) + ' |')


def main(argv: list[str]) -> None:
  import argparse  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(
      description='Generate ListOps TSVs as LRA does (--output_dir), or '
      'print the surface baselines of a ListOps folder (--baselines).')
  mode = p.add_mutually_exclusive_group(required=True)
  mode.add_argument('--output_dir', help='folder to write the three TSVs to')
  mode.add_argument('--baselines', metavar='DATA_DIR',
                    help='folder with {task_name}_{train,val,test}.tsv')
  p.add_argument('--task_name', default='basic')
  p.add_argument('--num_train', type=int, default=96000)
  p.add_argument('--num_valid', type=int, default=2000)
  p.add_argument('--num_test', type=int, default=2000)
  p.add_argument('--min_length', type=int, default=500)
  p.add_argument('--max_length', type=int, default=2000)
  p.add_argument('--max_depth', type=int, default=10)
  p.add_argument('--max_args', type=int, default=10)
  p.add_argument('--seed', type=int, default=0)
  args = vars(p.parse_args(argv))
  if args['baselines']:
    defaults = {k: p.get_default(k) for k in args}
    changed = sorted(k for k in args if args[k] != defaults[k] and
                     k not in ('baselines', 'output_dir', 'task_name'))
    if changed:
      p.error(f'--baselines reads existing files; generator flags '
              f'{["--" + k for k in changed]} do not apply to it.')
    print_baselines(args['baselines'], args['task_name'])
    return
  args.pop('baselines')
  paths = generate_dataset(args.pop('output_dir'), **args)
  for split, path in paths.items():
    print(f'{split}: {path}')


if __name__ == '__main__':
  main(sys.argv[1:])
