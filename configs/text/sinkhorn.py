r"""Text (IMDb bytes) with Sinkhorn attention (`sinkhorn`, arXiv:2002.11296).

  python -m lra_msmra.main --config configs/text/sinkhorn.py:runlocal \
      --workdir /tmp/text_sinkhorn

Options: see base.py; what they mean for every task:
configs/common/sinkhorn.py.

  (none)  the LRA Transformer's config with the attention swapped (no
          official text/configs/sinkhorn_base.py): blocks of 50; 3,492,098
          parameters, 100.2% of the LRA Transformer's. LRA leaderboard:
          61.20.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sinkhorn')


def get_config(arg=None):
  return common.task_config(base, arg)
