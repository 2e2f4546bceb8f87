"""launch/ scripts: syntax, usage text, and the exact commands they run.

The scripts are run in `--dry_run` mode, which prints each command (shell
quoted) instead of running gcloud, ssh or the trainer; the printed lines are
parsed back with shlex and compared argument by argument. The suite's
scheduling (--jobs, --stop_after) runs small Python stand-ins for training
runs.
"""

import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import time

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


@pytest.mark.parametrize('config, tfds', [('configs/text/cst.py', True),
                                          ('configs/image/cst.py', True),
                                          ('configs/listops/cst.py', False)])
def test_tpu_pod_installs_tensorflow_for_text_and_image_only(config, tfds):
  """Text and Image read their real data with TFDS (requirements-tfds.txt);
  other tasks install without TensorFlow."""
  env = dict(TPU_ENV, CONFIG=config)
  install = lines(run('tpu_pod.sh', '--dry_run', 'setup', **env))[2]
  assert ('pip install -r requirements.txt -r requirements-tfds.txt -e .'
          in install[-1]) == tfds
  assert ('pip install -r requirements.txt -e .' in install[-1]) != tfds


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


# ------------------------------------------------------------ launch/suite.py

def _load_suite():
  spec = importlib.util.spec_from_file_location(
      'launch_suite', os.path.join(LAUNCH, 'suite.py'))
  module = importlib.util.module_from_spec(spec)
  sys.modules['launch_suite'] = module  # For its dataclasses.
  spec.loader.exec_module(module)
  return module


suite = _load_suite()

SUITE = [sys.executable, os.path.join(LAUNCH, 'suite.py'), '--protocol',
         'cst', '--tasks', 'listops', '--mechanisms', 'cst,transformer',
         '--lr_bracket', '1,2', '--seeds', '0,1', '--data_dir', '/data']


def test_suite_jobs_dry_run_plan_unchanged(tmp_path):
  cmd = SUITE + ['--root', str(tmp_path), '--dry_run']
  one = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
  assert one.returncode == 0, one.stderr
  assert len([l for l in one.stdout.splitlines() if 'lra_msmra.main' in l]
             ) == 8
  two = subprocess.run(cmd + ['--jobs', '2', '--stop_after', '500'],
                       capture_output=True, text=True, timeout=120)
  assert two.returncode == 0, two.stderr
  assert two.stdout == one.stdout


# Stand-ins for training runs: `code` runs in a fresh Python.
OK = 'import time; print("training"); time.sleep(0.3)'
STOPS = ('import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: '
         '(print("saved"), sys.exit(143))); print("training", flush=True); '
         'time.sleep(30)')
IGNORES = ('import signal, time; signal.signal(signal.SIGTERM, '
           'signal.SIG_IGN); print("deaf", flush=True); time.sleep(30)')
FAILS = 'import sys; print("bad"); sys.exit(1)'


def _stub(tmp_path, name, code):
  return (str(tmp_path / name), [sys.executable, '-c', code])


def test_suite_stop_after_stops_runs_and_starts_none_late(tmp_path, capsys):
  runs = [_stub(tmp_path, 'a', OK), _stub(tmp_path, 'b', STOPS),
          _stub(tmp_path, 'c', OK)]
  # `a` ends after 0.3 s or more: then under min_start_s are left.
  outcome = suite.execute(runs, jobs=2, stop_after=3.0, min_start_s=2.8,
                          poll_s=0.02)
  assert outcome.finished == [runs[0][0]]
  assert outcome.stopped == [runs[1][0]]
  assert outcome.not_started == [runs[2][0]] and not outcome.failed
  assert outcome.unfinished == [runs[1][0], runs[2][0]]
  said = [l.split('] ', 1)[1] for l in capsys.readouterr().out.splitlines()]
  a, b, c = (r[0] for r in runs)
  assert said[0].startswith(f'start {a} (log {a}/run.log): ')
  assert said[1].startswith(f'start {b} (log {b}/run.log): ')
  assert said[2].startswith(f'finished {a} in ')
  assert said[3:] == [f'not started {c}: under 2.8 s left',
                      f'deadline: SIGTERM to {b}',
                      said[5]]
  assert said[5].startswith(f'stopped {b} after ') and said[5].endswith(
      '(exit 143): unfinished, resumes from its checkpoint')
  log = open(os.path.join(b, 'run.log')).read().splitlines()
  assert log[0].startswith('==== ') and log[1:] == ['training', 'saved']
  assert not os.path.exists(c)


