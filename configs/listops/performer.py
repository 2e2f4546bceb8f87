r"""ListOps with Performer attention (`performer`, arXiv:2009.14794).

  python -m lra_msmra.main --config configs/listops/performer.py:runlocal \
      --workdir /tmp/listops_performer

Options: see base.py; what they mean for every task:
configs/common/performer.py.

  (none)  the LRA Transformer's config with FAVOR+ and 2 orthogonal
          features, as the official listops/configs/performer_base.py
          (`LRA_KERNEL`; the official code redraws them at every call from
          a batch-dependent seed, we keep them fixed): 8,948,746
          parameters, 100% of the LRA Transformer's. LRA leaderboard: 18.01.
  xiong   Xiong et al. (Performer, r = 256): 18.80.
  cst     the CST paper's Performer re-run: 37.25.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/performer')


# Official listops/configs/performer_base.py: attention_fn_cls='softmax',
# nb_features=2, ortho_scaling=0.
LRA_KERNEL = {'kernel': 'softmax', 'num_features': 2}


def get_config(arg=None):
  return common.task_config(base, arg, lra_kernel=LRA_KERNEL)
