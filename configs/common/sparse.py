r"""Sparse Transformer attention, fixed pattern (`sparse`): every task.

Each `configs/<task>/sparse.py` calls `apply` on its task's base config and
states only what is task-specific; this docstring holds what applies to
every task. How official per-model settings are taken:
configs/common/lra_models.py.

Knobs (lra_msmra/attention/sparse.py lists every choice): the fixed pattern
with block length l = 50 and c = 10 summary positions per block, the values
LRA passes on every task (`utils/train_utils.py`), causal inside the
pattern as in the official encoder (`pattern_causal=True`). With CLS
pooling the first position is outside the pattern, as the official
`use_cls_token`, which depends on the pooling only: it sees every key and
every query sees it. That position is the CLS token, or on Retrieval (no
CLS token) the first byte of each document, which CLS pooling reads. The
pattern has no parameters: the model has the Transformer's count for the
same sizes.
"""

import ml_collections

from lra_msmra import config_lib

BLOCK_SIZE, SUMMARY_SIZE = 50, 10


def apply(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Swaps in the fixed sparse pattern; call after the pooling is final."""
  config.model.attention = 'sparse'
  config.model.attention_kw = config_lib.attention_kw(dict(
      block_size=BLOCK_SIZE, summary_size=SUMMARY_SIZE, pattern_causal=True,
      num_prefix_tokens=int(config.model.pooling == 'CLS')))
  return config
