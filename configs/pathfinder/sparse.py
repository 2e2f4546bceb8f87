r"""Pathfinder with Sparse Transformer attention (`sparse`, fixed pattern).

  python -m lra_msmra.main --config configs/pathfinder/sparse.py:runlocal \
      --workdir /tmp/pathfinder_sparse

The official config (`image/configs/pathfinder32/sparse_transformer_base.py`),
kept whole: 1 layer (the Transformer has 4) of 32/16/32 with 8 heads (head
width 2), dropout 0.2, MEAN pooling; l = 50, c = 10. 13,666 parameters,
51.5% of the LRA Transformer's. The LRA leaderboard reports 71.71.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task: configs/common/sparse.py and configs/common/lra_models.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sparse')
lra_models = config_lib.load_sibling(__file__, '../common/lra_models')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  config = lra_models.official(base.get_config(arg), opts, num_layers=1,
                               num_heads=8, dropout_rate=0.2)
  return common.apply(config)
