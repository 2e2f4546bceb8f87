r"""Retrieval (AAN) with Sinkhorn attention (`sinkhorn`, arXiv:2002.11296).

  python -m lra_msmra.main --config configs/retrieval/sinkhorn.py:runlocal \
      --workdir /tmp/retrieval_sinkhorn

Options: see base.py; what they mean for every task:
configs/common/sinkhorn.py.

  (none)  the LRA Transformer's config with the attention swapped (no
          official matching/configs/sinkhorn_base.py): blocks of 50 over each
          4000-byte document; 1,097,858 parameters, 100.9% of the LRA
          Transformer's. LRA leaderboard: 53.83.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sinkhorn')


def get_config(arg=None):
  return common.task_config(base, arg)
