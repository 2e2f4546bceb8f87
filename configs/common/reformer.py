r"""Reformer LSH attention (`reformer`, arXiv:2001.04451): every task.

Each `configs/<task>/reformer.py` calls `task_config` and states only what is
task-specific; this docstring holds what applies to every task.

The layer has shared query-key and value projections plus an output
projection (lra_msmra/attention/reformer.py), one projection fewer than
softmax attention, so with the LRA Transformer's sizes it has fewer
parameters.

Options: those of the task's base.py.

  (none)    the official LRA config: 1 hash round, 10 buckets, chunks of a
            tenth of the (padded) length, each attending to itself and the
            chunk before (the official layer's defaults, `LRA_KNOBS`), plus
            the official per-model file's settings, as far as the parameter
            rule allows (configs/common/lra_models.py).
  xiong     Xiong et al.'s "Reformer (2 hashes)": HuggingFace's
            LSHSelfAttention with its defaults, i.e. chunks of 64, one chunk
            before, 2 * N / 64 buckets for their padded length N,
            RMS-normalised keys and a masked self position (`xiong_knobs`).
  cst       the CST paper's protocol with `LRA_KNOBS` (no CST number).
  runlocal  the task's small CPU model; the protocol's knobs.
"""

from __future__ import annotations

from types import ModuleType

import ml_collections

from lra_msmra import config_lib

lra_models = config_lib.load_sibling(__file__, 'lra_models')

# The official LRA layer's defaults (n_hashes=1, n_buckets=10).
LRA_KNOBS = {'num_hashes': 1, 'num_buckets': 10}


def xiong_knobs(padded_length: int) -> dict[str, object]:
  """HuggingFace LSHSelfAttention defaults at `padded_length` tokens."""
  return {'num_hashes': 2, 'chunk_length': 64,
          'num_buckets': max(2, 2 * padded_length // 64),
          'normalize_keys': True, 'mask_self': True}


def task_config(base: ModuleType, arg: str | None, **per_model: object
                ) -> ml_collections.ConfigDict:
  """The task's config for `arg` with Reformer attention.

  Args:
    base: the task's base.py module.
    arg: its options, comma-separated.
    **per_model: the official per-model file's settings that the parameter
      rule keeps (`lra_models.official`).
  """
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = base.get_config(arg)
  config.model.attention = 'reformer'
  if config.protocol == 'xiong':
    knobs = xiong_knobs(config.data.pad_to_length or 1024)
  else:
    knobs = LRA_KNOBS
  config.model.attention_kw = config_lib.attention_kw(knobs)
  return lra_models.official(config, opts, **per_model)
