r"""BigBird attention (`bigbird`): settings of every task.

Each `configs/<task>/bigbird.py` calls `apply` on its task's base config
and states only what is task-specific; this docstring holds what applies to
every task. How official per-model settings are taken:
configs/common/lra_models.py.

Knobs (lra_msmra/attention/bigbird.py lists every choice): the official
LRA values on every task, blocks of b = 64 tokens and r = 3 random blocks
per query block and head, drawn within the first 1024 positions (the
official `last_idx`). BigBird has no parameters of its own: the model has
the Transformer's count for the same sizes.

Attention dropout: the official BigBird attention never applies its
`attention_dropout_rate`, so under the LRA protocol the configs set it to 0
(`model.attention_dropout_rate`), which is what ran. The `xiong` and `cst`
protocols keep theirs.

`runlocal` uses b = 16 on the text-like tasks, whose runlocal inputs (at
most 257 tokens) would otherwise be 2 to 5 blocks of 64, mostly global.
"""

import ml_collections

from lra_msmra import config_lib

BLOCK_SIZE, NUM_RANDOM_BLOCKS = 64, 3
RUNLOCAL_BLOCK_SIZE = 16


def apply(config: ml_collections.ConfigDict, opts: set[str],
          image: bool = False) -> ml_collections.ConfigDict:
  """Swaps in BigBird (b = 64, r = 3); returns `config`."""
  config.model.attention = 'bigbird'
  block = BLOCK_SIZE
  if 'runlocal' in opts and not image:
    block = RUNLOCAL_BLOCK_SIZE
  config.model.attention_kw = config_lib.attention_kw(dict(
      block_size=block, num_random_blocks=NUM_RANDOM_BLOCKS,
      random_limit=1024, seed=0))
  if config.protocol == 'lra':
    # The official sparse path drops no attention weight.
    config.model.attention_dropout_rate = 0.0
  return config
