"""Command line: `python -m lra_msmra.main --config FILE[:OPTIONS] --workdir DIR`.

Examples::

  python -m lra_msmra.main --config configs/listops/transformer.py:runlocal \
      --workdir /tmp/listops
  python -m lra_msmra.main --config configs/listops/transformer.py \
      --config.data_dir=/data/lra_release/listops-1000 --workdir /tmp/listops
  # Override any key: --config.batch_size=64 --config.model.dtype=bfloat16

Running the same command again in the same workdir resumes the run.
"""

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

_WORKDIR = flags.DEFINE_string('workdir', None, 'Folder for checkpoints, '
                               'TensorBoard events and results.json.')
_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file, optionally with :options.',
    lock_config=True)
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  from lra_msmra import train  # pylint: disable=g-import-not-at-top
  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except train.Preempted:
    sys.exit(143)


if __name__ == '__main__':
  app.run(main)
