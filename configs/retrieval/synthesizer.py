r"""Retrieval with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/retrieval/synthesizer.py:runlocal \
      --workdir /tmp/retrieval_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the LRA Transformer's config with the official Synthesizer
          (random table plus dot product; the official
          matching/configs/synthesizer_base.py changes nothing):
          257,087,618 parameters, 236 times the LRA Transformer's (4 heads
          x 4000^2 per layer, shared by the two documents' encoder). LRA
          leaderboard: 54.67.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')

OVER_BUDGET = ("The official Synthesizer's random tables (4 heads x 4000 x "
               '4000 per layer) give 257,087,618 parameters, 236x the LRA '
               "Transformer's.")


def get_config(arg=None):
  return common.task_config(base, arg)
