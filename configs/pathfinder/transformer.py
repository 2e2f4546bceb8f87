r"""Pathfinder with the standard softmax Transformer (the LRA baseline).

  python -m lra_msmra.main --config configs/pathfinder/transformer.py:runlocal \
      --workdir /tmp/pathfinder_transformer

Options: see base.py (`runlocal`, `xiong`, `cst`). Reference numbers
(docs/protocol.md §10.1, §8.4 and §9.1): LRA 71.40, Xiong et al. 74.16, CST
paper 74.79.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.attention = 'softmax'
  return config
