r"""ListOps with Sinkhorn attention (`sinkhorn`, arXiv:2002.11296).

  python -m lra_msmra.main --config configs/listops/sinkhorn.py:runlocal \
      --workdir /tmp/listops_sinkhorn

Options: see base.py; what they mean for every task:
configs/common/sinkhorn.py.

  (none)  the LRA Transformer's config with the attention swapped (no
          official listops/configs/sinkhorn_base.py): blocks of 50, 2001
          tokens with CLS -> 41 blocks; 8,959,242 parameters, 100.1% of the
          LRA Transformer's (the SortNet). LRA leaderboard: 33.67.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sinkhorn')


def get_config(arg=None):
  return common.task_config(base, arg)
