r"""ListOps with Transformer-LS attention (`long_short`, arXiv:2107.02192).

  python -m lra_msmra.main --config configs/listops/long_short.py:runlocal \
      --workdir /tmp/listops_long_short

Options (comma-separated): those of base.py (`runlocal`, `xiong`, `cst`) and
`best`; what they mean for every task: configs/common/long_short.py.

  (none)      (w, r) = (8, 32): 9,481,226 parameters, 106.0% of the LRA
              Transformer's (docs/protocol.md §11).
  xiong       with the changes of the official script `lra/run_listops.sh`
              (dropout and attention dropout 0). Paper Table 1: 37.50.
  xiong,best  (w, r) = (16, 2): 38.36.
  cst         the CST paper's re-run of Transformer-LS: 38.86.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/long_short')

OPTIONS = common.options(base)


def get_config(arg=None):
  config, opts = common.task_config(base, arg, best=(16, 2))
  if 'xiong' in opts:
    # Official script lra/run_listops.sh.
    config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  return config
