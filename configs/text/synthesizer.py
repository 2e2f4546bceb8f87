r"""Text with Synthesizer attention (`synthesizer`, arXiv:2005.00743).

  python -m lra_msmra.main --config configs/text/synthesizer.py:runlocal \
      --workdir /tmp/text_synthesizer

Options: see base.py; what they mean for every task:
configs/common/synthesizer.py.

  (none)  the LRA Transformer's config (the settings of the official
          text_classification/configs/synthesizer_base.py are never read,
          configs/common/synthesizer.py) with the factorised random table of
          rank k = 10 plus the dot product, the largest k within the
          parameter rule: 3,807,042 parameters, 109.2% of the LRA
          Transformer's. Dropped: the official full random table (4 heads x
          1001^2 per layer: 19,518,738 parameters, 5.6 times the
          Transformer's). LRA leaderboard (full table): 61.68.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/synthesizer')


def get_config(arg=None):
  return common.task_config(base, arg, lra_knobs=common.factorized(10))
