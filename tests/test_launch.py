"""launch/ scripts: syntax, usage text, and the exact commands they run.

The scripts are run in `--dry_run` mode, which prints each command (shell
quoted) instead of running gcloud, ssh or the trainer; the printed lines are
parsed back with shlex and compared argument by argument.
"""

import os
import shlex
import subprocess

import pytest

from tests import helpers

LAUNCH = os.path.join(helpers.ROOT, 'launch')
SCRIPTS = ('tpu_pod.sh', 'multi_gpu.sh')
CONFIG = 'configs/listops/cst.py'
LAUNCHER_VARS = ('TPU_NAME', 'ZONE', 'PROJECT', 'ACCELERATOR_TYPE',
                 'RUNTIME_VERSION', 'SPOT', 'BUCKET', 'MOUNT', 'CONFIG',
                 'DATA_SUBDIR', 'RUN_SUBDIR', 'JAX_VERSION', 'WORKDIR',
                 'DATA_DIR', 'PYTHON', 'COORDINATOR', 'NUM_PROCESSES',
                 'PROCESS_ID', 'SLURM')


def run(script, *args, **env):
  clean = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
  clean.update(env)
  # From another folder: the scripts find the repository themselves.
  return subprocess.run(['bash', os.path.join(LAUNCH, script), *args],
                        cwd='/', env=clean, capture_output=True, text=True,
                        timeout=60)


def lines(proc):
  assert proc.returncode == 0, proc.stderr
  return [shlex.split(line) for line in proc.stdout.splitlines()]


@pytest.mark.parametrize('script', SCRIPTS)
def test_syntax_and_usage(script):
  syntax = subprocess.run(['bash', '-n', os.path.join(LAUNCH, script)],
                          capture_output=True, text=True)
  assert syntax.returncode == 0, syntax.stderr
  proc = run(script, '--help')
  assert proc.returncode == 0
  assert 'Usage: launch/' + script in proc.stdout
  assert 'lra_msmra.main' in proc.stdout and '--dry_run' in proc.stdout


TPU_ENV = dict(TPU_NAME='lra', ZONE='us-central2-b', PROJECT='proj',
               BUCKET='gs://my-lra', CONFIG=CONFIG + ':xiong',
               DATA_SUBDIR='lra_release/listops-1000')


def test_tpu_pod_commands():
  out = lines(run('tpu_pod.sh', '--dry_run', 'all', 'delete', '--',
                  '--config.model.dtype=bfloat16', "--config.x=a b'c",
                  SPOT='1', **TPU_ENV))
  where = ['--zone=us-central2-b', '--project=proj']
  tpu = ['gcloud', 'compute', 'tpus', 'tpu-vm']
  assert out[0] == tpu + ['create', 'lra', *where, '--accelerator-type=v4-32',
                          '--version=tpu-ubuntu2204-base', '--spot']
  assert out[1][:2] == ['git', 'archive'] and out[1][-1] == 'HEAD'
  archive = out[1][out[1].index('-o') + 1]
  assert out[2] == tpu + ['scp', archive, f'lra:{archive}', *where,
                          '--worker=all']
  ssh = tpu + ['ssh', 'lra', *where, '--worker=all']
  install, mount, train = out[3], out[4], out[5]
  for cmd in (install, mount, train):
    assert cmd[:-1] == ssh and cmd[-1].startswith('--command=')
  assert 'pip install -r requirements.txt -e .' in install[-1]
  assert "pip install 'jax[tpu]==0.10.2'" in install[-1]
  assert 'gcsfuse --implicit-dirs' in mount[-1] and 'my-lra /mnt/lra' in (
      mount[-1])
  # The training command, as every worker runs it.
  remote = train[-1][len('--command='):]
  cd, main = remote.split(' && exec ')
  assert cd == 'cd ~/lra_msmra'
  assert shlex.split(main) == [
      'python3', '-m', 'lra_msmra.main', f'--config={CONFIG}:xiong',
      '--workdir=/mnt/lra/runs/lra',
      '--config.data_dir=/mnt/lra/lra_release/listops-1000',
      '--distributed', '--config.model.dtype=bfloat16', "--config.x=a b'c"]
  assert out[6] == tpu + ['delete', 'lra', *where, '--quiet']
  assert len(out) == 7


def test_tpu_pod_defaults_and_errors():
  env = dict(TPU_ENV, PROJECT='', DATA_SUBDIR='')
  env.pop('PROJECT')
  out = lines(run('tpu_pod.sh', '--dry_run', 'run', **env))
  assert '--project=proj' not in out[0]
  main = shlex.split(out[0][-1].split(' && exec ')[1])
  assert not any(a.startswith('--config.data_dir') for a in main)
  for missing, name in (('TPU_NAME', 'TPU_NAME'), ('BUCKET', 'BUCKET'),
                        ('CONFIG', 'CONFIG')):
    env = dict(TPU_ENV)
    env.pop(missing)
    proc = run('tpu_pod.sh', '--dry_run', 'run', **env)
    assert proc.returncode == 2 and name in proc.stderr
  proc = run('tpu_pod.sh', '--dry_run', 'run',
             **dict(TPU_ENV, CONFIG='configs/listops/nope.py'))
  assert proc.returncode == 2 and 'no file configs/listops/nope.py' in (
      proc.stderr)
  assert run('tpu_pod.sh', '--dry_run', 'launch', **TPU_ENV).returncode == 2


def test_multi_gpu_one_host():
  out = lines(run('multi_gpu.sh', '--dry_run', '--',
                  '--config.model.dtype=bfloat16', CONFIG=CONFIG,
                  WORKDIR='/tmp/my run', DATA_DIR='/data/listops-1000'))
  assert out == [['python', '-m', 'lra_msmra.main', f'--config={CONFIG}',
                  '--workdir=/tmp/my run',
                  '--config.data_dir=/data/listops-1000',
                  '--config.model.dtype=bfloat16']]


def test_multi_gpu_several_hosts():
  out = lines(run('multi_gpu.sh', '--dry_run', CONFIG=CONFIG,
                  WORKDIR='/nfs/run', COORDINATOR='10.0.0.2:1234',
                  NUM_PROCESSES='2', PROCESS_ID='1', PYTHON='python3'))
  assert out == [['python3', '-m', 'lra_msmra.main', f'--config={CONFIG}',
                  '--workdir=/nfs/run', '--coordinator_address=10.0.0.2:1234',
                  '--num_processes=2', '--process_id=1']]
  out = lines(run('multi_gpu.sh', '--dry_run', CONFIG=CONFIG,
                  WORKDIR='/nfs/run', SLURM='1'))
  assert out[0][-1] == '--distributed'


@pytest.mark.parametrize('env,message', [
    ({'WORKDIR': '/tmp/x'}, 'set CONFIG'),
    ({'CONFIG': CONFIG}, 'set WORKDIR'),
    ({'CONFIG': 'configs/nope.py', 'WORKDIR': '/tmp/x'}, 'no file'),
    ({'CONFIG': CONFIG, 'WORKDIR': '/tmp/x', 'NUM_PROCESSES': '2'},
     'COORDINATOR, NUM_PROCESSES and PROCESS_ID'),
    ({'CONFIG': CONFIG, 'WORKDIR': '/tmp/x', 'SLURM': '1',
      'PROCESS_ID': '0'}, 'exclude each other'),
], ids=['config', 'workdir', 'no_file', 'partial', 'slurm_and_explicit'])
def test_multi_gpu_errors(env, message):
  proc = run('multi_gpu.sh', '--dry_run', **env)
  assert proc.returncode == 2 and message in proc.stderr
