r"""Text with Linear Transformer attention (`linear`, arXiv:2006.16236).

  python -m lra_msmra.main --config configs/text/linear.py:runlocal \
      --workdir /tmp/text_linear

Options: see base.py; what they mean for every task:
configs/common/linear.py.

  (none)  the LRA Transformer's config with the attention swapped (the
          official text_classification/configs/linear_transformer_base.py
          changes nothing): 3,486,722 parameters, 100% of the LRA
          Transformer's. LRA leaderboard: 65.90. AdaMRA's re-run under
          `xiong`: 64.15.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linear')


def get_config(arg=None):
  return common.task_config(base, arg)
