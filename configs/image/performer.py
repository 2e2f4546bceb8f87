r"""Image with Performer attention (`performer`, arXiv:2009.14794).

  python -m lra_msmra.main --config configs/image/performer.py:runlocal \
      --workdir /tmp/image_performer

Options: see base.py; what they mean for every task:
configs/common/performer.py.

  (none)  the official image/configs/cifar10/performer_base.py sets the
          Transformer's sizes (1 layer, 128/64/128, 8 heads, CLS), with the
          official Performer default (ReLU generalized attention, no random
          features): 248,458 parameters, 100% of the LRA Transformer's. LRA
          leaderboard: 42.77.
  xiong   Xiong et al. (Performer, r = 256): 37.07.
  cst     the CST paper's Performer re-run: 41.73.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/performer')


def get_config(arg=None):
  return common.task_config(base, arg)
