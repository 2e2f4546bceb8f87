"""README.md keeps up with the code it describes: the package layout, the
config keys a resume may change and the files `lra_msmra.results` writes."""

import os
import re

from lra_msmra import results
from lra_msmra import train
from tests import helpers


def _readme():
  with open(os.path.join(helpers.ROOT, 'README.md')) as f:
    return f.read()


def test_the_layout_names_every_module_and_package():
  layout = _readme().split('## Layout', 1)[1].split('```')[1]
  named = set(re.findall(r'^  (\w+)(?:\.py|/)', layout, re.M))
  package = os.path.join(helpers.ROOT, 'lra_msmra')
  present = {name[:-3] if name.endswith('.py') else name
             for name in os.listdir(package)
             if (name.endswith('.py') and name != '__init__.py') or
             os.path.exists(os.path.join(package, name, '__init__.py'))}
  assert present - named == set()


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