def test_suite_kills_a_run_deaf_to_sigterm_and_reports_failures(
    tmp_path, capsys):
  runs = [_stub(tmp_path, 'deaf', IGNORES), _stub(tmp_path, 'bad', FAILS)]
  outcome = suite.execute(runs, jobs=2, stop_after=2.0, min_start_s=0,
                          stop_grace_s=0.3, poll_s=0.02)
  assert outcome.failed == [runs[1][0]]
  assert outcome.stopped == [runs[0][0]] and not outcome.finished
  out = capsys.readouterr().out
  assert f'failed {runs[1][0]} after ' in out
  assert f'(exit 1, see {runs[1][0]}/run.log)' in out
  assert 'still running 0.3 s after SIGTERM: killed' in out


def test_suite_one_job_keeps_the_output_here(tmp_path, capfd):
  runs = [_stub(tmp_path, 'a', OK)]
  outcome = suite.execute(runs, poll_s=0.02)
  assert outcome.finished == [runs[0][0]]
  out = capfd.readouterr().out.splitlines()
  assert out == [shlex.join(runs[0][1]), 'training']
  assert not os.path.exists(runs[0][0])


def test_suite_exit_status_unfinished(tmp_path, monkeypatch, capsys):
  begun = str(tmp_path / 'begun')
  os.makedirs(os.path.join(begun, 'checkpoints'))
  runs = [_stub(tmp_path, 'fresh', STOPS), (begun, [sys.executable, '-c',
                                                    STOPS])]
  monkeypatch.setattr(suite, 'plan', lambda args: runs)
  status = suite.main(['--root', str(tmp_path), '--data_dir', 'x',
                       '--jobs', '1', '--stop_after', '1',
                       '--min_start_s', '0.5'])
  assert status == suite.EXIT_UNFINISHED == 3
  out, err = capsys.readouterr()
  # The run already begun goes first; the other has no time left.
  assert f'deadline: SIGTERM to {begun}' in out
  assert 'No finished run yet: no results table.' in out
  assert err.splitlines()[-1] == (
      f"Unfinished (2; re-run the same command to resume them): "
      f"['{begun}', '{runs[0][0]}']")


def test_suite_skips_held_runs_and_counts_them(tmp_path, monkeypatch,
                                              capsys):
  held = str(tmp_path / 'held')
  os.makedirs(held)
  with open(os.path.join(held, suite.HELD_FILE), 'w') as f:
    f.write('{}')
  runs = [(held, [sys.executable, '-c', FAILS]), _stub(tmp_path, 'a', OK),
          _stub(tmp_path, 'b', OK)]
  monkeypatch.setattr(suite, 'plan', lambda args: runs)
  status = suite.main(['--root', str(tmp_path), '--data_dir', 'x',
                       '--jobs', '2', '--stop_after', '30',
                       '--min_start_s', '0'])
  assert status == suite.EXIT_UNFINISHED
  out, err = capsys.readouterr()
  said = out.splitlines()
  assert said[:2] == [
      f'held elsewhere: {held} (carry_held.json; launch/carry.py)',
      '1 held run(s) take 1 of --jobs 2: 1 side by side']
  # One run at a time: `b` starts once `a` has finished.
  assert [l.split('] ', 1)[1].split(' (')[0].split(' in ')[0]
          for l in said[2:6]] == [
              f'start {runs[1][0]}', f'finished {runs[1][0]}',
              f'start {runs[2][0]}', f'finished {runs[2][0]}']
  assert err.splitlines()[-1] == (
      f"Unfinished (1; re-run the same command to resume them): ['{held}']")


def test_held_file_is_the_one_carry_writes():
  spec = importlib.util.spec_from_file_location(
      'launch_carry', os.path.join(LAUNCH, 'carry.py'))
  carry = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(carry)
  assert carry.HELD_FILE == suite.HELD_FILE


def test_suite_sigterm_moves_the_deadline(tmp_path):
  code = (f'import importlib.util, sys\n'
          f'spec = importlib.util.spec_from_file_location("s", '
          f'{os.path.join(LAUNCH, "suite.py")!r})\n'
          f's = importlib.util.module_from_spec(spec)\n'
          f'sys.modules["s"] = s\n'
          f'spec.loader.exec_module(s)\n'
          f'o = s.execute([({str(tmp_path / "r")!r}, [sys.executable, "-c", '
          f'{STOPS!r}])], jobs=2, poll_s=0.02)\n'
          f'print("stopped", o.stopped == [{str(tmp_path / "r")!r}])\n')
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=helpers.ROOT,
                          stdout=subprocess.PIPE, text=True)
  first = proc.stdout.readline()
  assert ' start ' in first
  log = tmp_path / 'r' / 'run.log'
  for _ in range(200):  # The run is up once it has written its line.
    if 'training' in log.read_text():
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  rest = proc.communicate(timeout=60)[0]
  assert proc.returncode == 0
  assert 'deadline: SIGTERM to' in rest and 'stopped True' in rest


