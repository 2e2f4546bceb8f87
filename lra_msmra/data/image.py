"""Image: sequential grayscale CIFAR-10 (PROTOCOL §5.4).

The input pipeline lands with the task-pipelines issue; the model spec below
is what configs and parameter budgets need.
"""

from __future__ import annotations

from typing import Any

VOCAB_SIZE = 256  # pixel intensities are the tokens.
NUM_CLASSES = 10


def get_model_spec(config: Any) -> dict[str, Any]:
  del config
  return {'vocab_size': VOCAB_SIZE, 'num_classes': NUM_CLASSES,
          'max_len': 32 * 32, 'dual': False}


def get_datasets(config: Any, workdir: str):
  raise NotImplementedError('The Image input pipeline is not built yet.')
