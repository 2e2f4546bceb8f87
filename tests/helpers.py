"""Tiny configs shared by the trainer tests."""

import os

from lra_msmra import config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(relpath, arg=None):
  path = os.path.join(ROOT, relpath)
  module = config_lib.load_sibling(path, os.path.basename(path)[:-3])
  return module.get_config(arg)


def tiny_listops_config(**overrides):
  """ListOps runlocal shrunk to seconds (tests/configs/tiny_listops.py)."""
  c = load_config('tests/configs/tiny_listops.py')
  for key, value in overrides.items():
    target = c
    *path, last = key.split('.')
    for p in path:
      target = target[p]
    target[last] = value
  return c