# ------------------------------------------------------ launch/gpu_stretch.sh

STRETCH_VARS = ('BUDGET_S', 'RESERVE_S', 'STOP_GRACE_S', 'JOBS', 'RUNS',
                'CARRY', 'DATA', 'PART_MIB', 'CARRY_MAX_MIB', 'WHEELS', 'SITE',
                'INSTALL_WHEELS', 'PYTHON', 'PYTHONPATH')


def stretch(*args, **env):
  clean = {k: v for k, v in os.environ.items() if k not in STRETCH_VARS}
  clean.update(env)
  return subprocess.run(['bash', os.path.join(LAUNCH, 'gpu_stretch.sh'),
                         *args], cwd='/', env=clean, capture_output=True,
                        text=True, timeout=60)


def test_gpu_stretch_syntax_and_usage():
  syntax = subprocess.run(['bash', '-n', os.path.join(LAUNCH,
                                                      'gpu_stretch.sh')],
                          capture_output=True, text=True)
  assert syntax.returncode == 0, syntax.stderr
  proc = stretch('--help')
  assert proc.returncode == 0
  assert 'Usage: launch/gpu_stretch.sh' in proc.stdout
  assert 'launch/suite.py' in proc.stdout and '--dry_run' in proc.stdout
  assert 'carry.py unpack OUT_DIR' in proc.stdout


def test_gpu_stretch_dry_run(tmp_path):
  wheels = tmp_path / 'wheels'
  wheels.mkdir()
  (wheels / 'a-1-py3-none-any.whl').write_text('')
  carried = tmp_path / 'carry'
  carried.mkdir()
  (carried / 'carry.json').write_text('{}')
  out = str(tmp_path / 'out')
  flags = ['--protocol', 'cst', '--tasks', 'listops', '--mechanisms',
           'cst,transformer', '--lr_bracket', '1,2', '--seeds', '0']
  proc = stretch('--dry_run', out, '--', *flags, INSTALL_WHEELS='yes',
                 WHEELS=str(wheels), SITE='/site', CARRY=str(carried),
                 DATA='/scratch/data', BUDGET_S='500')
  got = lines(proc)
  path = f'PYTHONPATH=/site:{helpers.ROOT}'
  assert got == [
      ['mkdir', '-p', out],
      ['python3', '-m', 'pip', 'install', '-q', '--no-index', '--no-deps',
       '--no-compile', '--no-cache-dir', '--upgrade', '--target', '/site',
       str(wheels / 'a-1-py3-none-any.whl')],
      ['env', path, 'PYTHONUNBUFFERED=1', 'python3', '-m',
       'lra_msmra.data.prepare', '--generate_listops', '--out',
       '/scratch/data'],
      ['python3', 'launch/carry.py', 'unpack', str(carried), 'runs/stretch',
       '--held_stubs'],
      ['env', path, 'PYTHONUNBUFFERED=1', 'XLA_PYTHON_CLIENT_PREALLOCATE=false',
       'timeout', '--kill-after=5', '475', 'python3', 'launch/suite.py',
       '--root', 'runs/stretch', '--jobs', '2', '--stop_after', '425',
       '--stop_grace_s', '30', '--data_dir', '/scratch/data', *flags],
      ['python3', 'launch/carry.py', 'pack', 'runs/stretch', out,
       '--part_mib', '15', '--max_files', '7']]
  # Data given, nothing carried, wheels there: no pip, no generation.
  got = lines(stretch('--dry_run', out, '--', '--tasks=listops,text',
                      '--data_dir=/d', INSTALL_WHEELS='no', JOBS='3',
                      CARRY=str(tmp_path / 'none'), RUNS='r'))
  assert [g[:2] for g in got] == [['mkdir', '-p'], ['env', 'PYTHONPATH=' +
                                                    helpers.ROOT],
                                  ['python3', 'launch/carry.py']]
  assert got[1][-4:] == ['--stop_grace_s', '30', '--tasks=listops,text',
                         '--data_dir=/d']
  assert got[1][got[1].index('--jobs') + 1] == '3'
  assert got[1][got[1].index('--stop_after') + 1] == '465'


