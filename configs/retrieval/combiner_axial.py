r"""Retrieval with Combiner-Axial (arXiv:2107.05768).

  python -m lra_msmra.main \
      --config configs/retrieval/combiner_axial.py:runlocal \
      --workdir /tmp/retrieval_combiner_axial

Combiner's LRA protocol: the official LRA config with the attention swapped
(paper §5.2.1; PROTOCOL §5, §9). No extra parameters, so the model matches the
LRA Transformer's count. The paper does not state its LRA hardware or block
sizes (Appendix E is missing).

The paper does not say which axial plan it used on LRA. We use 'vertical'
(direct own row and column, column spans above and below, max-pooled): the
official code's 'rowmajor' adds two projections and a LayerNorm per layer,
which breaks the 110% parameter budget (PROTOCOL §10.2) on ListOps, Text,
Retrieval and Pathfinder (+23%, +15%, +12%, +16%). Row length: the default
power of two nearest to sqrt(N): 4000 tokens -> a 63 x 64 grid (m = 64). The
paper reports 56.10 for Combiner-Axial (its Transformer: 57.46; ATTENTIONS
§7.4).

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
  return config
