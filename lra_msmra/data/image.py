"""Image: sequential grayscale CIFAR-10 (docs/protocol.md §5.4).

As LRA (`image/input_pipeline.py`, `get_cifar10_datasets`):

* Data: TFDS `cifar10` in stored order: `train[:90%]` (45,000) for
  training, `train[90%:]` (5,000) for validation, `test` (10,000).
* Grayscale exactly as TensorFlow's `tf.image.rgb_to_grayscale` on uint8
  (P22): x/255 in float32, `0.2989 R + 0.5870 G + 0.1140 B` summed in that
  order in float32, times 255.5, truncated to uint8 (`rgb_to_grayscale`; a
  test compares it with TensorFlow on every RGB triple). PIL's `convert('L')`
  rounds and can differ by 1.
* Tokens: the 0..255 intensities themselves (vocabulary 256, no
  normalisation), flattened row-major to 1024 per image. Black pixels have id
  0 and therefore count as padding in the encoder unless
  `config.model.mask_padding` is False (P8).
* Training order (`data.shuffle`): LRA batches 256 consecutive images of the
  repeated split and shuffles whole batches in a 256-batch buffer (P10,
  'batches', the LRA-protocol default); 'examples' reshuffles images every
  epoch (Xiong et al. and e-lra).

Where we differ: LRA evaluates whole batches only (`drop_remainder`: 9,984
test images, and 39 validation batches of a split that has 19, P15); we
evaluate every image once.

With `config.data.generate=True` (runlocal, tests) generated images
(`synthetic_images`) stand in for the stored splits and are sliced as
`tfds.load` slices them (`tfds_io.from_examples`); TensorFlow and TFDS are
needed for the real data only (`pip install -e .[tfds]`).

config.data keys:
  pad_to_length: zero-pad the 1024 tokens further to this length (0 = none;
    the xiong option sets 1024, a no-op kept for its uniform config).
  shuffle: 'batches' (LRA) or 'examples'.
  generate: True for mock images instead of data_dir (see DATA_SOURCES).
  generator: {num_train, num_test, seed}, used only with generate; the
    generated `train` split is sliced 90/10 like the real one.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from lra_msmra.data import pipeline
from lra_msmra.data import tfds_io

VOCAB_SIZE = 256  # pixel intensities are the tokens.
NUM_CLASSES = 10
SIDE = 32
TFDS_NAME = 'cifar10'
SPLITS = {'train': 'train[:90%]', 'eval': 'train[90%:]', 'test': 'test'}
# Batches per shuffle window for data.shuffle='batches' (LRA's buffer size).
BATCH_SHUFFLE_WINDOW = 256
# ITU-R 601 luma weights as TensorFlow writes them (they sum to 0.9999).
GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], np.float32)


def rgb_to_grayscale(rgb: np.ndarray) -> np.ndarray:
  """TensorFlow's `tf.image.rgb_to_grayscale` on uint8, bit for bit.

  Args:
    rgb: uint8 `[..., 3]`.

  Returns:
    uint8 `[...]`.
  """
  if rgb.dtype != np.uint8 or rgb.shape[-1] != 3:
    raise ValueError(f'Expected uint8 [..., 3] RGB, got {rgb.dtype} '
                     f'{rgb.shape}.')
  # convert_image_dtype(uint8 -> float32) multiplies by float32(1/255).
  f = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
  w = GRAY_WEIGHTS
  # Elementwise float32 products summed left to right: the same rounding as
  # TF's tensordot here (checked on all 2^24 triples).
  gray = f[..., 0] * w[0] + f[..., 1] * w[1] + f[..., 2] * w[2]
  # convert_image_dtype(float32 -> uint8) scales by 255.5 and truncates.
  return (gray * np.float32(255.5)).astype(np.uint8)


def synthetic_images(num: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Generated CIFAR-like images whose class is visible.

  Class c paints a coloured square of brightness ~ c on a noisy background,
  at a random place, so a small model can beat chance; a few pixels are
  black, so the zero-id padding rule (P8) is exercised.

  Returns:
    (images, labels): uint8 `[num, 32, 32, 3]` and int64 `[num]`.
  """
  rng = np.random.default_rng(seed)
  labels = rng.integers(NUM_CLASSES, size=num)
  images = rng.integers(0, 60, size=(num, SIDE, SIDE, 3)).astype(np.int64)
  for i, c in enumerate(labels):
    size = 8 + int(rng.integers(8))
    r, col = rng.integers(SIDE - size, size=2)
    color = 80 + 17 * c + rng.integers(-6, 7, size=3)
    images[i, r:r + size, col:col + size] = color
  return np.clip(images, 0, 255).astype(np.uint8), labels.astype(np.int64)


