"""Retrieval: byte-level AAN document matching (docs/protocol.md §5.3).

Files (the `tsv_data` folder of the LRA release):
`new_aan_pairs.{train,eval,test}.tsv`, no header, tab-separated, quoting off,
five columns `label id1 id2 text1 text2`. LRA reads the label as a float and
casts it to int; we accept only values equal to 0 or 1 ('1', '1.0') and
reject anything else with the file and line.

Tokens, as LRA (`matching/input_pipeline.py`, tokenizer 'char'): each text
is cut to its first 10,000 bytes, byte-encoded (id = byte + 1, 0 = padding,
vocabulary 257), truncated to `max_length` (4000) and zero-padded, the two
documents independently. Documents are stored as raw bytes and padded at
batch time (147k pairs x 2 x 4000 ids would not fit comfortably in memory).

Model (not here, see lra_msmra/models.py): the dual encoder of docs/protocol.md
§3.2; LRA's head (position-0 pooling, `[u, v]`) or Xiong et al.'s (mean pooling,
`[u, v, u*v, u-v]`) by config. LRA's training script crashes at HEAD (P1);
this pipeline with that model is the fix.

Where we differ: LRA drops the last partial batch of every split
(17,408 of 17,437 test pairs); we evaluate every pair once. A trailing
carriage return of a line is dropped (files written with CRLF line ends).

With `config.data.generate=True`, tiny mock TSVs in the official format are
generated into `<workdir>/data/retrieval` (`generate_dataset`) and read back
by the same reader. `data_dir` may be the `tsv_data` folder itself or a prepared
folder (`python -m lra_msmra.data.prepare`) that contains it.

config.data keys:
  max_length: bytes kept per document.
  pad_to_length: zero-pad further to this length (0 = max_length).
  shuffle: 'examples' or 'batches' (P10; LRA shuffles examples here).
  generate: True for mock pairs instead of data_dir.
  generator: {num_train, num_valid, num_test, seed}, used only with
    generate.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import numpy as np

from lra_msmra.data import pipeline

VOCAB_SIZE = 257  # byte + 1; 0 = padding.
NUM_CLASSES = 2
PREFIX = 'new_aan_pairs'
SPLITS = {'train': 'train', 'eval': 'eval', 'test': 'test'}
SUBDIR = 'tsv_data'
NUM_COLUMNS = 5  # label, id1, id2, text1, text2
# LRA keeps the first 10,000 bytes of a text before encoding.
TEXT_CUT = 10000
BATCH_SHUFFLE_WINDOW = 2048  # LRA's shuffle buffer, in batches mode.
# Bumped whenever generated data changes, so stale workdir data is redone.
GENERATOR_VERSION = 2


# Generated abstracts open with their topic's name; the names start with
# different letters, so even LRA's first-byte pooling (P2) can see the topic.
_TOPICS = (
    ('Attention', 'transformer', 'encoder', 'decoder', 'translation'),
    ('Parsing', 'treebank', 'grammar', 'dependency', 'constituent'),
    ('Morphology', 'stem', 'affix', 'inflection', 'lemma'),
    ('Dialogue', 'speaker', 'turn', 'utterance', 'agent'),
)
_FILLER = ('we', 'propose', 'a', 'method', 'for', 'the', 'task', 'of',
           'results', 'show', 'that', 'our', 'model', 'improves', 'on',
           'baseline', 'corpus', 'and', 'evaluation', 'naïve')


def split_path(data_dir: str, split: str) -> str:
  return os.path.join(data_dir, f'{PREFIX}.{split}.tsv')


def read_tsv(path: str) -> tuple[list[np.ndarray], list[np.ndarray],
                                 np.ndarray]:
  """Reads one AAN split; returns (text1 bytes, text2 bytes, labels).

  Texts come back as uint8 arrays of their first 10,000 bytes.

  Raises:
    FileNotFoundError: the file is missing.
    ValueError: a malformed line, naming the file and line.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(
        f'Retrieval file {path} not found. Point config.data_dir at the '
        f'`{SUBDIR}` folder of the LRA release (or at the folder written by '
        '`python -m lra_msmra.data.prepare`).')
  texts1, texts2, labels = [], [], []
  with open(path, 'rb') as f:
    for line_no, line in enumerate(f, start=1):
      line = line.rstrip(b'\n')
      if line.endswith(b'\r'):
        line = line[:-1]
      if not line:
        raise ValueError(f'{path}:{line_no}: empty line.')
      # Quoting is off: a tab always separates columns.
      fields = line.split(b'\t')
      if len(fields) != NUM_COLUMNS:
        raise ValueError(f'{path}:{line_no}: expected {NUM_COLUMNS} '
                         'tab-separated columns (label, id1, id2, text1, '
                         f'text2), got {len(fields)}.')
      try:
        value = float(fields[0])
      except ValueError:
        value = None
      if value not in (0.0, 1.0):
        raise ValueError(f'{path}:{line_no}: label {fields[0][:20]!r} is not '
                         '0 or 1.')
      labels.append(int(value))
      texts1.append(np.frombuffer(fields[3][:TEXT_CUT], np.uint8))
      texts2.append(np.frombuffer(fields[4][:TEXT_CUT], np.uint8))
  if not labels:
    raise ValueError(f'{path}: no examples.')
  return texts1, texts2, np.array(labels, np.int32)


