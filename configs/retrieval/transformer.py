r"""Retrieval with the standard softmax Transformer (the LRA baseline).

  python -m lra_msmra.main --config configs/retrieval/transformer.py:runlocal \
      --workdir /tmp/retrieval_transformer

Options: see base.py (`runlocal`, `xiong`, `cst`). Reference numbers
(docs/protocol.md §10.1, §8.4 and §9.1): LRA 57.46, Xiong et al. 79.35, CST
paper 82.11.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.attention = 'softmax'
  return config
