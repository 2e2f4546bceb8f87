r"""Image with Combiner-Fixed (arXiv:2107.05768).

  python -m lra_msmra.main --config configs/image/combiner_fixed.py:runlocal \
      --workdir /tmp/image_combiner_fixed

Combiner's LRA protocol: the official LRA config with the attention swapped
(paper §5.2.1; PROTOCOL §5, §9). No extra parameters, so the model matches the
LRA Transformer's count. The paper does not state its LRA hardware or block
sizes (Appendix E is missing).

Block size: the default power of two nearest to sqrt(N), computed from the
input length: 1025 tokens (CLS + 1024 pixels) -> s = 32, 33 blocks (padded to
1056). The paper reports 41.67 for Combiner-Fixed (its Transformer: 42.44;
ATTENTIONS §7.4).

Options: see base.py (`runlocal`, `xiong`, `cst`).
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.attention = 'combiner'
  config.model.attention_kw.variant = 'fixed'
  return config
