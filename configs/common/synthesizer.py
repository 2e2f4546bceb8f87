r"""Synthesizer attention (`synthesizer`, arXiv:2005.00743): every task.

Each `configs/<task>/synthesizer.py` calls `task_config` and states only what
is task-specific; this docstring holds what applies to every task.

The official LRA Synthesizer is the Random Synthesizer mixed with dot-product
attention (`synthesizer_mode='random'`, `ignore_dot_product=False`, the
encoder's defaults; the Text file's `factorized_random`, k = 32 and
`ignore_dot_product` sit outside `config.model`, where the training script
never reads them). Its table R has heads x L x L trainable parameters per
layer (L = the input length, CLS included): 5.6 (Text) to 318 (Pathfinder)
times the LRA Transformer's parameters, so no official Synthesizer config
keeps the leaderboard's 110% rule (configs/common/lra_models.py).

Under the LRA protocol our configs keep the rule. The table is the knob that
adds parameters, and it is reduced, in this order of preference, to the
first form that fits:

1. the paper's factorised random table R = R1 R2 (heads x 2 x L x k per
   layer) with the dot product, k the largest value up to 32 (the Text
   file's rank) that fits (`factorized(k)`);
2. the same without the dot product (the Factorized Random Synthesizer on
   its own, which frees the query and key projections:
   `factorized(k, dot_product=False)`).

Where not even k = 1 fits (Pathfinder: 4 layers of 1024 positions with 2,653
spare parameters; Path-X: 16,384 positions with 53,795 spare), the task has
no Synthesizer config: no synthetic table of any form fits there. Each task's
config gives its k and parameter count.

Options: those of the task's base.py.

  (none)    the LRA Transformer's config (with the official per-model
            file's settings as far as the parameter rule allows,
            configs/common/lra_models.py) and the reduced table above.
  runlocal  the task's small CPU model with the same knobs.
  xiong     the Xiong et al. protocol with the official Synthesizer (full
            random table plus dot product; no parameter rule applies and no
            Synthesizer number was published under it).
  cst       the CST paper's protocol with the official Synthesizer.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Mapping

import ml_collections

from lra_msmra import config_lib

lra_models = config_lib.load_sibling(__file__, 'lra_models')

# The official encoder's defaults: the leaderboard's Synthesizer.
OFFICIAL_KNOBS = {'synthesizer_mode': 'random', 'ignore_dot_product': False}
# The rank the official Text file names: the largest k we use.
MAX_FACTORIZED_K = 32


def factorized(k: int, dot_product: bool = True) -> dict[str, Any]:
  """Knobs of the factorised random table of rank `k` (docstring)."""
  if not 1 <= k <= MAX_FACTORIZED_K:
    raise ValueError(f'k={k} must be in [1, {MAX_FACTORIZED_K}].')
  return {'synthesizer_mode': 'factorized_random', 'factorized_k': k,
          'ignore_dot_product': not dot_product}


def task_config(base: ModuleType, arg: str | None,
                lra_knobs: Mapping[str, Any], **per_model: object
                ) -> ml_collections.ConfigDict:
  """The task's config for `arg` with Synthesizer attention.

  Args:
    base: the task's base.py module.
    arg: its options, comma-separated.
    lra_knobs: the attention's knobs under the LRA protocol (and its
      runlocal), within the parameter rule.
    **per_model: the official per-model file's settings that the parameter
      rule keeps (`lra_models.official`).
  """
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = base.get_config(arg)
  config.model.attention = 'synthesizer'
  knobs = lra_knobs if config.protocol == 'lra' else OFFICIAL_KNOBS
  config.model.attention_kw = config_lib.attention_kw(knobs)
  return lra_models.official(config, opts, **per_model)
