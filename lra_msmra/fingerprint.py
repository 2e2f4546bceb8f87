"""What makes two runs comparable: the setting of a run and its fingerprint.

A run's *setting* is its config flattened to dotted keys, without the keys
that cannot change its numbers (where the data lives, the seed, logging and
checkpoint periods, evaluation batch size, gradient accumulation), plus
where its examples came from (`data_source`: release files, our seeded
generator with its settings, or mock examples). Runs with equal settings
differ only by seed; `python -m lra_msmra_tools.results` averages exactly those.

The *fingerprint* is a short hash of the setting, written to `results.json`
so runs can be told apart at a glance. A run has the *official config* of a
protocol when its setting equals that of one of our config files under the
protocol's option with no override (see `lra_msmra_tools.results`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

# Config keys that never change what a run computes (or only its rounding,
# for eval_batch_size and grad_accum_steps), so runs that differ in them are
# the same experiment. data.generate/data.generator are replaced by the
# recorded data source, which says what the data actually was.
# `init_from` is where the pretrained encoder was read: what it was is the
# `pretraining.*` keys of a setting (`setting`).
IGNORED_KEYS = ('seed', 'data_dir', 'data.generate', 'data.generator',
                'log_every_steps', 'checkpoint_every_steps',
                'max_checkpoints_to_keep', 'eval_batch_size',
                'grad_accum_steps', 'init_from')


# Config keys added after runs were recorded, with the values that compute
# what those runs computed without the key: at such a value a key is left
# out of a setting and of a config comparison, so a run that sets it is the
# same experiment as one recorded before it existed.
# `model.attention_kw.implementation`: how the attention is computed
# (lra_msmra.kernels); 'xla' is the code every run used before, and
# 'xla_rows', in runs recorded before it was removed (2026-11-29), the same
# code one batch row at a time (the same values up to float32 rounding,
# like eval_batch_size above).
# `objective`, `masking.*`, `init_from` (self-pretraining,
# lra_msmra.objectives): every run before them classified from random
# initialisation.
IMPLICIT_DEFAULTS = {'model.attention_kw.implementation': ('xla', 'xla_rows'),
                     'objective': ('classify',), 'masking.rate': (0.15,),
                     'masking.span': (1,), 'init_from': ('',)}


def flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'a': {'b': 1}} -> {'a.b': 1}; lists and tuples become lists."""
  out = {}
  for key, value in tree.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      out.update(flatten(value, name + '.'))
    else:
      out[name] = list(value) if isinstance(value, (list, tuple)) else value
  return out


def _ignored(key: str) -> bool:
  return any(key == k or key.startswith(k + '.') for k in IGNORED_KEYS)


def without_implicit_defaults(tree: Mapping[str, Any], prefix: str = ''
                              ) -> dict[str, Any]:
  """A copy of a config, nested or flattened, without the keys of
  `IMPLICIT_DEFAULTS` that hold one of their implicit values."""
  out = {}
  for key, value in tree.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      out[key] = without_implicit_defaults(value, name + '.')
    elif value not in IMPLICIT_DEFAULTS.get(name, ()):
      out[key] = value
  return out


def data_source_record(notes: Mapping[str, Any]) -> dict[str, Any]:
  """The data source of a run from its data notes: {'kind': ...} plus the
  generator settings for generated data."""
  kind = notes.get('data_source')
  if kind is None:  # Written before sources were recorded: unknown.
    kind = 'unknown'
  record: dict[str, Any] = {'kind': kind}
  if kind == 'generated' and 'generator' in notes:
    record['generator'] = dict(notes['generator'])
  return record


def setting(config: Mapping[str, Any], data_source: Mapping[str, Any],
            pretraining: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The flattened config without ignored keys and implicit defaults, plus
  the data source and, for a run fine-tuned from a pretrained encoder, what
  the pretraining was (results.json's `pretraining`: objective, masking,
  steps; not where it ran)."""
  out = {k: v for k, v in flatten(without_implicit_defaults(config)).items()
         if not _ignored(k)}
  out.update({f'data_source.{k}': v
              for k, v in flatten(data_source).items()})
  if pretraining:
    out.update({f'pretraining.{k}': v for k, v in flatten(
        {k: pretraining[k] for k in PRETRAINING_KEYS
         if k in pretraining}).items()})
  return out


# What of a pretraining record makes a setting (not its place or outcome).
PRETRAINING_KEYS = ('objective', 'masking', 'steps')


def fingerprint(values: Mapping[str, Any]) -> str:
  """A 12-hex-digit hash of a setting."""
  text = json.dumps(values, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
  """The keys of either mapping whose values differ (a missing key reads
  as None), sorted. Keys of `IMPLICIT_DEFAULTS` at an implicit value count
  as missing, at any depth."""
  a, b = without_implicit_defaults(a), without_implicit_defaults(b)
  return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def differences(values: Mapping[str, Any], reference: Mapping[str, Any],
                *, skip_prefix: str = 'data_source.') -> list[str]:
  """`key=value` for every key whose value differs from `reference`
  (`key=(absent)` where the run lacks it); keys under `skip_prefix` are left
  out (the data source is reported on its own)."""
  out = []
  for key in sorted(set(values) | set(reference)):
    if key.startswith(skip_prefix):
      continue
    if values.get(key, _MISSING) != reference.get(key, _MISSING):
      value = values.get(key, _MISSING)
      out.append(f'{key}={"(absent)" if value is _MISSING else _fmt(value)}')
  return out


_MISSING = object()


def _fmt(value: Any) -> str:
  if isinstance(value, str):
    return value
  return json.dumps(value)
