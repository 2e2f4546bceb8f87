"""notebooks/load_checkpoint.ipynb runs headlessly on a finished run.

A tiny ListOps run is trained first; the notebook then loads its checkpoint,
evaluates a few test examples and plots an attention influence map, in a
fresh Jupyter kernel (nbclient), as a user would run it.
"""

import json
import os
import re

import pytest

from lra_msmra import train
from tests import helpers

nbclient = pytest.importorskip('nbclient')
nbformat = pytest.importorskip('nbformat')

NOTEBOOK = os.path.join(helpers.ROOT, 'notebooks', 'load_checkpoint.ipynb')


def _execute(env):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)  # The kernel inherits this process's environment.
  try:
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name='python3',
        resources={'metadata': {'path': helpers.ROOT}}).execute()
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k)
      else:
        os.environ[k] = v
  return nb


def _outputs(nb):
  return [o for cell in nb.cells if cell.cell_type == 'code'
          for o in cell.outputs]


def test_notebook_loads_evaluates_and_plots(tmp_path):
  workdir = str(tmp_path / 'run')
  results = train.train_and_evaluate(helpers.tiny_listops_config(), workdir)
  nb = _execute({'LRA_WORKDIR': workdir, 'LRA_LAYER': '0', 'LRA_HEAD': '1',
                 'LRA_NUM_EXAMPLES': '16',
                 # One CPU device in the kernel, as in a plain notebook.
                 'XLA_FLAGS': ''})
  outputs = _outputs(nb)
  assert not [o for o in outputs if o.output_type == 'error']
  text = ''.join(o.get('text', '') for o in outputs
                 if o.output_type == 'stream')
  assert 'listops / softmax' in text and 'best checkpoint' in text
  # All 16 test examples: the accuracy is the run's best-checkpoint one.
  expected = results['best']['test_accuracy']
  assert f'accuracy on these 16 examples: {expected:.3f}' in text
  figures = [o for o in outputs if o.output_type == 'display_data'
             and 'image/png' in o.get('data', {})]
  assert len(figures) == 1
  assert 'real positions' in text
  # The committed notebook carries no outputs.
  committed = json.load(open(NOTEBOOK))
  assert all(not c.get('outputs') for c in committed['cells'])


def test_notebook_and_readme_suggest_the_same_run_and_write_outside_the_clone():
  nb = json.load(open(NOTEBOOK))
  intro = ''.join(nb['cells'][0]['source'])
  check = ''.join(nb['cells'][1]['source'])
  default = re.search(r"'LRA_WORKDIR', '([^']+)'", check).group(1)
  [suggested] = re.findall(r'--config (\S+) --workdir (\S+)', intro)
  assert suggested == re.search(r"--config (\S+) --workdir (\S+)\\n",
                                check).groups()
  assert suggested[1] == default
  assert f'LRA_WORKDIR={default} jupyter execute' in intro
  # The README's headless command keeps the executed copy out of the clone
  # (nbclient writes a relative --output next to the notebook).
  readme = open(os.path.join(helpers.ROOT, 'README.md')).read()
  outputs = re.findall(r'jupyter execute notebooks/load_checkpoint.ipynb'
                       r'\s*\\?\s*--output=(\S+)', readme)
  assert outputs and all(os.path.isabs(o) for o in outputs)
