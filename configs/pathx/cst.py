r"""Path-X (Pathfinder 128x128) with Composite Slice Attention (`cst`).

  python -m lra_msmra.main --config configs/pathx/cst.py:runlocal \
      --workdir /tmp/pathx_cst

The official LRA config (docs/protocol.md §5.6) with only the attention swapped.
The CST paper gives no Path-X setting; we use slices of L = 32 pixels (a
quarter image row). At N = 16384 the cost per head,
N L local plus (N / L)^2 global score entries, is smallest near
L = (2N)^(1/3), i.e. 32: 0.5M + 0.26M entries, against 0.13M + 4.2M at
L = 8. MS-VIPE replaces the learned input table of 16384 x 32 parameters
with (32 + 512) x 32, so the model is far below the LRA Transformer's size.
Every model of the LRA paper FAILs Path-X (chance level, docs/protocol.md
§10.1).

The other knobs and the ablation overrides: configs/common/cst.py.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/cst')


def get_config(arg=None):
  # Balances the local and global costs at 16384 tokens (docstring).
  return common.apply(base.get_config(arg), slice_length=32)
