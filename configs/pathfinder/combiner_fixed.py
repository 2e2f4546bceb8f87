r"""Pathfinder with Combiner-Fixed (arXiv:2107.05768).

  python -m lra_msmra.main \
      --config configs/pathfinder/combiner_fixed.py:runlocal \
      --workdir /tmp/pathfinder_combiner_fixed

Combiner's LRA protocol: the official LRA config with the attention swapped
(paper §5.2.1; PROTOCOL §5, §9). No extra parameters, so the model matches the
LRA Transformer's count. The paper does not state its LRA hardware or block
sizes (Appendix E is missing).

Block size: the default power of two nearest to sqrt(N), computed from the
input length: 1024 pixels (MEAN pooling, no CLS) -> s = 32, 32 blocks. The
paper reports 88.59 for Combiner-Fixed on Pathfinder-inter (its Transformer:
88.81), see combiner_fixed_inter.py; it reports nothing on the default 'hard'
split.

Options: see base.py (`runlocal`, `xiong`, `cst`).
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.attention = 'combiner'
  config.model.attention_kw.variant = 'fixed'
  return config
