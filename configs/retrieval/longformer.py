r"""Retrieval with Longformer attention (`longformer`).

  python -m lra_msmra.main --config configs/retrieval/longformer.py:runlocal \
      --workdir /tmp/retrieval_longformer

The official config (`matching/configs/longformer_base.py`) is the base
config with the model swapped: a sliding window of 512 keys, no global
token. Same parameter count as the LRA Transformer (1,087,618). The LRA
leaderboard reports 56.89.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/longformer.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/longformer')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  return common.apply(base.get_config(arg), opts)
