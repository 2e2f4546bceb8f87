r"""ListOps with the standard softmax Transformer (the LRA baseline).

  python -m lra_msmra.main --config configs/listops/transformer.py:runlocal \
      --workdir /tmp/listops_transformer

Options: see base.py (`runlocal`, `xiong`, `cst`). Reference numbers
(docs/protocol.md §10.1, §8.4 and §9.1): LRA 36.37, Xiong et al. 37.10, CST
paper 39.92.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.attention = 'softmax'
  return config
