"""The package's import graph has no cycle.

Every module of `lra_msmra/` is parsed with `ast` (nothing is imported) and
every import statement in it counts, at the top of the file or inside a
function: an import inside a function still ties the two modules together,
it only hides the cycle until the function runs. `from lra_msmra.x import y`
names the module `lra_msmra.x.y` when that is a module of the package and
`lra_msmra.x` otherwise. Names built at run time (`importlib.import_module`
of a formatted string) cannot be read and are not counted.
"""

from __future__ import annotations

import ast
import os

PACKAGE = 'lra_msmra'
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_modules(root: str = ROOT, package: str = PACKAGE
                    ) -> dict[str, str]:
  """Dotted module name -> file, for every .py file of the package."""
  out = {}
  for folder, dirs, files in os.walk(os.path.join(root, package)):
    dirs[:] = sorted(d for d in dirs if d != '__pycache__')
    for f in sorted(files):
      if not f.endswith('.py'):
        continue
      path = os.path.join(folder, f)
      parts = os.path.relpath(path, root)[:-3].split(os.sep)
      if parts[-1] == '__init__':
        parts = parts[:-1]
      out['.'.join(parts)] = path
  return out


def _imported(node: ast.AST, module: str, is_package: bool,
              modules: set[str]) -> list[str]:
  """The package's modules that one import statement names."""
  if isinstance(node, ast.Import):
    names = [alias.name for alias in node.names]
  else:
    base = node.module or ''
    if node.level:  # Relative: from the module's own package upwards.
      parts = module.split('.')
      if not is_package:
        parts = parts[:-1]
      parts = parts[:len(parts) - (node.level - 1)]
      base = '.'.join(parts + ([base] if base else []))
    names = [f'{base}.{a.name}' if f'{base}.{a.name}' in modules else base
             for a in node.names]
  out = []
  for name in names:
    # `import a.b.c` binds `a` but runs `a.b.c`: the deepest known module.
    while name and name not in modules:
      name = name.rpartition('.')[0]
    if name:
      out.append(name)
  return out


def import_graph(root: str = ROOT, package: str = PACKAGE
                 ) -> dict[str, set[str]]:
  """Module -> the package's modules it imports (anywhere in its file)."""
  files = package_modules(root, package)
  known = set(files)
  graph = {}
  for module, path in files.items():
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read(), path)
    is_package = path.endswith('__init__.py')
    graph[module] = {
        target for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for target in _imported(node, module, is_package, known)
        if target != module}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
  inside = set(component)
  edges = [f'{a} -> {b}' for a in component for b in sorted(graph[a])
           if b in inside]
  return ', '.join(edges)


def test_the_package_has_no_import_cycle():
  graph = import_graph()
  found = cycles(graph)
  assert not found, 'import cycles: ' + '; '.join(
      _describe(c, graph) for c in found)


def test_config_lib_is_a_leaf():
  # The config's shape and presets; the checks that need the packages owning
  # the values are lra_msmra.validation.
  assert import_graph()['lra_msmra.config_lib'] == set()


def test_kernels_import_no_mechanism():
  # How attention is computed stands below what it computes: the mechanisms
  # pick their kernels, never the other way round.
  graph = import_graph()
  upward = {m: sorted(d for d in deps if d.startswith('lra_msmra.attention'))
            for m, deps in graph.items() if m.startswith('lra_msmra.kernels')}
  assert not any(upward.values()), upward


def test_the_graph_sees_imports_inside_functions(tmp_path):
  pkg = tmp_path / 'pkg'
  (pkg / 'sub').mkdir(parents=True)
  (pkg / '__init__.py').write_text('')
  (pkg / 'a.py').write_text('from pkg import b\n')
  (pkg / 'b.py').write_text(
      'def f():\n  from pkg.sub import c\n  return c\n')
  (pkg / 'sub' / '__init__.py').write_text('from . import c\n')
  (pkg / 'sub' / 'c.py').write_text('import pkg.a\nfrom ..b import f\n')
  graph = import_graph(str(tmp_path), 'pkg')
  assert graph == {'pkg': set(), 'pkg.a': {'pkg.b'}, 'pkg.b': {'pkg.sub.c'},
                   'pkg.sub': {'pkg.sub.c'},
                   'pkg.sub.c': {'pkg.a', 'pkg.b'}}
  assert cycles(graph) == [['pkg.a', 'pkg.b', 'pkg.sub.c']]
  (pkg / 'sub' / 'c.py').write_text('import os\n')
  assert cycles(import_graph(str(tmp_path), 'pkg')) == []
