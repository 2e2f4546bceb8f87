r"""Image with Linear Transformer attention (`linear`, arXiv:2006.16236).

  python -m lra_msmra.main --config configs/image/linear.py:runlocal \
      --workdir /tmp/image_linear

Options: see base.py; what they mean for every task:
configs/common/linear.py.

  (none)  the official image/configs/cifar10/linear_transformer_base.py
          sets the Transformer's sizes (1 layer, 128/64/128, 8 heads, CLS):
          248,458 parameters, 100% of the LRA Transformer's. LRA
          leaderboard: 42.34. AdaMRA's re-run under `xiong`: 38.20.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linear')


def get_config(arg=None):
  return common.task_config(base, arg)
