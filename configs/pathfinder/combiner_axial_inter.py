r"""Pathfinder-inter with Combiner-Axial: the setting of the Combiner paper.

  python -m lra_msmra.main --config configs/pathfinder/combiner_axial_inter.py \
      --config.data_dir=/path/to/lra_release \
      --workdir DIR

combiner_axial.py with `data.difficulty = 'intermediate'`
(curv_contour_length_9): the paper could not reproduce LRA's Pathfinder with
the default setup and reran every baseline on this split (docs/protocol.md §9).
It reports 88.43 for Combiner-Axial and 88.81 for the Transformer
(docs/mechanisms/combiner.md §10).

Options: see base.py (`runlocal`, `xiong`, `cst`).
"""

from lra_msmra import config_lib

combiner = config_lib.load_sibling(__file__, 'combiner_axial')


def get_config(arg=None):
  config = combiner.get_config(arg)
  config.data.difficulty = 'intermediate'
  return config
