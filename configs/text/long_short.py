r"""Text with Transformer-LS attention (`long_short`, arXiv:2107.02192).

  python -m lra_msmra.main --config configs/text/long_short.py:runlocal \
      --workdir /tmp/text_long_short

Options (comma-separated): those of base.py (`runlocal`, `xiong`, `cst`) and
`best`; what they mean for every task: configs/common/long_short.py.

  (none)      (w, r) = (8, 32): 3,621,890 parameters, 103.9% of the LRA
              Transformer's (docs/protocol.md §11).
  xiong       4000 bytes padded to 4096, with the changes of the official
              script `lra/run_text.sh` (dropout and attention dropout 0,
              weight decay 0.01). Paper Table 1: 66.01.
  xiong,best  (w, r) = (1, 1): 68.40.
  cst         the CST paper's re-run of Transformer-LS: 64.93.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/long_short')

OPTIONS = common.options(base)


def get_config(arg=None):
  config, opts = common.task_config(base, arg, best=(1, 1))
  if 'xiong' in opts:
    # Official script lra/run_text.sh.
    config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
    config.optimizer.weight_decay = 0.01
  return config
