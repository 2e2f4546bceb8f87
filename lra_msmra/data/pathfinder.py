"""Pathfinder and Path-X (PROTOCOL §5.5, §5.6, §7).

The input pipeline lands with the task-pipelines issue; the model spec below
is what configs and parameter budgets need.
"""

from __future__ import annotations

from typing import Any

VOCAB_SIZE = 256  # pixel intensities are the tokens.
NUM_CLASSES = 2


def get_model_spec(config: Any) -> dict[str, Any]:
  return {'vocab_size': VOCAB_SIZE, 'num_classes': NUM_CLASSES,
          'max_len': config.data.resolution ** 2, 'dual': False}


def get_datasets(config: Any, workdir: str):
  raise NotImplementedError('The Pathfinder input pipeline is not built yet.')
