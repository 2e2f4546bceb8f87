r"""Retrieval with Performer attention (`performer`, arXiv:2009.14794).

  python -m lra_msmra.main --config configs/retrieval/performer.py:runlocal \
      --workdir /tmp/retrieval_performer

Options: see base.py; what they mean for every task:
configs/common/performer.py.

  (none)  the LRA Transformer's config with the official Performer
          default (ReLU generalized attention, no random features; the
          official matching/configs/performer_base.py changes nothing):
          1,087,618 parameters, 100% of the LRA Transformer's. LRA
          leaderboard: 53.82.
  xiong   Xiong et al. (Performer, r = 256): 78.62.
  cst     the CST paper's Performer re-run: 81.69.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/performer')


def get_config(arg=None):
  return common.task_config(base, arg)
