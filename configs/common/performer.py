r"""Performer attention (`performer`, arXiv:2009.14794): every task.

Each `configs/<task>/performer.py` calls `task_config` and states only what
is task-specific; this docstring holds what applies to every task.

Knobs (lra_msmra/attention/performer.py): `kernel` ('softmax' = FAVOR+
positive random features, 'relu' = generalized attention), `num_features`,
`features`. The attention adds no parameters: with the LRA Transformer's
sizes the parameter count is the Transformer's.

Options: those of the task's base.py.

  (none)    the official LRA config for the model. The official Performer
            encoder defaults to generalized attention with a ReLU kernel on
            the raw queries and keys (no random features:
            `KERNEL_LRA_DEFAULT`); ListOps' official performer_base.py
            asks for FAVOR+ with 2 orthogonal features instead. Plus the
            official per-model file's settings, as far as the parameter
            rule allows (configs/common/lra_models.py).
  xiong     the Xiong et al. protocol with their Performer, "r = 256"
            (`KERNEL_XIONG`). Their code calls performer_pytorch's
            FastAttention with 256 features and kernel_fn=ReLU but without
            generalized_attention, which makes it the softmax kernel; they
            also divide q and k by d^{1/4} before FastAttention divides them
            again (an effective 1/d temperature), which we do not reproduce.
  cst       the CST paper's protocol; its Performer re-run does not state its
            settings, so we use `KERNEL_XIONG`.
  runlocal  the task's small CPU model with the LRA knobs of the task.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Mapping

import ml_collections

from lra_msmra import config_lib

lra_models = config_lib.load_sibling(__file__, 'lra_models')

# The official encoder's default: generalized attention, ReLU, no features.
KERNEL_LRA_DEFAULT = {'kernel': 'relu'}
# Xiong et al.'s "performer-256" (see the docstring).
KERNEL_XIONG = {'kernel': 'softmax', 'num_features': 256}


def task_config(base: ModuleType, arg: str | None,
                lra_kernel: Mapping[str, Any] = KERNEL_LRA_DEFAULT,
                **per_model: object) -> ml_collections.ConfigDict:
  """The task's config for `arg` with Performer attention.

  Args:
    base: the task's base.py module.
    arg: its options, comma-separated.
    lra_kernel: the knobs under the LRA protocol (and its runlocal).
    **per_model: the official per-model file's settings that the parameter
      rule keeps (`lra_models.official`).
  """
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = base.get_config(arg)
  config.model.attention = 'performer'
  kernel = lra_kernel if config.protocol == 'lra' else KERNEL_XIONG
  config.model.attention_kw = config_lib.attention_kw(kernel)
  return lra_models.official(config, opts, **per_model)