TASK = pipeline.Task(
    name='image', vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
    dual=False,
    data_keys=frozenset({'pad_to_length', 'shuffle'}),
    generator_keys=frozenset({'num_test', 'num_train', 'seed'}),
    synthetic='mock',
    prepare=('download CIFAR-10 through TFDS once with `python -m '
             'lra_msmra.data.prepare --tfds --out DIR`'),
    length=lambda data: SIDE * SIDE)
get_model_spec = TASK.model_spec


def _mock_examples(gen: Any) -> dict[str, dict[str, np.ndarray]]:
  examples = {}
  for i, (split, num) in enumerate((('train', gen.num_train),
                                    ('test', gen.num_test))):
    images, labels = synthetic_images(num, gen.seed + i)
    examples[split] = {'image': images, 'label': labels}
  return examples


def _source(split: dict[str, np.ndarray], spec: str, max_len: int
            ) -> pipeline.ArraySource:
  images = split['image']
  labels = pipeline.check_labels(split['label'], NUM_CLASSES,
                                 f'{TFDS_NAME} {spec}')
  if not len(images):
    raise ValueError(f'{TFDS_NAME} {spec}: the split has no examples.')
  if images.ndim != 4 or images.shape[1:] != (SIDE, SIDE, 3):
    raise ValueError(f'{TFDS_NAME} {spec}: expected images [n, {SIDE}, '
                     f'{SIDE}, 3], got {images.shape}.')
  tokens = pipeline.pad_or_truncate(
      rgb_to_grayscale(images).reshape(len(images), SIDE * SIDE), max_len,
      np.uint8)
  return pipeline.ArraySource({'inputs': tokens, 'targets': labels})


def get_datasets(config: Any, workdir: str,
                 spec: Optional[Mapping[str, Any]] = None
                 ) -> pipeline.TaskData:
  """The CIFAR-10 splits for `config` (module docstring); TFDS keeps its
  files, so `workdir` is not used. `spec` is `get_model_spec(config)` if
  the caller has it (see `pipeline.Task.begin`)."""
  del workdir
  source, spec = TASK.begin(config, spec)
  data, origin = tfds_io.load_or_mock(
      TFDS_NAME, tuple(SPLITS.values()), ('image', 'label'), config,
      lambda: _mock_examples(config.data.generator))
  splits = {name: _source(data[split], split, spec['max_len'])
            for name, split in SPLITS.items()}
  train = pipeline.with_train_shuffle(splits['train'], config.data.shuffle,
                                      BATCH_SHUFFLE_WINDOW)
  zero = float(np.mean(splits['test'].arrays['inputs'] == 0))
  notes = {
      'data': origin,
      'data_source': source,
      'splits': dict(SPLITS),
      'grayscale': 'tf.image.rgb_to_grayscale, bit-exact (P22)',
      'test_fraction_zero_pixels': zero,
      **pipeline.fidelity_notes(config, train.train_shuffle),
  }
  return pipeline.TaskData(
      train=train, eval=splits['eval'], test=splits['test'], spec=spec,
      notes=notes)
