"""Text: byte-level IMDb classification (PROTOCOL §5.2).

The input pipeline lands with the task-pipelines issue; the model spec below
is what configs and parameter budgets need.
"""

from __future__ import annotations

from typing import Any

VOCAB_SIZE = 257  # byte + 1; 0 = padding.
NUM_CLASSES = 2


def get_model_spec(config: Any) -> dict[str, Any]:
  return {'vocab_size': VOCAB_SIZE, 'num_classes': NUM_CLASSES,
          'max_len': config.data.pad_to_length or config.data.max_length,
          'dual': False}


def get_datasets(config: Any, workdir: str):
  raise NotImplementedError('The Text input pipeline is not built yet.')
