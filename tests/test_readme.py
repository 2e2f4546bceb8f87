"""README.md keeps up with the code it describes: the package layout, the
config keys a resume may change and the files `lra_msmra_tools.results` writes."""

import os
import re

import pytest

from lra_msmra import train
from lra_msmra_tools import results
from tests import helpers


def _readme():
  with open(os.path.join(helpers.ROOT, 'README.md')) as f:
    return f.read()


@pytest.mark.parametrize('package', ['lra_msmra', 'lra_msmra_tools'])
def test_the_layout_names_every_module_and_package(package):
  layout = _readme().split('## Layout', 1)[1].split('```')[1]
  # The package's block: from its line to the next top-level entry.
  block = layout.split(f'\n{package}/', 1)[1]
  block = re.split(r'\n(?=\S)', block, 1)[0]
  named = set(re.findall(r'^  (\w+)(?:\.py|/)', block, re.M))
  folder = os.path.join(helpers.ROOT, package)
  present = {name[:-3] if name.endswith('.py') else name
             for name in os.listdir(folder)
             if (name.endswith('.py') and name != '__init__.py') or
             os.path.exists(os.path.join(folder, name, '__init__.py'))}
  assert present - named == set()
  assert named - present == set()


def test_the_resume_paragraph_names_every_key_that_may_change():
  text = ' '.join(_readme().split())
  start = text.index('a different config there is refused')
  paragraph = text[start:start + 1000]
  for key in train.RESUMABLE_CHANGES:
    assert f'`{key}`' in paragraph, key


def test_the_results_command_outputs_are_named():
  text = ' '.join(_readme().split())
  for name in ('results.md', results.TABLE_FILE, 'results_bubble.png',
               'results_curves.png'):
    assert f'`{name}`' in text, name
