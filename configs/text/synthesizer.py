r"""Text with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/text/synthesizer.py:runlocal \
      --workdir /tmp/text_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the LRA Transformer's config with the official Synthesizer
          (random table plus dot product; the settings of the official
          text_classification/configs/synthesizer_base.py are never read,
          configs/common/synthesizer.py): 19,518,738 parameters, 5.6 times
          the LRA Transformer's (4 heads x 1001^2 per layer). LRA
          leaderboard: 61.68.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')

OVER_BUDGET = ("The official Synthesizer's random tables (4 heads x 1001 x "
               '1001 per layer) give 19,518,738 parameters, 5.6x the LRA '
               "Transformer's.")


def get_config(arg=None):
  return common.task_config(base, arg)
