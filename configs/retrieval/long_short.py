r"""Retrieval with Transformer-LS attention (`long_short`, arXiv:2107.02192).

  python -m lra_msmra.main --config configs/retrieval/long_short.py:runlocal \
      --workdir /tmp/retrieval_long_short

Options (comma-separated): those of base.py (`runlocal`, `xiong`, `cst`) and
`best`; what they mean for every task: configs/common/long_short.py.

  (none)      (w, r) = (8, 32): 1,155,202 parameters, 106.2% of the LRA
              Transformer's (docs/protocol.md §11).
  xiong       with the changes of the official script `lra/run_retrieval.sh`
              (weight decay 0.01, 8000 warmup steps, the "more warmup steps"
              of paper §4.1, and documents cut at 4096 bytes). Paper Table 1:
              81.79.
  xiong,best  (w, r) = (1, 254): 81.95.
  cst         the CST paper's re-run of Transformer-LS: 83.88.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/long_short')

OPTIONS = common.options(base)


def get_config(arg=None):
  config, opts = common.task_config(base, arg, best=(1, 254))
  if 'xiong' in opts:
    # Official script lra/run_retrieval.sh.
    config.optimizer.weight_decay = 0.01
    if 'runlocal' not in opts:  # runlocal keeps its short length and warmup.
      config.schedule.warmup_steps = 8000
      config.data.max_length = config.data.pad_to_length = 4096
  return config
