r"""Image with the standard softmax Transformer (the LRA baseline).

  python -m lra_msmra.main --config configs/image/transformer.py:runlocal \
      --workdir /tmp/image_transformer

Options: see base.py (`runlocal`, `xiong`, `cst`). Reference numbers
(docs/protocol.md §10.1, §8.4 and §9.1): LRA 42.44, Xiong et al. 38.20, CST
paper 44.25.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.attention = 'softmax'
  return config
