"""The command line's exits: one line for the user's errors, signal codes."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from lra_msmra import errors
from lra_msmra import main as main_lib
from lra_msmra import train
from lra_msmra import checkpoint
from tests import helpers


def _raise(error):
  def fn():
    raise error
  return fn


def test_user_errors_print_one_line(capsys):
  error = errors.mark(ValueError('config.batch_size=0 must be a positive\n'
                                 '  integer.'))
  assert main_lib.run_guarded(_raise(error)) == 1
  assert capsys.readouterr().err == (
      'error: config.batch_size=0 must be a positive integer.\n')


def test_other_errors_keep_their_traceback():
  with pytest.raises(ValueError, match='a bug'):
    main_lib.run_guarded(_raise(ValueError('a bug')))


@pytest.mark.parametrize('signum,status', [(signal.SIGTERM, 143),
                                           (signal.SIGINT, 130)])
def test_a_saved_stop_exits_with_the_signal_status(signum, status):
  assert main_lib.run_guarded(_raise(train.Preempted(3, signum))) == status


def test_second_ctrl_c_exits_without_a_traceback(capsys):
  assert main_lib.run_guarded(_raise(KeyboardInterrupt())) == 130
  assert 'rerun the same command' in capsys.readouterr().err


def test_unknown_key_message_names_the_override_and_the_fix():
  argv = ['main', '--config', 'configs/listops/transformer.py:runlocal',
          '--config.model.num_layerz=3']
  config = helpers.load_config('configs/listops/transformer.py', 'runlocal')
  with pytest.raises(AttributeError) as error:  # What the override meets.
    getattr(config.model, 'num_layerz')
  error = error.value
  assert main_lib.unknown_key_message(argv, error) == (
      "--config.model.num_layerz=3: configs/listops/transformer.py has no "
      "key 'num_layerz'; did you mean 'num_layers'?")


def test_locked_workdir_is_one_line_without_traceback(tmp_path):
  """The whole command: quiet libraries, the refusal in one line."""
  holder = {'pid': os.getppid(), 'host': socket.gethostname(),
            'started': 'earlier', 'command': 'python -m lra_msmra.main ...',
            'process_start': checkpoint._process_start(os.getppid()),  # pylint: disable=protected-access
            'pid_namespace': checkpoint._pid_namespace()}  # pylint: disable=protected-access
  (tmp_path / checkpoint.LOCK_FILE).write_text(json.dumps(holder))
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  env['XLA_FLAGS'] = helpers.xla_flags(1)
  proc = subprocess.run(
      [sys.executable, '-m', 'lra_msmra.main', '--config',
       'tests/configs/tiny_listops.py', '--workdir', str(tmp_path)],
      cwd=helpers.ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stdout == ''
  [line] = proc.stderr.splitlines()
  assert line.startswith(f'error: Another run is using {tmp_path}: process '
                         f'{os.getppid()} on host {socket.gethostname()}')


def _command(workdir, *overrides, config='tests/configs/tiny_listops.py'):
  return [sys.executable, '-m', 'lra_msmra.main', '--config', config,
          '--workdir', str(workdir), *overrides]


def _env():
  env = dict(os.environ)
  env['XLA_FLAGS'] = helpers.xla_flags(1)
  env['TF_CPP_MIN_LOG_LEVEL'] = '3'
  return env


@pytest.mark.parametrize('override,expected', [
    ('--config.batch_size=abc', "--config.batch_size=abc: config.batch_size "
     "must be an integer, got 'abc' (the config has 8)."),
    ('--config.model.dropout_rate=high', '--config.model.dropout_rate=high: '
     "config.model.dropout_rate must be a number, got 'high'"),
    ('--config.model.causal=maybe', '--config.model.causal=maybe: '
     "config.model.causal must be true or false, got 'maybe'"),
])
def test_a_value_of_the_wrong_type_names_the_key_and_the_value(
    tmp_path, override, expected):
  workdir = tmp_path / 'run'
  proc = subprocess.run(_command(workdir, override), cwd=helpers.ROOT,
                        env=_env(), capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 1
  [line] = proc.stderr.splitlines()
  assert line.startswith(f'error: {expected}'), line
  assert not workdir.exists()


def test_a_closed_stdout_saves_and_stops_like_sigterm(tmp_path):
  """`main ... | head`: the pipe closes while the run trains."""
  proc = subprocess.Popen(
      _command(tmp_path, '--config.num_train_steps=1000',
               '--config.log_every_steps=1', '--config.eval_every_steps=1000',
               '--config.checkpoint_every_steps=1000'),
      cwd=helpers.ROOT, env=_env(), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  try:
    for line in proc.stdout:
      if line.startswith('Compiled the training step'):
        break
    proc.stdout.close()  # As `head` exits after its lines.
    err = proc.stderr.read()
    proc.wait(timeout=240)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 128 + signal.SIGPIPE, err[-3000:]
  [saved] = os.listdir(tmp_path / 'checkpoints')
  assert 0 < int(saved) < 1000
  assert (f'SIGPIPE (stdout closed): saved step {saved} in '
          f'{tmp_path}/checkpoints; rerun the same command to resume.') in err
  assert 'Traceback' not in err and 'BrokenPipeError' not in err, err
  assert not os.path.exists(tmp_path / 'results.json')
  assert not os.path.exists(tmp_path / checkpoint.LOCK_FILE)


def test_closed_stdout_and_stderr_still_save_and_exit_141(tmp_path):
  """`main ... 2>&1 | head`: both streams close while the run trains."""
  proc = subprocess.Popen(
      _command(tmp_path, '--config.num_train_steps=1000',
               '--config.log_every_steps=1', '--config.eval_every_steps=1000',
               '--config.checkpoint_every_steps=1000'),
      cwd=helpers.ROOT, env=_env(), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)
  try:
    for line in proc.stdout:
      if line.startswith('Compiled the training step'):
        break
    proc.stdout.close()  # As `head` exits after its lines.
    proc.wait(timeout=240)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 128 + signal.SIGPIPE
  [saved] = os.listdir(tmp_path / 'checkpoints')
  assert 0 < int(saved) < 1000
  assert not os.path.exists(tmp_path / checkpoint.LOCK_FILE)
