"""Task input pipelines, one module per task, all with the same entry point.

`get_datasets(config, workdir)` dispatches on `config.task` and returns a
`TaskData` (see `lra_msmra.data.pipeline`). Batches are dicts of numpy arrays:
`inputs` `[batch, length]` int32 (id 0 = padding), `targets` `[batch]` int32,
plus `inputs2` for two-document tasks and `weights` `[batch]` in evaluation.
"""

from __future__ import annotations

import importlib
from typing import Any

from lra_msmra.data import pipeline
from lra_msmra.data.pipeline import TaskData

# Task name -> module under lra_msmra.data with get_datasets(config, workdir).
TASKS = {
    'listops': 'listops',
    'text': 'text',
    'retrieval': 'retrieval',
    'image': 'image',
    'pathfinder': 'pathfinder',
    'pathx': 'pathfinder',
}


def _task_module(config: Any):
  if config.task not in TASKS:
    raise ValueError(f'Unknown task {config.task!r}; valid: {sorted(TASKS)}.')
  return importlib.import_module(f'lra_msmra.data.{TASKS[config.task]}')


def data_source(config: Any) -> str:
  """'release', 'generated' or 'mock' (see `pipeline.DATA_SOURCES`); raises,
  saying how to prepare the data, when a config names no source."""
  module = _task_module(config)
  return pipeline.data_source(config, module.SYNTHETIC_SOURCE,
                              module.PREPARE_HINT)


def get_datasets(config: Any, workdir: str) -> TaskData:
  """Returns the splits of `config.task`; `workdir` holds generated data.

  `notes['data_source']` says where the examples come from (see
  `data_source`).
  """
  return _task_module(config).get_datasets(config, workdir)


def get_model_spec(config: Any) -> dict[str, Any]:
  """What the model needs from the task, from the config alone (no data).

  Returns:
    dict with `vocab_size`, `num_classes`, `max_len` and `dual`, equal to
    what `get_datasets(config, ...)` would report.
  """
  return _task_module(config).get_model_spec(config)


__all__ = ['TASKS', 'TaskData', 'data_source', 'get_datasets',
           'get_model_spec']
