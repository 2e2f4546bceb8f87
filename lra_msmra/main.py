r"""Command line: `python -m lra_msmra.main --config FILE[:OPTIONS] --workdir DIR`.

Examples::

  python -m lra_msmra.main --config configs/listops/transformer.py:runlocal \
      --workdir /tmp/listops
  python -m lra_msmra.main --config configs/listops/transformer.py \
      --config.data_dir=/data/lra_release/listops-1000 --workdir /tmp/listops
  # Override any key: --config.batch_size=64 --config.model.dtype=bfloat16

Running the same command again in the same workdir resumes the run.
SIGTERM or Ctrl-C saves a checkpoint at the current step and exits (status
143 or 130) with a resume hint; a second Ctrl-C stops at once, without
saving. A closed stdout (`... | head`) does the same as SIGTERM (status 141,
the hint on stderr while stderr is open: `... 2>&1 | head` saves and exits
with 141 silently). (With several processes only SIGTERM is coordinated;
Ctrl-C stops the one process that gets it.) A workdir that another run is
using is refused (`<workdir>/lock`).

Output: the progress lines and the trainer's own messages (its warnings
included) on stdout; library warnings on stderr. The INFO logs of the libraries (orbax, JAX, absl,
TensorFlow) and orbax's warnings are hidden; `--verbose` (or absl's
`--verbosity=0`) shows them.
A bad config key or value, missing data or a locked workdir prints one line,
`error: ...`, on stderr and exits with status 1; other errors show their
traceback.

Several hosts (every host runs the same command):

* Cloud TPU pods and SLURM: add `--distributed`; JAX finds its peers.
* Elsewhere (e.g. several GPU hosts): `--coordinator_address=HOST:PORT
  --num_processes=N --process_id=I` with I = 0..N-1 on the N hosts.
"""

import logging as std_logging
import os
import re
import sys
from typing import Any, Callable, NoReturn, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from lra_msmra import errors

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
_VERBOSE = flags.DEFINE_bool(
    'verbose', False, 'Show the INFO logs of the libraries (orbax, JAX, absl, '
    'TensorFlow) and orbax\'s warnings; same as --verbosity=0. Without it '
    'they are hidden.')
flags.mark_flags_as_required(['config', 'workdir'])


def _fail(message: str, status: int = 1) -> NoReturn:
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(status)


def _config_file(argv: Sequence[str]) -> Optional[str]:
  """The --config file named in `argv` (without its :options)."""
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      value = arg[len('--config='):]
    elif arg == '--config' and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    return value.split(':', 1)[0]
  return None


def unknown_key_message(argv: Sequence[str], error: BaseException) -> str:
  """One line for an override that names no key of the config."""
  text = str(error).replace('\\n', ' ').replace('\\', '')
  suggestion = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  if suggestion:
    key = suggestion.group(2)
  else:
    found = re.search(r"'([^'\s]+)'", text)
    key = found.group(1) if found else None
  override = next((a for a in argv if a.startswith('--config.') and key and
                   key in a.split('=', 1)[0][len('--config.'):].split('.')),
                  None)
  where = _config_file(argv) or 'the config'
  if override is None or key is None:
    return f'{where}: {errors.one_line(error)}'
  message = f'{override}: {where} has no key {key!r}'
  if suggestion:
    message += f'; did you mean {suggestion.group(1)!r}?'
  else:
    message += '; check the name against the config file.'
  return message


def config_load_message(argv: Sequence[str], error: BaseException) -> str:
  """One line for a --config file that could not be loaded."""
  path = _config_file(argv)
  if path and not os.path.exists(path):
    return f'--config {path}: no such file.'
  text = errors.one_line(error)
  prefix = 'Configuration is not available because of an earlier failure to '
  if text.startswith(prefix):
    text = text[len(prefix):]
  return f'--config {path}: {text}'


# What a --config.<key> override's value must be, by the type of the
# config's value (the flag parser's type).
_EXPECTED = {'int': 'an integer', 'float': 'a number', 'bool': 'true or false',
             'str': 'a string'}


