r"""Retrieval with Linformer attention (`linformer`).

  python -m lra_msmra.main --config configs/retrieval/linformer.py:runlocal \
      --workdir /tmp/retrieval_linformer

The official config (`matching/configs/linformer_base.py`) is the base
config with the model swapped: k = 16 and one E of 4000 x 16 per layer,
1,343,618 parameters, 123.5% of the LRA Transformer's 1,087,618, beyond the
leaderboard's 110%. We share one E between the 4 layers (the paper's
layerwise sharing): 1,151,618 parameters, 105.9%. The LRA leaderboard
reports 52.27.

Options: see base.py (`runlocal`, `xiong`, `cst`). What applies to every
task, the `xiong` setting included: configs/common/linformer.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linformer')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  return common.apply(base.get_config(arg), opts, share_layers=True)
