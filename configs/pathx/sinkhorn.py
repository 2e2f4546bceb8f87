r"""Path-X with Sinkhorn attention (`sinkhorn`, arXiv:2002.11296).

  python -m lra_msmra.main --config configs/pathx/sinkhorn.py:runlocal \
      --workdir /tmp/pathx_sinkhorn

Options: see base.py; what they mean for every task:
configs/common/sinkhorn.py.

  (none)  the LRA Transformer's Path-X config with the attention swapped
          (no official file), blocks of 64 as the official image files;
          540,002 parameters, 100.4% of the LRA Transformer's. LRA
          leaderboard: FAIL.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sinkhorn')


def get_config(arg=None):
  # No official Path-X file: blocks of 64 as the official image files.
  return common.task_config(base, arg, block_size=64)