def bad_value_message(argv: Sequence[str], error: BaseException
                      ) -> Optional[str]:
  """One line for a --config.<key>=<value> override whose value does not
  parse as the type of the config's value; None for other errors."""
  found = re.match(r'flag --config\.([\w.]+)=', str(error))
  if not found:
    return None
  path = found.group(1)
  flag = flags.FLAGS[f'config.{path}'] if f'config.{path}' in flags.FLAGS \
      else None
  expected = _EXPECTED.get(flag.flag_type()) if flag is not None else None
  if expected is None:
    return None
  prefix = f'--config.{path}='
  value = next((a[len(prefix):] for a in reversed(argv)
                if a.startswith(prefix)), str(error).split('=', 1)[1])
  return (f'{prefix}{value}: config.{path} must be {expected}, got '
          f'{value!r} (the config has {flag.default!r}).')


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing, with every problem told in one line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = bad_value_message(argv, e)
    if message:
      _fail(message)
    text = str(e)
    if 'Traceback (most recent call last)' in text:
      # A config file raised: keep the exception's line, not the frames.
      head = text[:text.index('Traceback (most recent call last)')]
      text = head + text.strip().splitlines()[-1]
      _fail(errors.one_line(text))
    _fail(f'{errors.one_line(text).rstrip(".")} (--helpshort lists the '
          'flags).')
  except (AttributeError, KeyError) as e:
    # ml_collections: a --config.<key> override names no key of the config.
    _fail(unknown_key_message(argv, e))


class _OrbaxBelowError(std_logging.Filter):
  """Drops orbax's log records below ERROR (its advice on saving speed;
  restore failures are reported by lra_msmra.checkpoint itself)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return (record.levelno >= std_logging.ERROR or
            f'{os.sep}orbax{os.sep}' not in record.pathname)


def quiet_libraries() -> None:
  """Hides the INFO logs of absl, JAX and TensorFlow, and orbax's logs below
  ERROR; other warnings stay. Call before jax or TensorFlow is imported.
  """
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')  # TF and XLA C++ logs.
  logging.set_verbosity(logging.WARNING)  # absl, orbax, Python logging.
  logging.get_absl_handler().addFilter(_OrbaxBelowError())


def run_guarded(fn: Callable[[], Any]) -> int:
  """Runs the trainer; returns the exit status.

  A run stopped by SIGTERM or Ctrl-C after saving exits with 128 + the
  signal number; the user's errors (marked by `lra_msmra.errors`) print one
  line and give 1; other exceptions propagate with their traceback.
  """
  from lra_msmra import train  # pylint: disable=g-import-not-at-top
  try:
    fn()
  except train.Preempted as e:
    return 128 + int(e.signum)
  except KeyboardInterrupt:
    print('error: interrupted (Ctrl-C) without saving the current step; '
          'rerun the same command to resume from the last checkpoint.',
          file=sys.stderr, flush=True)
    return 130
  except Exception as e:  # pylint: disable=broad-except
    if not errors.is_user_error(e):
      raise
    print(f'error: {errors.one_line(e)}', file=sys.stderr, flush=True)
    return 1
  return 0


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
    _fail(f'unexpected arguments {argv[1:]}; flags take the form --name=value.')
  if not (_VERBOSE.value or flags.FLAGS['verbosity'].present):
    quiet_libraries()
  try:
    initialize_distributed()
  except app.UsageError as e:
    _fail(errors.one_line(e))
  try:
    config = _CONFIG.value
    config.keys()  # A config file that failed to load raises here.
  except OSError as e:
    _fail(config_load_message(sys.argv, e))
  from lra_msmra import train  # pylint: disable=g-import-not-at-top
  launch = {'config': config_flags.get_config_filename(flags.FLAGS['config']),
            'overrides': {k: _plain(v) for k, v in
                          config_flags.get_override_values(
                              flags.FLAGS['config']).items()}}
  sys.exit(run_guarded(lambda: train.train_and_evaluate(
      config, _WORKDIR.value, launch)))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
