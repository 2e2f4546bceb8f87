"""Task input pipelines, one module per task, all with the same entry point.

`get_datasets(config, workdir)` dispatches on `config.task` and returns a
`TaskData` (see `lra_msmra.data.pipeline`). Batches are dicts of numpy arrays:
`inputs` `[batch, length]` int32 (id 0 = padding), `targets` `[batch]` int32,
plus `inputs2` for two-document tasks and `weights` `[batch]` in evaluation.
"""

from __future__ import annotations

import importlib
from typing import Any

from lra_msmra.data.pipeline import TaskData

# Task name -> module under lra_msmra.data with get_datasets(config, workdir).
TASKS = {
    'listops': 'listops',
}


def get_datasets(config: Any, workdir: str) -> TaskData:
  """Returns the splits of `config.task`; `workdir` holds generated data."""
  if config.task not in TASKS:
    raise ValueError(f'Unknown task {config.task!r}; valid: {sorted(TASKS)}.')
  module = importlib.import_module(f'lra_msmra.data.{TASKS[config.task]}')
  return module.get_datasets(config, workdir)


__all__ = ['TASKS', 'TaskData', 'get_datasets']
