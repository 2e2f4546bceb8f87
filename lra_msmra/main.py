r"""Command line: `python -m lra_msmra.main --config FILE[:OPTIONS] --workdir DIR`.

Examples::

  python -m lra_msmra.main --config configs/listops/transformer.py:runlocal \
      --workdir /tmp/listops
  python -m lra_msmra.main --config configs/listops/transformer.py \
      --config.data_dir=/data/lra_release/listops-1000 --workdir /tmp/listops
  # Override any key: --config.batch_size=64 --config.model.dtype=bfloat16

Running the same command again in the same workdir resumes the run.

Several hosts (every host runs the same command):

* Cloud TPU pods and SLURM: add `--distributed`; JAX finds its peers.
* Elsewhere (e.g. several GPU hosts): `--coordinator_address=HOST:PORT
  --num_processes=N --process_id=I` with I = 0..N-1 on the N hosts.
"""

import sys
from typing import Optional

from absl import app
from absl import flags
from ml_collections import config_flags

_WORKDIR = flags.DEFINE_string('workdir', None, 'Folder for checkpoints, '
                               'TensorBoard events and results.json.')
_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file, optionally with :options.',
    lock_config=True)
_DISTRIBUTED = flags.DEFINE_bool(
    'distributed', False, 'Call jax.distributed.initialize() with settings '
    'detected from the environment (Cloud TPU pods, SLURM).')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'HOST:PORT of process 0, for multi-process '
    'runs outside TPU pods (with --num_processes and --process_id).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None,
                                      'Number of processes (hosts).')
_PROCESS_ID = flags.DEFINE_integer('process_id', None,
                                   'Index of this process, 0..N-1.')
flags.mark_flags_as_required(['config', 'workdir'])


def check_distributed_flags(distributed: bool, coordinator: Optional[str],
                            num_processes: Optional[int],
                            process_id: Optional[int]) -> bool:
  """Validates the multi-process flags; returns True if explicit ones are set.

  Raises:
    app.UsageError: naming the flag and the fix.
  """
  explicit = [coordinator, num_processes, process_id]
  if all(v is None for v in explicit):
    return False
  if any(v is None for v in explicit):
    raise app.UsageError('--coordinator_address, --num_processes and '
                         '--process_id go together; give all three.')
  if distributed:
    raise app.UsageError(
        '--distributed detects the cluster from the environment (TPU pods, '
        'SLURM); it cannot be combined with --coordinator_address, '
        '--num_processes and --process_id. Use one or the other.')
  host, _, port = coordinator.rpartition(':')
  if not host or not port.isdigit():
    raise app.UsageError(f'--coordinator_address={coordinator!r} must be '
                         'HOST:PORT of process 0, e.g. 10.0.0.2:1234.')
  if num_processes < 1:
    raise app.UsageError(f'--num_processes={num_processes} must be >= 1.')
  if not 0 <= process_id < num_processes:
    raise app.UsageError(f'--process_id={process_id} must be in 0..'
                         f'{num_processes - 1} (one per process).')
  return True


def initialize_distributed() -> None:
  """Starts the JAX multi-process runtime if the flags ask for it."""
  if check_distributed_flags(_DISTRIBUTED.value, _COORDINATOR.value,
                             _NUM_PROCESSES.value, _PROCESS_ID.value):
    import jax  # pylint: disable=g-import-not-at-top
    # Cross-process collectives on CPU hosts (GPUs and TPUs ignore this).
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                               num_processes=_NUM_PROCESSES.value,
                               process_id=_PROCESS_ID.value)
  elif _DISTRIBUTED.value:
    import jax  # pylint: disable=g-import-not-at-top
    jax.distributed.initialize()


def _plain(value):
  """A JSON-friendly copy of an override value."""
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if isinstance(value, (str, int, float, bool)) or value is None:
    return value
  return str(value)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  initialize_distributed()
  from lra_msmra import train  # pylint: disable=g-import-not-at-top
  launch = {'config': config_flags.get_config_filename(flags.FLAGS['config']),
            'overrides': {k: _plain(v) for k, v in
                          config_flags.get_override_values(
                              flags.FLAGS['config']).items()}}
  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value, launch)
  except train.Preempted:
    sys.exit(143)


if __name__ == '__main__':
  app.run(main)
