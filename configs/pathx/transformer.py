r"""Path-X with the standard softmax Transformer (the LRA baseline).

  python -m lra_msmra.main --config configs/pathx/transformer.py:runlocal \
      --workdir /tmp/pathx_transformer

Options: `runlocal`. Every model of the LRA paper, this one included, FAILs
(docs/protocol.md §10.1).
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.attention = 'softmax'
  return config
