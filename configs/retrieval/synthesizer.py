r"""Retrieval with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/retrieval/synthesizer.py:runlocal \
      --workdir /tmp/retrieval_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the LRA Transformer's config (the official
          matching/configs/synthesizer_base.py changes nothing) with the
          factorised random table of rank k = 1 and no dot product: with
          the dot product not even k = 1 fits the parameter rule (4 layers x
          4 heads x 2 x 4000 = 128,000 parameters per unit of k, 108,761
          spare); without it the query and key projections go (131,072
          parameters): 1,084,546 parameters, 99.7% of the LRA Transformer's.
          Dropped: the official full random table (4 heads x 4000^2 per
          layer, shared by the two documents' encoder: 257,087,618
          parameters, 236 times the Transformer's) and the dot product. LRA
          leaderboard (full table): 54.67.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')


def get_config(arg=None):
  return common.task_config(base, arg, lra_knobs=common.factorized(1, dot_product=False))
