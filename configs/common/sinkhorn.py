r"""Sparse Sinkhorn attention (`sinkhorn`, arXiv:2002.11296): every task.

Each `configs/<task>/sinkhorn.py` calls `task_config` and states only what is
task-specific; this docstring holds what applies to every task.

Knobs (lra_msmra/attention/sinkhorn.py): `block_size` (the official default
50; the official CIFAR and Pathfinder files use 64) and the sorting
(`sort_activation='softmax'`, the official default, used on LRA). The
SortNet adds head_dim x N_B weights per layer (N_B blocks at the task's
length).

Options: those of the task's base.py.

  (none)    the official LRA config: the Transformer's with the attention
            swapped, plus the official per-model file's settings, as
            far as the parameter rule allows (configs/common/
            lra_models.py).
  xiong     the Xiong et al. protocol with the same attention (no published
            Sinkhorn number under it).
  cst       the CST paper's protocol with the same attention.
  runlocal  the task's small CPU model with the same attention.
"""

from __future__ import annotations

from types import ModuleType

import ml_collections

from lra_msmra import config_lib

lra_models = config_lib.load_sibling(__file__, 'lra_models')

# The official layer's default block size.
BLOCK_SIZE = 50


def task_config(base: ModuleType, arg: str | None, *,
                block_size: int = BLOCK_SIZE, weight_decay: float | None = None,
                **per_model: object) -> ml_collections.ConfigDict:
  """The task's config for `arg` with Sinkhorn attention.

  Args:
    base: the task's base.py module.
    arg: its options, comma-separated.
    block_size: tokens per block.
    weight_decay: the official per-model file's weight decay, if any.
    **per_model: the official per-model file's settings that the parameter
      rule keeps (`lra_models.official`).
  """
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = base.get_config(arg)
  config.model.attention = 'sinkhorn'
  config.model.attention_kw = config_lib.attention_kw(
      {'block_size': block_size})
  return lra_models.official(config, opts, weight_decay=weight_decay,
                             **per_model)
