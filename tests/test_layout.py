"""Where code sits: `config_lib` is a leaf of the package.

Config files import `config_lib` to build their ConfigDicts, so it must load
without the model, the data or JAX; each section's owner checks its section
(see `lra_msmra.validation`).
"""

import ast
import os

import lra_msmra

PACKAGE = os.path.dirname(lra_msmra.__file__)


def _package_imports(path: str) -> set[str]:
  """Modules of lra_msmra that `path` imports, at any depth of the file."""
  found = set()
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith('lra_msmra')}
    elif isinstance(node, ast.ImportFrom) and node.module and (
        node.module.startswith('lra_msmra')):
      found |= {f'{node.module}.{a.name}' for a in node.names}
  return found


def test_config_lib_imports_nothing_from_the_package():
  assert _package_imports(os.path.join(PACKAGE, 'config_lib.py')) == set()


def test_the_finder_sees_imports_inside_functions(tmp_path):
  path = tmp_path / 'm.py'
  path.write_text('def f():\n  from lra_msmra import models\n')
  assert _package_imports(str(path)) == {'lra_msmra.models'}
