r"""Text with Combiner-Fixed (arXiv:2107.05768).

  python -m lra_msmra.main --config configs/text/combiner_fixed.py:runlocal \
      --workdir /tmp/text_combiner_fixed

Combiner's LRA protocol: the official LRA config with the attention swapped
(paper §5.2.1; PROTOCOL §5, §9). No extra parameters, so the model matches the
LRA Transformer's count. The paper does not state its LRA hardware or block
sizes (Appendix E is missing).

Block size: the default power of two nearest to sqrt(N), computed from the
input length: 1001 tokens (CLS + 1000) -> s = 32, 32 blocks (padded to 1024).
The paper reports 64.99 for Combiner-Fixed (its Transformer: 64.27; ATTENTIONS
§7.4).

Options: see base.py (`runlocal`, `xiong`, `cst`).
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.attention = 'combiner'
  config.model.attention_kw.variant = 'fixed'
  return config
