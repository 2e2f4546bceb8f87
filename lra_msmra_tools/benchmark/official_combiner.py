"""The official Combiner layers (Flax), run on our causal `combiner` weights.

Optional, for the attention benchmark's `--official_combiner PATH`: PATH is
a checkout of google-research/google-research (not part of this project;
nothing of it is copied here). The authors' JAX layers are in
`combiner/combiner/jax/model/layer.py`, which imports two files beside it by
package name (`combiner.jax.model.util` and
`combiner.jax.model.transformer_base`). `load_module` executes exactly those
three files by path, registering them under those names only while
`layer.py` is imported, inside the benchmark's worker processes: the
checkout is not put on `sys.path` and nothing else of it is imported. They
need nothing but jax, flax and numpy, and run unchanged on current versions.

The official JAX code is causal only and has no padding or biases. Its
attention modules (the `_...` classes; the `...Layer` classes around them
add LayerNorm, residual and MLP) compute the same function as these
configurations of ours, each with `causal=True`, max abstraction, no
biases and no prefix tokens (`check_knobs`):

ours (`combiner:` knobs)              official class (`max_seg_len`)
variant=fixed                         `_SelfAttSqrtn` (block_size)
variant=logsparse                     `_SelfAttLogn` (not used)
variant=axial (axial_plan=rowmajor)   `_SelfAttAxialRowmajor` (row_length)
variant=mixture,                      `_AxialMixtureAtt` (row_length)
  mixture_mode=joint_softmax

Block sizes and row lengths default to ours (`default_block_size`), and the
official code needs the length to be a multiple of them; its Logsparse
layer also needs N - 1 not to be a power of two (`official_config`).
docs/mechanisms/combiner.md §4 and docs/benchmarks.md give the reasons for
the rest.

`build` makes the official module with the shapes of our layer and maps our
parameters into its tree (`official_params`: identical layouts, renamed);
the benchmark checks that the two compute the same function (`compare`,
shared with `official_ls`) before it times the official module.

`validate_checkout` and `describe_checkout` need neither JAX nor the
official code: the benchmark's main process calls them to fail early, in
one line, on a bad PATH. `check_knobs` and `official_config` need only our
code; the workers call them to record a spec the official code has no
counterpart for as unsupported, with the reason.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import sys
import types
from typing import Any, Mapping, Optional

import numpy as np

from lra_msmra_tools.benchmark import official_ls

REPOSITORY = 'google-research/google-research'
# Where the Flax code lives in a checkout, and the package name its files
# import each other by.
RELATIVE_DIR = os.path.join('combiner', 'combiner', 'jax', 'model')
PACKAGE = 'combiner.jax.model'
# The files `layer.py` needs, in the order they are executed.
FILES = ('util.py', 'transformer_base.py', 'layer.py')
LAYER_FILE = os.path.join(RELATIVE_DIR, 'layer.py')
# Our variant (and plan or mixture mode) -> the official attention module.
CLASSES = {'fixed': '_SelfAttSqrtn', 'logsparse': '_SelfAttLogn',
           'axial': '_SelfAttAxialRowmajor', 'mixture': '_AxialMixtureAtt'}
DEFAULT_TOLERANCE = official_ls.DEFAULT_TOLERANCE
CheckoutError = official_ls.CheckoutError
# Our parameters (under 'attention') -> the official module's, by class.
# The official names are Flax's automatic ones, in order of creation.
_RENAMES = {
    '_SelfAttSqrtn': {'out': 'DenseGeneral_0'},
    '_SelfAttLogn': {'out': 'DenseGeneral_0'},
    '_AxialMixtureAtt': {'out': 'DenseGeneral_0'},
    '_SelfAttAxialRowmajor': {'row_summary_out': 'DenseGeneral_0',
                              'row_summary_norm': 'LayerNorm_0',
                              'row_summary_key': 'DenseGeneral_1',
                              'out': 'DenseGeneral_2'},
}
# Our knobs that keep one value to match the official code (-> values, why).
_FIXED_KNOBS = {
    'causal': ((True,), 'the official JAX layers are causal only; add '
               'causal=true to the spec'),
    'abstraction': ((None, 'max'), 'the official JAX layers pool spans by '
                    'their maximum (mean and DeepSets pooling are only in '
                    'its TF code)'),
    'num_prefix_tokens': ((0,), 'the official layers have no prefix '
                          'tokens: their grid starts at position 0'),
}


def _expected() -> str:
  return (f'expected a checkout of {REPOSITORY} holding {RELATIVE_DIR} '
          f'({", ".join(FILES)}), whose layer.py defines '
          f'{", ".join(sorted(CLASSES.values()))} (e.g. a sparse clone of '
          f'https://github.com/{REPOSITORY} with its combiner folder)')


def _top_level_names(file: str, path: str) -> set[str]:
  """Names of the classes and functions defined at the top of `file`."""
  tree = official_ls.syntax_tree(file, f'--official_combiner {path}',
                                 _expected())
  return {node.name for node in tree.body
          if isinstance(node, (ast.ClassDef, ast.FunctionDef))}


def validate_checkout(path: str) -> dict[str, str]:
  """Returns {file name: path} of checkout `path`; raises if it is unusable.

  Reads the files' syntax trees only (no JAX): the three files must exist,
  `layer.py` must define the four attention classes and `transformer_base.py`
  `TransformerConfig`, at the top level.

  Raises:
    CheckoutError: one line naming the path, what is missing and what was
      expected.
  """
  if not os.path.isdir(path):
    what = 'is not a folder' if os.path.exists(path) else 'does not exist'
    raise CheckoutError(f'--official_combiner {path}: {what}; '
                        f'{_expected()}.')
  files = {name: os.path.join(path, RELATIVE_DIR, name) for name in FILES}
  for file in files.values():
    if not os.path.isfile(file):
      raise CheckoutError(f'--official_combiner {path}: {file} does not '
                          f'exist; {_expected()}.')
  for name, needed in (('layer.py', sorted(CLASSES.values())),
                       ('transformer_base.py', ['TransformerConfig'])):
    missing = [c for c in needed
               if c not in _top_level_names(files[name], path)]
    if missing:
      raise CheckoutError(f'--official_combiner {path}: {files[name]} '
                          f'defines no {", ".join(missing)}; {_expected()}.')
  return files


def describe_checkout(path: str) -> dict[str, Any]:
  """What the report records about the official code that was run."""
  files = validate_checkout(path)
  digests = {}
  for name, file in files.items():
    with open(file, 'rb') as f:
      digests[name] = hashlib.sha256(f.read()).hexdigest()
  commit = official_ls.checkout_commit(path)
  relative = [os.path.join(RELATIVE_DIR, name) for name in FILES]
  return {'repository': REPOSITORY, 'path': os.path.abspath(path),
          'file': LAYER_FILE, 'files': relative,
          'class': ', '.join(sorted(set(CLASSES.values()))),
          'commit': commit,
          'commit_note': None if commit else
                         'not a git checkout: no commit recorded',
          'file_modified': (official_ls.files_modified(path, relative)
                            if commit else None),
          'file_sha256': digests['layer.py'], 'files_sha256': digests}


def check_knobs(kw: Mapping[str, Any]) -> str:
  """The official class computing our `combiner` with knobs `kw`.

  Lengths are checked later (`official_config`).

  Raises:
    NotImplementedError: naming the knob and why the official code has no
      counterpart.
  """
  from lra_msmra.attention import combiner  # pylint: disable=g-import-not-at-top
  defaults = combiner.CombinerAttention
  for key, (values, why) in _FIXED_KNOBS.items():
    value = kw.get(key, getattr(defaults, key, False))
    if value not in values:
      raise NotImplementedError(
          f'combiner {key}={value!r} has no counterpart in the official JAX '
          f'Combiner: {why}.')
  known = set(_FIXED_KNOBS) | {'variant', 'block_size', 'row_length',
                               'axial_plan', 'mixture_mode'}
  for key in kw:
    if key not in known:
      raise NotImplementedError(
          f'combiner knob {key!r} has no counterpart in the official JAX '
          'Combiner; leave it at its default to compare.')
  variant = kw.get('variant', defaults.variant)
  if variant not in CLASSES:
    raise NotImplementedError(
        f'combiner variant {variant!r} has no official JAX layer; the '
        f'variants that have one are {sorted(CLASSES)}.')
  plan = kw.get('axial_plan')
  if variant == 'axial' and plan not in (None, 'rowmajor'):
    raise NotImplementedError(
        f'combiner axial_plan={plan!r} has no official JAX layer of its own: '
        'the official code has the vertical and horizontal plans only inside '
        "_AxialMixtureAtt, under one softmax (variant=mixture,"
        "mixture_mode=joint_softmax); use axial_plan=rowmajor.")
  mode = kw.get('mixture_mode')
  if variant == 'mixture' and mode != 'joint_softmax':
    raise NotImplementedError(
        f'combiner mixture_mode={mode or "average"!r} (the paper\'s average '
        'of two separately normalised plans) is not what the official '
        "_AxialMixtureAtt computes: it puts both plans under one softmax; "
        'use mixture_mode=joint_softmax.')
  return CLASSES[variant]


def official_config(kw: Mapping[str, Any], length: int
                    ) -> tuple[str, Optional[int]]:
  """(official class, its `max_seg_len`) for our knobs at `length`.

  `max_seg_len` is our block size (fixed) or row length (axial, mixture),
  and None for Logsparse, which has no segments.

  Raises:
    NotImplementedError: a length the official code does not handle as ours
      does.
  """
  from lra_msmra.attention import combiner  # pylint: disable=g-import-not-at-top
  name = check_knobs(kw)
  variant = kw.get('variant', combiner.CombinerAttention.variant)
  if variant == 'logsparse':
    if length < 3 or not (length - 1) & (length - 2):
      raise NotImplementedError(
          f'The official _SelfAttLogn counts ceil(log2(N - 1)) levels, one '
          f'short when N - 1 is a power of two (N = {length}): its last '
          'query misses its largest span (docs/mechanisms/combiner.md §4). '
          'Choose another length to compare.')
    return name, None
  knob = 'block_size' if variant == 'fixed' else 'row_length'
  size = kw.get(knob) or combiner.default_block_size(length)
  if length % size:
    raise NotImplementedError(
        f'The official {name} needs the length ({length}) to be a multiple '
        f'of its max_seg_len, our {knob} ({size}); our layer pads '
        'internally. Choose such lengths to compare.')
  return name, size


def load_module(path: str) -> types.ModuleType:
  """Imports the official `layer.py` of checkout `path` by file path.

  Its two sibling files are executed first under the package names
  `layer.py` imports them by; those names (and their parent packages, as
  empty modules) are in `sys.modules` only during the import and are put
  back as they were after it.
  """
  files = validate_checkout(path)
  parts = PACKAGE.split('.')
  names = ['.'.join(parts[:i]) for i in range(1, len(parts) + 1)]
  names += [f'{PACKAGE}.{f[:-3]}' for f in FILES]
  saved = {n: sys.modules[n] for n in names if n in sys.modules}
  try:
    for package in names[:len(parts)]:
      stub = types.ModuleType(package)
      stub.__path__ = []  # A package that finds nothing by itself.
      sys.modules[package] = stub
    for file_name in FILES:
      name = f'{PACKAGE}.{file_name[:-3]}'
      spec = importlib.util.spec_from_file_location(
          name, files[file_name])
      module = importlib.util.module_from_spec(spec)
      sys.modules[name] = module
      spec.loader.exec_module(module)
  finally:
    for n in names:
      sys.modules.pop(n, None)
    sys.modules.update(saved)
  for cls in CLASSES.values():
    if not isinstance(getattr(module, cls, None), type):
      raise CheckoutError(f'--official_combiner {path}: importing '
                          f'{files["layer.py"]} gave no class {cls}; '
                          f'{_expected()}.')
  return module


def official_params(params: Mapping[str, Any], shapes: Mapping[str, Any],
                    class_name: str) -> dict[str, dict[str, np.ndarray]]:
  """Our `combiner` parameters as the official module's parameter tree.

  Both sides use Flax `DenseGeneral` with the same layouts (query, key and
  value kernels `[D, H, d]`, output kernels `[H, d, D]`, heads in the same
  order) and divide the queries by sqrt(d) once, after the projection, so
  every array is copied unchanged; only the names differ (`_RENAMES`):

  ours (under 'attention')      official
  query, key, value             query, key, value
  out                           DenseGeneral_0 (DenseGeneral_2 for rowmajor)
  row_summary_out               DenseGeneral_0 (rowmajor: row output -> D)
  row_summary_norm              LayerNorm_0 (rowmajor; epsilon 1e-6 both)
  row_summary_key               DenseGeneral_1 (rowmajor: the row's key)

  Args:
    params: our layer's parameters (the tree under 'attention').
    shapes: the official module's parameter tree (arrays or shape structs).
    class_name: the official class (a key of `_RENAMES`).

  Returns:
    {module: {leaf: float32 array}}, with exactly the leaves of `shapes`.

  Raises:
    ValueError: a parameter of ours (e.g. a bias) or of theirs that the
      mapping does not place, or a shape that differs.
  """
  renames = _RENAMES[class_name]
  out: dict[str, dict[str, np.ndarray]] = {}
  for ours, leaves in params.items():
    theirs = renames.get(ours, ours)
    for leaf, value in leaves.items():
      if theirs not in shapes or leaf not in shapes[theirs]:
        raise ValueError(f'Our {ours}/{leaf} has no counterpart in the '
                         f'official {class_name} (no {theirs}/{leaf}).')
      value = np.asarray(value, np.float32)
      want = tuple(shapes[theirs][leaf].shape)
      if value.shape != want:
        raise ValueError(f'Our {ours}/{leaf} maps to {theirs}/{leaf} with '
                         f'shape {value.shape}, but the official module has '
                         f'{want}.')
      out.setdefault(theirs, {})[leaf] = value
  missed = sorted(f'{m}/{leaf}' for m, leaves in shapes.items()
                  for leaf in leaves if leaf not in out.get(m, {}))
  if missed:
    raise ValueError(f'The official {class_name} parameters {missed} have '
                     'no counterpart among ours.')
  return out


def build(path: str, kw: Mapping[str, Any], params: Mapping[str, Any], *,
          heads: int, features: int, length: int):
  """The official attention module for our layer, and its variables.

  Args:
    path: the checkout of google-research/google-research.
    kw: our `combiner` knobs (`check_knobs` must accept them).
    params: our `StandaloneAttention` parameters (the tree holding
      'attention'), as numpy arrays.
    heads: number of heads H.
    features: model width D (= H d, the official qkv_dim).
    length: the sequence length it will be called with (its `max_len`; the
      official modules take exactly that length).

  Returns:
    (module, {'params': tree}): `module.apply(variables, x)` for x
    `[batch, length, D]`, float32, deterministic (no dropout).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  name, seg_len = official_config(kw, length)
  layer = load_module(path)
  sizes = {} if seg_len is None else {'max_seg_len': seg_len}
  config = layer.TransformerConfig(
      vocab_size=1, output_vocab_size=1, dtype=jnp.float32, emb_dim=features,
      num_heads=heads, qkv_dim=features, max_len=length, dropout_rate=0.0,
      attention_dropout_rate=0.0, deterministic=True, **sizes)
  module = getattr(layer, name)(config=config)
  x = jax.ShapeDtypeStruct((1, length, features), jnp.float32)
  shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)['params']
  return module, {'params': official_params(params['attention'], shapes,
                                            name)}


compare = official_ls.compare