def test_gpu_stretch_generates_pathfinder(tmp_path):
  flags = ['--protocol', 'xiong', '--tasks', 'pathfinder', '--mechanisms',
           'cst', '--override', 'data.difficulty=easy']
  got = lines(stretch('--dry_run', str(tmp_path / 'o'), '--', *flags,
                      INSTALL_WHEELS='no', CARRY=str(tmp_path / 'none')))
  prepare = got[1]
  assert prepare[prepare.index('-m'):prepare.index('--workers')] == [
      '-m', 'lra_msmra.data.prepare', '--generate_pathfinder',
      '--pathfinder_sets', '32/easy']
  assert prepare[-2:] == ['--out', 'runs/pathfinder_data']
  assert got[2][got[2].index('--data_dir') + 1] == 'runs/pathfinder_data'


@pytest.mark.parametrize('args,env,message', [
    ([], {}, 'give OUT_DIR'),
    (['o'], {'BUDGET_S': '9m'}, 'BUDGET_S=9m'),
    (['o'], {'BUDGET_S': '60', 'RESERVE_S': '75'}, 'must exceed'),
    (['o', '--', '--tasks', 'listops,image'], {}, 'give --data_dir'),
    (['o', '--'], {}, 'give --data_dir'),
    (['o', '--', '--tasks', 'pathfinder', '--override',
      'data.difficulty=medium'], {}, 'data.difficulty=medium'),
    (['o', '--', '--tasks', 'listops', '--jobs', '3'], {},
     '--jobs is set by this script'),
    (['o', '--', '--tasks', 'listops', '--stop_after=9'], {},
     '--stop_after is set by this script'),
], ids=['no_out', 'budget', 'reserve', 'other_task', 'default_tasks',
        'difficulty', 'jobs', 'stop_after'])
def test_gpu_stretch_errors(args, env, message):
  proc = stretch('--dry_run', *args, INSTALL_WHEELS='no', **env)
  assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_suite_spt_plan_pretrains_then_fine_tunes(tmp_path):
  out = subprocess.run(
      [sys.executable, os.path.join(LAUNCH, 'suite.py'), '--spt', '--options',
       'runlocal', '--tasks', 'listops', '--mechanisms', 'cst', '--seeds',
       '0', '--root', str(tmp_path), '--dry_run', '--pretrain_override',
       'num_train_steps=10'], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  pre, fine = [shlex.split(l) for l in out.stdout.splitlines()
               if 'lra_msmra.main' in l]
  job = str(tmp_path / 'lra' / 'listops' / 'cst_spt' / 'seed0')
  assert pre[pre.index('--config') + 1] == f'{CONFIG}:runlocal,spt'
  assert pre[pre.index('--workdir') + 1] == os.path.join(job, 'pretrain')
  assert pre[-1] == '--config.num_train_steps=10'
  assert fine[fine.index('--config') + 1] == f'{CONFIG}:runlocal'
  assert fine[fine.index('--workdir') + 1] == job
  assert fine[-1] == f'--config.init_from={os.path.join(job, "pretrain")}'
  assert not any('num_train_steps=10' in a for a in fine)


def test_suite_fine_tuning_waits_for_its_pretraining(tmp_path, capsys):
  pre = str(tmp_path / 'pre')
  writes = ('import os, time; time.sleep(0.5); '
            f'open(os.path.join({pre!r}, "results.json"), "w").write("{{}}")')
  os.makedirs(pre)
  fine = (str(tmp_path / 'fine'), [
      sys.executable, '-c', 'import os, sys; sys.exit(0 if os.path.exists('
      f'os.path.join({pre!r}, "results.json")) else 1)',
      f'--config.init_from={pre}'])
  other = _stub(tmp_path, 'other', OK)
  outcome = suite.execute([(pre, [sys.executable, '-c', writes]), fine,
                           other], jobs=2, poll_s=0.02)
  assert sorted(outcome.finished) == sorted([pre, fine[0], other[0]])
  said = capsys.readouterr().out
  # `other` started beside the pretraining, before the fine-tuning, which
  # waited for the pretraining's results.json (it exits 1 without).
  assert said.index(f'start {other[0]}') < said.index(f'start {fine[0]}')


def test_suite_fine_tuning_of_a_failed_pretraining_never_starts(tmp_path):
  pre = _stub(tmp_path, 'pre', FAILS)
  fine = (str(tmp_path / 'fine'), [sys.executable, '-c', OK,
                                   f'--config.init_from={pre[0]}'])
  outcome = suite.execute([pre, fine], jobs=2, poll_s=0.02)
  assert outcome.failed == [pre[0], fine[0]] and not outcome.finished
