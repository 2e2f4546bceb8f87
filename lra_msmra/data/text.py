"""Text: byte-level IMDb review classification (docs/protocol.md §5.2).

As LRA (`text_classification/input_pipeline.py`):

* Data: TFDS `imdb_reviews` (plain_text); `train` for training and the
  `test` split for both validation and test, because IMDb has no validation
  split (P5). Model selection on "validation" is selection on test; this is
  recorded in the notes that go to results.json.
* Tokens: the UTF-8 bytes of the raw review (HTML such as `<br />`
  included), id = byte + 1, 0 = padding, vocabulary 257 (TFDS
  `ByteTextEncoder` without extra tokens). Truncated to `max_length`, then
  zero-padded to `pad_to_length` (or `max_length`).
* `max_length` is 1000 in LRA's config and 4000 in the papers (P4); both are
  configs (see configs/text/base.py).

Where we differ: LRA shuffles with a 256-example buffer; we reshuffle the
whole split every epoch, seeded (`data.shuffle`, P10). LRA's last evaluation
batch is partial; ours is padded with zero-weight copies, so every example
counts once either way.

With `config.data.generate=True` (runlocal, tests) generated reviews
(`synthetic_reviews`) stand in for the stored splits and are read as
`tfds.load` would read them (`tfds_io.from_examples`); TensorFlow and TFDS
are needed for the real data only (`pip install -e .[tfds]`).

config.data keys:
  max_length: bytes kept per review.
  pad_to_length: zero-pad further to this length (0 = max_length).
  shuffle: 'examples' or 'batches' (P10; LRA shuffles examples here).
  generate: True for mock reviews instead of data_dir.
  generator: {num_train, num_test, seed}, used only with generate.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from lra_msmra.data import pipeline
from lra_msmra.data import tfds_io

VOCAB_SIZE = 257  # byte + 1; 0 = padding.
NUM_CLASSES = 2
TFDS_NAME = 'imdb_reviews'
# Batches per shuffle window for data.shuffle='batches' (LRA's buffer size).
BATCH_SHUFFLE_WINDOW = 256


_POSITIVE = ('great', 'wonderful', 'superb', 'moving', 'brilliant', 'loved',
             'delightful', 'charming', 'masterpiece', 'fun')
_NEGATIVE = ('awful', 'boring', 'terrible', 'dull', 'waste', 'hated',
             'clumsy', 'annoying', 'mess', 'worst')
_NEUTRAL = ('the', 'film', 'movie', 'plot', 'actors', 'a', 'and', 'was',
            'story', 'scene', 'director', 'it', 'of', 'ending', 'music',
            'café', 'naïve')


TASK = pipeline.Task(
    name='text', vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
    dual=False,
    data_keys=frozenset({'max_length', 'pad_to_length', 'shuffle'}),
    generator_keys=frozenset({'num_test', 'num_train', 'seed'}),
    synthetic='mock',
    prepare=('download IMDb through TFDS once with `python -m '
             'lra_msmra.data.prepare --tfds --out DIR`'),
    length=lambda data: data.max_length)
get_model_spec = TASK.model_spec


def synthetic_reviews(num: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Generated reviews in IMDb's format, labelled by their sentiment words.

  Each review mixes neutral words with words from one sentiment lexicon
  (label 1 = positive, as in TFDS) and carries IMDb's `<br />` markup and a
  few multi-byte UTF-8 characters, so a small model can learn the label.

  Returns:
    (texts, labels): an object array of UTF-8 bytes `[num]` and int64
    `[num]`.
  """
  rng = np.random.default_rng(seed)
  texts, labels = [], np.zeros(num, np.int64)
  for i in range(num):
    label = int(rng.integers(2))
    lexicon = _POSITIVE if label else _NEGATIVE
    words = []
    for _ in range(int(rng.integers(20, 60))):
      pool = lexicon if rng.random() < 0.25 else _NEUTRAL
      words.append(pool[int(rng.integers(len(pool)))])
    cut = int(rng.integers(1, len(words)))
    text = ' '.join(words[:cut]) + '.<br /><br />' + ' '.join(words[cut:])
    texts.append(text.capitalize().encode('utf-8') + b'.')
    labels[i] = label
  return np.array(texts, dtype=object), labels


def _mock_examples(gen: Any) -> dict[str, dict[str, np.ndarray]]:
  examples = {}
  for i, (split, num) in enumerate((('train', gen.num_train),
                                    ('test', gen.num_test))):
    texts, labels = synthetic_reviews(num, gen.seed + i)
    examples[split] = {'text': texts, 'label': labels}
  return examples


def _source(split: dict[str, np.ndarray], name: str, max_len: int,
            max_length: int) -> pipeline.RaggedSource:
  labels = pipeline.check_labels(split['label'], NUM_CLASSES,
                                 f'{TFDS_NAME} {name}')
  # Bytes are stored raw (uint8) and shifted to ids at batch time.
  texts = [np.frombuffer(t, np.uint8)[:max_length] for t in split['text']]
  return pipeline.RaggedSource({'inputs': texts}, {'targets': labels},
                               length=max_len, id_offset=1)


def get_datasets(config: Any, workdir: str,
                 spec: Optional[Mapping[str, Any]] = None
                 ) -> pipeline.TaskData:
  """IMDb train and test for `config` (module docstring); validation is
  the test split (P5). TFDS keeps its files: `workdir` is not used.
  `spec` is `get_model_spec(config)` if the caller has it (see
  `pipeline.Task.begin`)."""
  del workdir
  source, spec = TASK.begin(config, spec)
  data, origin = tfds_io.load_or_mock(
      TFDS_NAME, ('train', 'test'), ('text', 'label'), config,
      lambda: _mock_examples(config.data.generator))
  train = _source(data['train'], 'train', spec['max_len'],
                  config.data.max_length)
  test = _source(data['test'], 'test', spec['max_len'],
                 config.data.max_length)
  train = pipeline.with_train_shuffle(train, config.data.shuffle,
                                      BATCH_SHUFFLE_WINDOW)
  truncated = float(np.mean([len(t) > config.data.max_length
                             for t in data['test']['text']]))
  notes = {
      'data': origin,
      'data_source': source,
      'max_length': config.data.max_length,
      # P5: IMDb has no validation split; LRA validates on test.
      'validation_is_test': True,
      'test_fraction_truncated': truncated,
      **pipeline.fidelity_notes(config, train.train_shuffle),
  }
  return pipeline.TaskData(
      train=train, eval=test, test=test, spec=spec, notes=notes)
