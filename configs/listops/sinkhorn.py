r"""TITLE with Sparse Sinkhorn attention (`sinkhorn`, arXiv:2002.11296).

  python -m lra_msmra.main --config configs/listops/sinkhorn.py:runlocal \
      --workdir /tmp/listops_sinkhorn

Options: see base.py; what they mean for every task:
configs/common/sinkhorn.py.

NOTE
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sinkhorn')


def get_config(arg=None):
  return common.task_config(base, arg)
