r"""ListOps with Linear Transformer attention (`linear`, arXiv:2006.16236).

  python -m lra_msmra.main --config configs/listops/linear.py:runlocal \
      --workdir /tmp/listops_linear

Options: see base.py; what they mean for every task:
configs/common/linear.py.

  (none)  the LRA Transformer's config with the attention swapped (the
          official listops/configs/linear_transformer_base.py changes
          nothing): 8,948,746 parameters, 100% of the LRA Transformer's.
          LRA leaderboard: 16.13. AdaMRA's re-run under `xiong`: 37.35.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linear')


def get_config(arg=None):
  return common.task_config(base, arg)