def write_tsv(path: str, rows: list[tuple[int, str, str, str, str]]) -> None:
  """Writes rows in the official format (no header, tabs, no quoting)."""
  with open(path, 'wb') as f:
    for row in rows:
      fields = [str(x) for x in row]
      if any('\t' in x or '\n' in x for x in fields):
        raise ValueError(f'A field of {row!r} holds a tab or newline.')
      f.write('\t'.join(fields).encode('utf-8') + b'\n')


def _paper(rng: np.random.Generator, topic: int) -> str:
  words = [_TOPICS[topic][0] + ':']
  for _ in range(int(rng.integers(15, 45))):
    pool = _TOPICS[topic][1:] if rng.random() < 0.3 else _FILLER
    words.append(pool[int(rng.integers(len(pool)))])
  return ' '.join(words) + '.'


def generate_examples(num: int, seed: int
                      ) -> list[tuple[int, str, str, str, str]]:
  """Pairs of generated abstracts; label 1 iff both share their topic.

  A stand-in for "paper 1 cites paper 2" that a small model can learn: each
  abstract opens with its topic's name and mixes topic words into filler.
  """
  rng = np.random.default_rng(seed)
  rows = []
  for i in range(num):
    label = int(rng.integers(2))
    t1 = int(rng.integers(len(_TOPICS)))
    t2 = t1 if label else int((t1 + rng.integers(1, len(_TOPICS))) %
                              len(_TOPICS))
    id1, id2 = f'P{seed:02d}-{2 * i:05d}', f'P{seed:02d}-{2 * i + 1:05d}'
    rows.append((label, id1, id2, _paper(rng, t1), _paper(rng, t2)))
  return rows


def generate_dataset(output_dir: str, *, num_train: int, num_valid: int,
                     num_test: int, seed: int) -> dict[str, str]:
  """Writes `new_aan_pairs.{train,eval,test}.tsv`; returns their paths."""
  os.makedirs(output_dir, exist_ok=True)
  paths = {}
  for i, (split, num) in enumerate((('train', num_train), ('eval', num_valid),
                                    ('test', num_test))):
    paths[split] = split_path(output_dir, split)
    write_tsv(paths[split], generate_examples(num, seed + 1000 * i))
  return paths


def _check_data(data: Any) -> None:
  """Retrieval's own check: LRA keeps at most TEXT_CUT bytes per text."""
  if data.max_length > TEXT_CUT:
    raise ValueError(f'config.data.max_length={data.max_length} exceeds the '
                     f'{TEXT_CUT} bytes LRA keeps per text.')


TASK = pipeline.Task(
    name='retrieval', vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
    dual=True,
    data_keys=frozenset({'max_length', 'pad_to_length', 'shuffle'}),
    generator_keys=frozenset({'num_test', 'num_train', 'num_valid', 'seed'}),
    synthetic='mock', prepare=pipeline.RELEASE_HINT,
    length=lambda data: data.max_length, extra_check=_check_data)
get_model_spec = TASK.model_spec


def _resolve_data_dir(data_dir: str) -> str:
  """`data_dir` itself if it holds the TSVs, else its `tsv_data` folder."""
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(
        f'config.data_dir={data_dir!r} is not a directory. It must hold '
        f'{PREFIX}.{{train,eval,test}}.tsv (the `{SUBDIR}` folder of the LRA '
        'release) or be a folder written by `python -m '
        'lra_msmra.data.prepare`.')
  sub = os.path.join(data_dir, SUBDIR)
  if not os.path.exists(split_path(data_dir, 'train')) and os.path.isdir(sub):
    return sub
  return data_dir


def _generated_dir(config: Any, workdir: str) -> str:
  """Generates (once) the TSVs described by config.data.generator."""
  gen = config.data.generator.to_dict()
  out = os.path.join(workdir, 'data', 'retrieval')
  return pipeline.generate_once(
      out, dict(gen, version=GENERATOR_VERSION),
      lambda: generate_dataset(out, **gen))


def get_datasets(config: Any, workdir: str,
                 spec: Optional[Mapping[str, Any]] = None
                 ) -> pipeline.TaskData:
  """The AAN splits for `config` (see the module docstring).

  Batches carry `inputs` (text1) and `inputs2` (text2), both int32
  `[batch, length]`, and `targets` `[batch]`. `spec` is
  `get_model_spec(config)` if the caller has it (see `pipeline.Task.begin`).
  """
  source, spec = TASK.begin(config, spec)
  data_dir = (_generated_dir(config, workdir) if source == 'mock' else
              _resolve_data_dir(config.data_dir))
  splits = {}
  for name, split in SPLITS.items():
    texts1, texts2, labels = read_tsv(split_path(data_dir, split))
    splits[name] = pipeline.RaggedSource(
        {'inputs': texts1, 'inputs2': texts2}, {'targets': labels},
        length=spec['max_len'], id_offset=1)
  train = pipeline.with_train_shuffle(splits['train'], config.data.shuffle,
                                      BATCH_SHUFFLE_WINDOW)
  notes = {
      'data_dir': data_dir,
      'data_source': source,
      'max_length': config.data.max_length,
      'model': 'dual encoder (P1 fix), shared weights, no cross-attention',
      'dual_interaction': config.model.dual_interaction,
      # P2: without a CLS token, 'CLS' pooling reads each document's first
      # byte.
      'cls_pooling_reads_first_byte': config.model.pooling == 'CLS',
      **pipeline.fidelity_notes(config, train.train_shuffle),
  }
  return pipeline.TaskData(
      train=train, eval=splits['eval'], test=splits['test'], spec=spec,
      notes=notes)
