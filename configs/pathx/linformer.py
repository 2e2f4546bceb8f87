r"""Path-X with Linformer attention (`linformer`).

  python -m lra_msmra.main --config configs/pathx/linformer.py:runlocal \
      --workdir /tmp/pathx_linformer

LRA has no per-model Path-X config: the Transformer's config with the
attention swapped. E has 16384 rows, so k = 16 would add 262,144 parameters
(149% of the LRA Transformer's 537,954); k = 3, the largest that keeps 110%,
gives 587,106 parameters, 109.1%. Every model of the LRA paper FAILs Path-X.

Options: `runlocal`. What applies to every task:
configs/common/linformer.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/linformer')


def get_config(arg=None):
  opts = config_lib.parse_arg(arg, base.OPTIONS)
  # 16384 rows of E: only k <= 3 keeps the parameter rule (docstring).
  return common.apply(base.get_config(arg), opts, lra_rank=3)
