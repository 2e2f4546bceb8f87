"""Shared helpers of the data tests: configs by path, with overrides."""

import os

from lra_msmra import config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def task_config(task, arg='runlocal', **data_overrides):
  """configs/<task>/transformer.py:<arg> with config.data overrides."""
  path = os.path.join(ROOT, 'configs', task, 'transformer.py')
  config = config_lib.load_sibling(path, 'transformer').get_config(arg)
  for key, value in data_overrides.items():
    if key == 'data_dir':
      config.data_dir = value
    elif isinstance(value, dict):
      config.data[key].update(value)
    else:
      config.data[key] = value
  return config
