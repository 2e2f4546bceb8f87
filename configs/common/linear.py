r"""Linear Transformer attention (`linear`, arXiv:2006.16236): every task.

Each `configs/<task>/linear.py` calls `task_config` and states only what is
task-specific (the official per-model file's changes, the parameter count,
the published numbers); this docstring holds what applies to every task.

The attention has no knobs (elu + 1 features, the official epsilon), and the
same Q/K/V/output projections as softmax attention, so with the LRA
Transformer's sizes the parameter count is the Transformer's.

Options: those of the task's base.py.

  (none)    the official LRA config for the model: the Transformer's with
            the attention swapped, plus the settings of the official
            `linear_transformer_base.py` of the task where it has one, as
            far as the parameter rule allows (configs/common/
            lra_models.py).
  xiong     the Xiong et al. protocol with the attention swapped (their
            PyTorch code has a "linear" entry; its numbers are not in their
            table). The AdaMRA paper re-ran it under this protocol.
  cst       the CST paper's protocol with the attention swapped.
  runlocal  the task's small CPU model with the attention swapped.
"""

from __future__ import annotations

from types import ModuleType

import ml_collections

from lra_msmra import config_lib

lra_models = config_lib.load_sibling(__file__, 'lra_models')


def task_config(base: ModuleType, arg: str | None, **per_model: object
                ) -> ml_collections.ConfigDict:
  """The task's config for `arg` with linear attention.

  Args:
    base: the task's base.py module.
    arg: its options, comma-separated.
    **per_model: the official per-model file's settings that the parameter
      rule keeps (`lra_models.official`).
  """
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = base.get_config(arg)
  config.model.attention = 'linear'
  return lra_models.official(config, opts, **per_model)
