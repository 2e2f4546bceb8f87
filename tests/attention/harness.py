"""Running one attention layer on its own, as the encoder would.

`AttentionHarness` (`lra_msmra.attention.standalone.StandaloneAttention`)
builds a registered mechanism with the contract's fields, creates its
model-level shared module (if it has one) exactly as the encoder does, and
calls the layer. Tests use it to reach any mechanism by name.
"""

from __future__ import annotations

from typing import Any

from lra_msmra import attention
from lra_msmra.attention import standalone

# Registry entry -> list of (id, knobs) that the contract tests exercise:
# each mechanism's `EXAMPLES`, so a new mechanism brings its own.
CONTRACT_CASES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    name: [(cid, dict(kw)) for cid, kw in cls.EXAMPLES]
    for name, cls in attention.REGISTRY.items()}


# The encoder's way of building one layer, shared with the benchmarks.
AttentionHarness = standalone.StandaloneAttention


def all_cases():
  """pytest params: (mechanism, case id, knobs) for every registered entry."""
  missing = sorted(set(attention.REGISTRY) - set(CONTRACT_CASES))
  if missing:
    raise AssertionError(f'Registered mechanisms without contract cases: '
                         f'{missing}; add them to CONTRACT_CASES.')
  return [(name, cid, kw) for name in sorted(CONTRACT_CASES)
          for cid, kw in CONTRACT_CASES[name]]
