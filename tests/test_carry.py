"""launch/carry.py: packing runs into parts, checking and merging them back.

On a fake tree of workdirs in the trainer's layout (orbax step folders,
tensorboard/, lock, generated data/); no training.
"""

import hashlib
import importlib.util
import io
import json
import os
import random
import subprocess
import sys
import tarfile

import pytest

from tests import helpers

SCRIPT = os.path.join(helpers.ROOT, 'launch', 'carry.py')
_spec = importlib.util.spec_from_file_location('carry', SCRIPT)
carry = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(carry)

KIB = 1024


def _write(path, data=b'x'):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(data if isinstance(data, bytes) else data.encode())


def _step(folder, step, size, finished=True):
  """An orbax step folder with `size` incompressible (seeded) bytes."""
  base = os.path.join(folder, str(step))
  if finished:
    _write(os.path.join(base, '_CHECKPOINT_METADATA'), '{}')
  _write(os.path.join(base, 'meta', 'metadata'), f'{{"step": {step}}}')
  _write(os.path.join(base, 'state', 'ocdbt.process_0', 'd', 'abc'),
         random.Random(f'{folder}/{step}').randbytes(size))
  _write(os.path.join(base, 'state', 'manifest.ocdbt'), 'm')


def fake_run(root, run, steps, state_kib=64, finished=False, total=1000):
  workdir = os.path.join(root, run)
  _write(os.path.join(workdir, 'config.json'),
         json.dumps({'num_train_steps': total}))
  _write(os.path.join(workdir, 'model_spec.json'), '{}')
  _write(os.path.join(workdir, 'lock'), 'pid')
  _write(os.path.join(workdir, 'run.log'), 'log\n')
  _write(os.path.join(workdir, 'tensorboard', 'metrics.jsonl'), '{}\n')
  _write(os.path.join(workdir, 'tensorboard', 'events.out.tfevents.1.vm'),
         'e')
  _write(os.path.join(workdir, 'data', 'listops', 'basic_train.tsv'),
         'generated')
  for step in steps:
    _step(os.path.join(workdir, 'checkpoints'), step, state_kib * KIB)
  _step(os.path.join(workdir, 'best'), steps[-1], state_kib * KIB // 3)
  # An orbax save that did not finish.
  _write(os.path.join(workdir, 'checkpoints',
                      f'{steps[-1] + 1}.orbax-checkpoint-tmp-9', 'x'), 'x')
  if finished:
    _write(os.path.join(workdir, 'results.json'), '{"test": 1}')
  return workdir


def _files(root):
  out = set()
  for here, _, files in os.walk(root):
    for name in files:
      out.add(os.path.relpath(os.path.join(here, name), root))
  return out


@pytest.fixture
def tree(tmp_path):
  root = str(tmp_path / 'runs')
  fake_run(root, 'cst/listops/cst/seed0', [200, 400], state_kib=256)
  fake_run(root, 'cst/listops/cst_lr2x/seed0', [100], state_kib=256)
  fake_run(root, 'cst/listops/transformer/seed0', [900, 1000],
           state_kib=256, finished=True)
  _write(os.path.join(root, 'cst', 'summary', 'results.md'), 'table')
  return root


def test_round_trip_keeps_what_resumes(tree, tmp_path, capsys):
  out = str(tmp_path / 'out')
  manifest = carry.pack(tree, out, part_mib=0.1)
  parts = sorted(n for n in os.listdir(out) if n != carry.MANIFEST)
  assert parts == [p['file'] for p in manifest['parts']]
  assert len(parts) == -(-manifest['bytes'] // int(0.1 * carry.MIB)) > 3
  sizes = [os.path.getsize(os.path.join(out, p)) for p in parts]
  assert all(s == int(0.1 * carry.MIB) for s in sizes[:-1])
  assert 0 < sizes[-1] <= int(0.1 * carry.MIB)
  assert sum(sizes) == manifest['bytes']
  runs = {r['run']: r for r in manifest['runs']}
  assert runs['cst/listops/cst/seed0'] == dict(
      runs['cst/listops/cst/seed0'], step=400, finished=False,
      num_train_steps=1000, checkpoints='checkpoints/400', best='best/400')
  assert runs['cst/listops/cst_lr2x/seed0']['step'] == 100
  assert runs['cst/listops/transformer/seed0']['finished']
  assert manifest['held'] == []

  fresh = str(tmp_path / 'fresh')
  carry.unpack(out, fresh)
  said = capsys.readouterr().out
  assert 'restored cst/listops/cst/seed0: step 400 of 1000' in said
  assert 'restored cst/listops/transformer/seed0: finished' in said
  got = _files(fresh)
  run = 'cst/listops/cst/seed0/'
  for name in ('config.json', 'model_spec.json', 'run.log',
               'tensorboard/metrics.jsonl',
               'tensorboard/events.out.tfevents.1.vm',
               'checkpoints/400/_CHECKPOINT_METADATA',
               'checkpoints/400/state/ocdbt.process_0/d/abc',
               'best/400/state/manifest.ocdbt'):
    assert run + name in got
  # Only the newest finished step; no lock, no generated data, no summary.
  assert not any(f.startswith(run + 'checkpoints/200') for f in got)
  assert not any('orbax-checkpoint-tmp' in f or f.endswith('/lock') or
                 '/data/' in f or 'summary' in f for f in got)
  # A finished run: its results and records, no checkpoints.
  done = 'cst/listops/transformer/seed0/'
  assert done + 'results.json' in got
  assert not any(f.startswith((done + 'checkpoints', done + 'best'))
                 for f in got)
  with open(os.path.join(fresh, run, 'checkpoints', '400', 'state',
                         'ocdbt.process_0', 'd', 'abc'), 'rb') as a, open(
      os.path.join(tree, run, 'checkpoints', '400', 'state',
                   'ocdbt.process_0', 'd', 'abc'), 'rb') as b:
    assert a.read() == b.read()
  assert not [n for n in os.listdir(fresh) if n.startswith('.carry')]


def test_finished_checkpoints_on_request(tree, tmp_path):
  manifest = carry.pack(tree, str(tmp_path / 'out'),
                        finished_checkpoints=True)
  done = [r for r in manifest['runs'] if r['finished']][0]
  assert done['checkpoints'] == 'checkpoints/1000'


def test_newest_unfinished_step_is_skipped(tmp_path):
  root = str(tmp_path / 'r')
  workdir = fake_run(root, 'a/seed0', [100])
  _step(os.path.join(workdir, 'checkpoints'), 300, 10, finished=False)
  assert carry.newest_step(os.path.join(workdir, 'checkpoints')) == 100


def test_merge_keeps_newer_local_state(tree, tmp_path, capsys):
  out = str(tmp_path / 'out')
  carry.pack(tree, out)
  local = str(tmp_path / 'local')
  # Here: seed0 is further on, cst_lr2x behind, transformer unfinished.
  fake_run(local, 'cst/listops/cst/seed0', [600], state_kib=1)
  fake_run(local, 'cst/listops/cst_lr2x/seed0', [20, 40], state_kib=1)
  fake_run(local, 'cst/listops/transformer/seed0', [500], state_kib=1)
  carry.unpack(out, local)
  said = capsys.readouterr().out
  assert 'kept cst/listops/cst/seed0: step 600 here' in said
  assert 'restored cst/listops/cst_lr2x/seed0: step 100 of 1000' in said
  assert carry.steps_in(os.path.join(
      local, 'cst/listops/cst_lr2x/seed0/checkpoints')) == [100]
  assert carry.steps_in(os.path.join(
      local, 'cst/listops/cst/seed0/checkpoints')) == [600]
  assert os.path.exists(os.path.join(
      local, 'cst/listops/transformer/seed0/results.json'))


def test_missing_part_refused(tree, tmp_path):
  out = str(tmp_path / 'out')
  carry.pack(tree, out, part_mib=0.1)
  os.remove(os.path.join(out, 'carry.tar.gz.002'))
  fresh = str(tmp_path / 'fresh')
  proc = subprocess.run([sys.executable, SCRIPT, 'unpack', out, fresh],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and proc.stdout == ''
  assert proc.stderr.splitlines() == [
      f'carry: part carry.tar.gz.002 (3 of '
      f'{len(json.load(open(os.path.join(out, carry.MANIFEST)))["parts"])} '
      f'in carry.json) is missing from {out}: bring back every part']
  assert not os.path.exists(fresh)


def test_damaged_part_refused(tree, tmp_path):
  out = str(tmp_path / 'out')
  carry.pack(tree, out, part_mib=0.1)
  path = os.path.join(out, 'carry.tar.gz.001')
  with open(path, 'r+b') as f:
    f.seek(100)
    byte = f.read(1)
    f.seek(100)
    f.write(bytes([byte[0] ^ 1]))
  with pytest.raises(carry.CarryError,
                     match=r'sha256 .* \(damaged: carry.tar.gz.001\)'):
    carry.unpack(out, str(tmp_path / 'fresh'))
  with open(path, 'ab') as f:
    f.write(b'more')
  with pytest.raises(carry.CarryError, match='an incomplete copy'):
    carry.unpack(out, str(tmp_path / 'fresh'))
  assert not os.path.exists(str(tmp_path / 'fresh'))
  with pytest.raises(carry.CarryError, match='no carry.json'):
    carry.unpack(str(tmp_path), str(tmp_path / 'fresh'))


def _hand_made(out, members, runs=('a/seed0',)):
  """A carry folder whose archive holds `members` (TarInfo, data)."""
  os.makedirs(out, exist_ok=True)
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    for info, data in members:
      tar.addfile(info, io.BytesIO(data) if data is not None else None)
  blob = buf.getvalue()
  with open(os.path.join(out, 'carry.tar.gz.000'), 'wb') as f:
    f.write(blob)
  sha = hashlib.sha256(blob).hexdigest()
  with open(os.path.join(out, carry.MANIFEST), 'w') as f:
    json.dump({'format': 1, 'archive': 'carry.tar.gz', 'bytes': len(blob),
               'sha256': sha, 'part_bytes': len(blob),
               'parts': [{'file': 'carry.tar.gz.000', 'bytes': len(blob),
                          'sha256': sha}],
               'runs': [{'run': r, 'step': 1, 'finished': False}
                        for r in runs], 'left_out': []}, f)


def _file(name, data=b'x'):
  info = tarfile.TarInfo(name)
  info.size = len(data)
  return info, data


def _link(name, target):
  info = tarfile.TarInfo(name)
  info.type = tarfile.SYMTYPE
  info.linkname = target
  return info, None


@pytest.mark.parametrize('member', [
    _file('/etc/evil'), _file('a/seed0/../../evil'), _file('../evil'),
    _link('a/seed0/config.json', '/etc/passwd'), _file('b/seed0/x'),
], ids=['absolute', 'dotdot_inside', 'dotdot', 'symlink', 'unlisted_run'])
def test_unsafe_members_refused(tmp_path, member):
  out = str(tmp_path / 'in')
  _hand_made(out, [_file('a/seed0/config.json', b'{}'), member])
  root = str(tmp_path / 'root')
  with pytest.raises(carry.CarryError, match='refusing member'):
    carry.unpack(out, root)
  assert not os.path.exists(root)
  assert not os.path.exists(str(tmp_path / 'evil'))


def test_unsafe_run_path_refused(tmp_path):
  out = str(tmp_path / 'in')
  _hand_made(out, [_file('a/seed0/config.json', b'{}')], runs=('../x',))
  with pytest.raises(carry.CarryError, match='unsafe run path'):
    carry.unpack(out, str(tmp_path / 'root'))


def test_limit_holds_back_the_least_advanced_run(tmp_path, capsys):
  root = str(tmp_path / 'runs')
  fake_run(root, 'p/a/seed0', [300], state_kib=300)
  fake_run(root, 'p/b/seed0', [100], state_kib=300)
  fake_run(root, 'p/c/seed0', [500], state_kib=10, finished=True)
  out = str(tmp_path / 'out')
  # About 0.4 MiB per unfinished run; files: parts of 0.25 MiB + manifest.
  manifest = carry.pack(root, out, part_mib=0.25, max_files=4)
  assert manifest['held'] == ['p/b/seed0']
  runs = {r['run']: r for r in manifest['runs']}
  assert runs['p/b/seed0']['held'] and runs['p/b/seed0']['step'] == 100
  assert 'over the limit of 0.8 MiB' in runs['p/b/seed0']['why']
  assert not runs['p/a/seed0'].get('held')
  assert 'HELD BACK p/b/seed0 (step 100' in capsys.readouterr().err
  assert len(os.listdir(out)) <= 4
  # On the machine that runs the suite: a stub, which it skips.
  machine = str(tmp_path / 'machine')
  carry.unpack(out, machine, held_stubs=True)
  assert 'held p/b/seed0: its state (step 100) stays where it was packed' in (
      capsys.readouterr().out)
  assert sorted(os.listdir(os.path.join(machine, 'p/b/seed0'))) == sorted([
      carry.CONFIG_FILE, carry.HELD_FILE])
  with open(os.path.join(machine, 'p/b/seed0', carry.HELD_FILE)) as f:
    assert json.load(f)['step'] == 100
  # Packed again there, the stub stays a stub.
  again = carry.pack(machine, str(tmp_path / 'again'))
  assert [r['run'] for r in again['runs'] if r.get('held')] == ['p/b/seed0']
  assert again['held'] == []
  # Back where the state is: kept as it is; where it is not: named.
  carry.unpack(str(tmp_path / 'again'), root)
  said = capsys.readouterr().out
  assert 'kept p/b/seed0: held back from the carry at step 100; step 100 ' \
      'here' in said
  assert not os.path.exists(os.path.join(root, 'p/b/seed0', carry.HELD_FILE))
  carry.unpack(out, str(tmp_path / 'elsewhere'))
  assert 'not carried p/b/seed0: held back at step 100' in (
      capsys.readouterr().out)
  assert not os.path.exists(str(tmp_path / 'elsewhere' / 'p' / 'b'))
  # The real state arriving replaces a stub.
  carry.pack(root, str(tmp_path / 'all'))
  carry.unpack(str(tmp_path / 'all'), machine, held_stubs=True)
  assert not os.path.exists(os.path.join(machine, 'p/b/seed0',
                                         carry.HELD_FILE))
  assert carry.steps_in(os.path.join(machine, 'p/b/seed0',
                                     'checkpoints')) == [100]
  # Finished runs alone over the limit: refused.
  with pytest.raises(carry.CarryError, match='every unfinished run held'):
    carry.pack(root, out, part_mib=0.001, max_files=2,
               finished_checkpoints=True)


def test_command_line(tree, tmp_path):
  out = str(tmp_path / 'out')
  proc = subprocess.run([sys.executable, SCRIPT, 'pack', tree, out,
                         '--part_mib', '0.5'],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[0].startswith('packed cst/listops/cst/seed0: step 400 of '
                             '1000, ')
  assert lines[-1].startswith('carry: 3 run(s) (2 unfinished) in ')
  fresh = str(tmp_path / 'fresh')
  proc = subprocess.run([sys.executable, SCRIPT, 'unpack', out, fresh],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  assert 'restored cst/listops/cst_lr2x/seed0: step 100 of 1000' in (
      proc.stdout)
  assert subprocess.run([sys.executable, SCRIPT, '--help'],
                        capture_output=True, timeout=60).returncode == 0


def test_a_pretraining_run_keeps_its_checkpoint_until_fine_tuned(tmp_path):
  root = str(tmp_path / 'runs')
  fake_run(root, 'lra/listops/cst_spt/seed0/pretrain', [500], finished=True)
  fine = fake_run(root, 'lra/listops/cst_spt/seed0', [100])
  assert carry.find_workdirs(root) == ['lra/listops/cst_spt/seed0',
                                       'lra/listops/cst_spt/seed0/pretrain']
  manifest = carry.pack(root, str(tmp_path / 'out'))
  runs = {r['run']: r for r in manifest['runs']}
  pre = runs['lra/listops/cst_spt/seed0/pretrain']
  assert pre['finished'] and pre['checkpoints'] == 'checkpoints/500'
  assert 'best' not in pre
  # Once the fine-tuning has finished, the pretraining's state goes.
  _write(os.path.join(fine, 'results.json'), '{}')
  manifest = carry.pack(root, str(tmp_path / 'out2'))
  runs = {r['run']: r for r in manifest['runs']}
  assert 'checkpoints' not in runs['lra/listops/cst_spt/seed0/pretrain']
