r"""Pathfinder with Combiner-Axial (arXiv:2107.05768).

  python -m lra_msmra.main \
      --config configs/pathfinder/combiner_axial.py:runlocal \
      --workdir /tmp/pathfinder_combiner_axial

Combiner's LRA protocol: the official LRA config with the attention swapped
(paper §5.2.1; PROTOCOL §5, §9). No extra parameters, so the model matches the
LRA Transformer's count. The paper does not state its LRA hardware or block
sizes (Appendix E is missing).

The paper does not say which axial plan it used on LRA. We use 'vertical'
(direct own row and column, column spans above and below, max-pooled): the
official code's 'rowmajor' adds two projections and a LayerNorm per layer,
which breaks the 110% parameter budget (PROTOCOL §10.2) on ListOps, Text,
Retrieval and Pathfinder (+23%, +15%, +12%, +16%). `row_length=32`, so image
rows are grid rows: a 32 x 32 grid (MEAN pooling, no CLS). The paper reports
88.43 for Combiner-Axial on Pathfinder-inter (its Transformer: 88.81), see
combiner_axial_inter.py; it reports nothing on the default 'hard' split.

Options: see base.py (`runlocal`, `xiong`, `cst`).
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.attention = 'combiner'
  kw = config.model.attention_kw
  kw.variant = 'axial'
  kw.axial_plan = 'vertical'
  kw.row_length = 32
  return config
