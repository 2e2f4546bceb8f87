"""Shared helpers of the data tests: configs with overrides, fixtures."""

import os

import numpy as np

from lra_msmra import config_lib
from lra_msmra.data import pathfinder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def task_config(task, arg='runlocal', **data_overrides):
  """configs/<task>/transformer.py:<arg> with config.data overrides."""
  path = os.path.join(ROOT, 'configs', task, 'transformer.py')
  config = config_lib.load_sibling(path, 'transformer').get_config(arg)
  for key, value in data_overrides.items():
    if key == 'data_dir':
      config.data_dir = value
      config.data.generate = not value
    elif isinstance(value, dict):
      config.data[key].update(value)
    else:
      config.data[key] = value
  return config


def write_release(root, resolution=32, difficulty='hard', num=20, seed=0,
                  empty=(3,), per_folder=8):
  """A release-like folder: imgs/<k>/sample_<n>.png plus metadata/<k>.npy.

  Returns {image relative path: (pixels [R, R], label)}; empty files map to
  None.
  """
  folder = pathfinder.folder_path(root, resolution, difficulty)
  rng = np.random.default_rng(seed)
  truth, lines = {}, {}
  for n in range(num):
    k = n // per_folder
    os.makedirs(os.path.join(folder, 'imgs', str(k)), exist_ok=True)
    rel = os.path.join(f'imgs/{k}', f'sample_{n}.png')
    label = int(rng.integers(2))
    if n in empty:
      open(os.path.join(folder, rel), 'wb').close()
      truth[rel] = None
    else:
      pixels = rng.integers(0, 256, (resolution, resolution)).astype(np.uint8)
      pathfinder.write_png(os.path.join(folder, rel), pixels)
      truth[rel] = (pixels, label)
    lines.setdefault(k, []).append(
        f'imgs/{k} sample_{n}.png {n} {label} 1.0 14 4 2 0.5 1 1\n')
  os.makedirs(os.path.join(folder, 'metadata'), exist_ok=True)
  for k, rows in lines.items():
    with open(os.path.join(folder, 'metadata', f'{k}.npy'), 'w') as f:
      f.write(''.join(rows))
  return folder, truth
