r"""Text with Performer attention (`performer`, arXiv:2009.14794).

  python -m lra_msmra.main --config configs/text/performer.py:runlocal \
      --workdir /tmp/text_performer

Options: see base.py; what they mean for every task:
configs/common/performer.py.

  (none)  the LRA Transformer's config with the official Performer
          default (ReLU generalized attention, no random features; the
          official text_classification/configs/performer_base.py changes
          nothing): 3,486,722 parameters, 100% of the LRA Transformer's.
          LRA leaderboard: 65.40.
  xiong   Xiong et al. (Performer, r = 256): 63.81.
  cst     the CST paper's Performer re-run: 64.65.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/performer')


def get_config(arg=None):
  return common.task_config(base, arg)
