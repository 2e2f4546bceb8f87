"""ListOps generated as LRA's code reads: the oracle of the fast generator.

`lra_msmra.data.listops.generate_examples` draws, serialises and labels an
expression in one pass. This module does the same the way LRA's generator
(`lra_benchmarks/data/listops.py`) is written: sample a tree of nested
pairs (`generate_tree`), write it out (`to_string`) and evaluate it by
LRA's left fold (`to_value`). It is slow, and only tests use it: they check
that both give the same examples, seed for seed.
"""

from __future__ import annotations

import random
from typing import Any, Union

import numpy as np

from lra_msmra.data.listops import (END, MAX, MED, MIN, OPERATORS, SUM_MOD,
                                    VALUE_P, VALUES)

Tree = Union[int, str, tuple]


def generate_tree(rng: random.Random, depth: int, max_depth: int,
                  max_args: int) -> tuple[Tree, int]:
  """Samples a tree as LRA does; returns (tree, token length).

  The order of random draws follows LRA exactly: random() (only below
  max_depth), then either choice(values), or randint(2, max_args), the
  children in order, and finally choice(operators).
  """
  r = rng.random() if depth < max_depth else 1.0
  if r > VALUE_P:
    return rng.choice(VALUES), 1
  num_children = rng.randint(2, max_args)
  children, length = [], 2
  for _ in range(num_children):
    child, child_len = generate_tree(rng, depth + 1, max_depth, max_args)
    children.append(child)
    length += child_len
  tree: Tree = (rng.choice(OPERATORS), children[0])
  for child in children[1:]:
    tree = (tree, child)
  return (tree, END), length


def to_string(tree: Tree) -> str:
  """Fully parenthesised form: every pair (a, b) is written `( a b )`."""
  if isinstance(tree, tuple):
    return f'( {to_string(tree[0])} {to_string(tree[1])} )'
  return str(tree)


def _apply(op: str, args: list[int]) -> int:
  if op == MIN:
    return min(args)
  if op == MAX:
    return max(args)
  if op == MED:
    return int(np.median(args))
  if op == SUM_MOD:
    return sum(args) % 10
  raise ValueError(f'Unknown operator {op!r}.')


def to_value(tree: Tree) -> Any:
  """Label of a tree by LRA's left fold; partial applications are tuples."""
  if not isinstance(tree, tuple):
    return tree
  left, right = tree
  if left in OPERATORS:
    return ('partial', left, [to_value(right)])
  left = to_value(left)
  if right == END:
    return _apply(left[1], left[2])
  return ('partial', left[1], left[2] + [to_value(right)])


def reference_examples(num_examples: int, *, min_length: int = 500,
                       max_length: int = 2000, max_depth: int = 10,
                       max_args: int = 10, seed: int = 0
                       ) -> list[tuple[str, int]]:
  """`listops.generate_examples` written as LRA's algorithm reads: build
  each tree with `generate_tree`, then `to_string` and `to_value`. Slow;
  tests check that the fast path gives the same list."""
  rng = random.Random(seed)
  trees: dict[Tree, None] = {}
  while len(trees) < num_examples:
    tree, length = generate_tree(rng, 1, max_depth, max_args)
    if min_length < length < max_length:
      trees[tree] = None
  return [(to_string(t), int(to_value(t))) for t in trees]
