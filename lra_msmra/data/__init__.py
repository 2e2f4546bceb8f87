"""Task input pipelines, one module per task, all with the same entry point.

`get_datasets(config, workdir)` dispatches on `config.task` and returns a
`TaskData` (see `lra_msmra.data.pipeline`), which carries the task's model
spec (`get_model_spec`). Batches are dicts of numpy arrays:
`inputs` `[batch, length]` int32 (id 0 = padding), `targets` `[batch]` int32,
plus `inputs2` for two-document tasks and `weights` `[batch]` in evaluation.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping, Optional

from lra_msmra import config_lib
from lra_msmra.data.pipeline import TaskData

# Task name (config_lib.TASKS) -> module under lra_msmra.data with
# get_datasets(config, workdir, spec=None), get_model_spec(config) and its
# record TASK (`pipeline.Task`); Path-X is Pathfinder at 128x128.
MODULES = {task: 'pathfinder' if task == 'pathx' else task
           for task in config_lib.TASKS}


def _module(task: str):
  if task not in MODULES:
    raise ValueError(f'Unknown task {task!r}; valid: '
                     f'{list(config_lib.TASKS)}.')
  return importlib.import_module(f'lra_msmra.data.{MODULES[task]}')


def _task_module(config: Any):
  return _module(config.task)


def data_source(config: Any) -> str:
  """'release', 'generated' or 'mock' (see `pipeline.DATA_SOURCES`); raises,
  saying how to prepare the data, when a config names no source."""
  return _task_module(config).TASK.source(config)


def get_datasets(config: Any, workdir: str,
                 spec: Optional[Mapping[str, Any]] = None) -> TaskData:
  """Returns the splits of `config.task`; `workdir` holds generated data.

  `notes['data_source']` says where the examples come from (see
  `data_source`). `spec` is `get_model_spec(config)` when the caller has it
  (a run has, from validating its config): `config.data` is then not
  checked again, and the data carries that spec. None: it is built here,
  which checks `config.data`.
  """
  return _task_module(config).get_datasets(config, workdir, spec)


def generator_settings(task: str, settings: Mapping[str, Any]
                       ) -> dict[str, Any]:
  """A task generator's recorded settings, completed with its defaults for
  the settings the generating call left out (see
  `pipeline.Task.generator_defaults`)."""
  return _module(task).TASK.generator_settings(settings)


def get_model_spec(config: Any) -> dict[str, Any]:
  """What the model needs from the task, from the config alone (no data).

  Returns:
    dict with `vocab_size`, `num_classes`, `max_len` and `dual`, built from
    the task's record (`pipeline.Task`) after checking `config.data`; the
    data of `get_datasets` carries it as `TaskData.spec`.
  """
  return _task_module(config).get_model_spec(config)


__all__ = ['MODULES', 'TaskData', 'data_source', 'generator_settings',
           'get_datasets', 'get_model_spec']
