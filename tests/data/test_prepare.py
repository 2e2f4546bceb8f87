"""The data-preparation command on fixture releases in both layouts."""

import json
import os
import tarfile

import numpy as np
import pytest

from lra_msmra.data import listops
from lra_msmra.data import pathfinder
from lra_msmra.data import png
from lra_msmra.data import prepare
from lra_msmra.data import retrieval
from tests.data.helpers import needs_tfds_extra
from tests.data.helpers import task_config
from tests.data.helpers import write_release


def _task_folders(root, *, pathfinder128_seed=0):
  """listops-1000, tsv_data, pathfinder32 and pathfinder128 under root."""
  os.makedirs(os.path.join(root, 'listops-1000'))
  for split, n in (('train', 5), ('val', 2), ('test', 3)):
    listops.write_tsv(os.path.join(root, 'listops-1000', f'basic_{split}.tsv'),
                      [('( [MAX 2 9 ] )', 9)] * n)
  tsv = os.path.join(root, 'tsv_data')
  os.makedirs(tsv)
  for split, n in (('train', 4), ('eval', 2), ('test', 2)):
    retrieval.write_tsv(retrieval.split_path(tsv, split),
                        [(1, 'a', 'b', 'text one', 'text two')] * n)
  for difficulty in pathfinder.DIFFICULTIES:
    write_release(root, resolution=32, difficulty=difficulty, num=20)
    write_release(root, resolution=128, difficulty=difficulty, num=10,
                  empty=(), seed=pathfinder128_seed)


def nested_release(base):
  """The nested layout: inner lra_release plus top-level extra copies."""
  outer = os.path.join(base, 'lra_release')
  _task_folders(os.path.join(outer, 'lra_release'))
  _task_folders(os.path.join(base, 'extra'), pathfinder128_seed=1)
  for name in ('listops-1000', 'pathfinder128'):
    os.rename(os.path.join(base, 'extra', name), os.path.join(outer, name))
  return outer


def flat_release(base):
  root = os.path.join(base, 'lra_release')
  _task_folders(root)
  return root


def _archive(folder, path):
  with tarfile.open(path, 'w:gz') as tar:
    tar.add(folder, arcname='lra_release')
  return path


def _run(capsys, *args):
  code = prepare.main(list(args))
  out = capsys.readouterr()
  return code, out.out, out.err


def _check_prepared(out):
  for name in ('listops-1000', 'tsv_data', 'pathfinder32', 'pathfinder128'):
    assert os.path.islink(os.path.join(out, name))
  with open(os.path.join(out, prepare.MANIFEST)) as f:
    manifest = json.load(f)
  folders = manifest['release']['folders']
  assert folders['listops-1000']['examples'] == {'train': 5, 'val': 2,
                                                 'test': 3}
  assert folders['tsv_data']['examples'] == {'train': 4, 'eval': 2,
                                             'test': 2}
  hard = folders['pathfinder32']['examples']['hard']
  assert sum(s['images'] + s['empty_pngs'] for s in hard.values()) == 20
  assert sum(s['empty_pngs'] for s in hard.values()) == 1
  # The pipelines read the prepared folder.
  data = retrieval.get_datasets(task_config('retrieval', data_dir=out), out)
  assert (len(data.train), len(data.eval), len(data.test)) == (4, 2, 2)
  data = pathfinder.get_datasets(task_config('pathfinder', None,
                                             data_dir=out), out)
  assert len(data.train) + len(data.eval) + len(data.test) == 19
  ids, _ = listops.read_tsv(os.path.join(out, 'listops-1000',
                                         'basic_val.tsv'))
  assert len(ids) == 2
  return manifest


def test_nested_archive(tmp_path, capsys):
  archive = _archive(nested_release(str(tmp_path / 'src')),
                     str(tmp_path / 'lra_release.gz'))
  out = str(tmp_path / 'out')
  code, stdout, _ = _run(capsys, '--lra_release', archive, '--out', out)
  assert code == 0
  manifest = _check_prepared(out)
  # The inner copies are used; the extra pathfinder128 differs (P20).
  inner = os.path.join(out, 'release', 'lra_release', 'lra_release')
  assert os.path.realpath(os.path.join(out, 'pathfinder128')) == (
      os.path.realpath(os.path.join(inner, 'pathfinder128')))
  dup = manifest['release']['duplicates']
  assert set(dup) == {'listops-1000', 'pathfinder128'}
  assert dup['listops-1000'][0]['identical']
  assert not dup['pathfinder128'][0]['identical']
  assert dup['pathfinder128'][0]['content_differs'] > 0
  assert 'pathfinder128: a second copy exists' in stdout
  assert 'hard: train 16 (+0 empty PNG)' in stdout
  assert '  train: 5' in stdout and '--config.data_dir=' in stdout


def test_flat_archive(tmp_path, capsys):
  archive = _archive(flat_release(str(tmp_path / 'src')),
                     str(tmp_path / 'lra_release.gz'))
  out = str(tmp_path / 'out')
  code, _, _ = _run(capsys, '--lra_release', archive, '--out', out)
  assert code == 0
  assert _check_prepared(out)['release']['duplicates'] == {}
  assert os.path.realpath(os.path.join(out, 'tsv_data')) == os.path.realpath(
      os.path.join(out, 'release', 'lra_release', 'tsv_data'))


def test_flat_folder_and_extra_copy_choice(tmp_path, capsys):
  root = flat_release(str(tmp_path / 'src'))
  out = str(tmp_path / 'out')
  code, _, _ = _run(capsys, '--lra_release', root, '--out', out)
  assert code == 0
  manifest = _check_prepared(out)
  assert manifest['release']['duplicates'] == {}
  assert os.path.realpath(os.path.join(out, 'tsv_data')) == os.path.realpath(
      os.path.join(root, 'tsv_data'))
  code, _, err = _run(capsys, '--lra_release', root, '--out', out,
                      '--pathfinder128_copy', 'extra')
  assert code == 1 and 'only one pathfinder128 folder' in err


def test_nested_folder_extra_pathfinder128(tmp_path, capsys):
  outer = nested_release(str(tmp_path / 'src'))
  out = str(tmp_path / 'out')
  code, _, _ = _run(capsys, '--lra_release', outer, '--out', out,
                    '--pathfinder128_copy', 'extra')
  assert code == 0
  assert os.path.realpath(os.path.join(out, 'pathfinder128')) == (
      os.path.realpath(os.path.join(outer, 'pathfinder128')))


def test_missing_parts_are_named(tmp_path, capsys):
  root = flat_release(str(tmp_path / 'src'))
  os.remove(retrieval.split_path(os.path.join(root, 'tsv_data'), 'eval'))
  hard = pathfinder.folder_path(root, 32, 'hard')
  os.rename(os.path.join(hard, 'metadata'), os.path.join(hard, 'meta'))
  out = str(tmp_path / 'out')
  code, _, err = _run(capsys, '--lra_release', root, '--out', out)
  assert code == 1
  assert 'tsv_data/new_aan_pairs.eval.tsv' in err
  assert 'pathfinder32/curv_contour_length_14/metadata/' in err
  assert 'pathfinder128' not in err
  # Limiting --tasks accepts the rest (incomplete folders are not linked).
  code, stdout, _ = _run(capsys, '--lra_release', root, '--out', out,
                         '--tasks', 'listops,pathx')
  assert code == 0 and 'tsv_data: incomplete' in stdout
  assert not os.path.exists(os.path.join(out, 'tsv_data'))


def test_bad_inputs(tmp_path, capsys):
  bad = tmp_path / 'lra_release.gz'
  bad.write_bytes(b'not a tarball')
  code, _, err = _run(capsys, '--lra_release', str(bad), '--out',
                      str(tmp_path / 'o'))
  assert code == 1 and 'not a readable tar archive' in err
  code, _, err = _run(capsys, '--lra_release', str(tmp_path / 'nope'),
                      '--out', str(tmp_path / 'o'))
  assert code == 1 and 'does not exist' in err
  code, _, err = _run(capsys, '--lra_release', str(tmp_path), '--out',
                      str(tmp_path / 'o'))
  assert code == 1 and 'listops-1000/' in err
  with pytest.raises(SystemExit):
    prepare.main(['--out', str(tmp_path / 'o')])


@needs_tfds_extra
def test_tfds_download_step_under_mock(tmp_path, capsys):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE):
    code, stdout, _ = _run(capsys, '--tfds', '--out', str(tmp_path))
  assert code == 0
  with open(tmp_path / prepare.MANIFEST) as f:
    assert set(json.load(f)['tfds']) == {'imdb_reviews', 'cifar10'}
  # The hint names what was prepared: no ListOps folder here.
  assert 'ListOps' not in stdout
  assert stdout.rstrip().endswith(
      f'--config.data_dir={tmp_path} with the configs in configs/text/, '
      'configs/image/.')


def test_rerun_with_out_inside_the_release(tmp_path, capsys):
  root = flat_release(str(tmp_path / 'src'))
  out = os.path.join(root, 'prepared')
  for _ in range(2):  # Idempotent; its own links are not taken as copies.
    code, _, _ = _run(capsys, '--lra_release', root, '--out', out)
    assert code == 0
  with open(os.path.join(out, prepare.MANIFEST)) as f:
    assert json.load(f)['release']['duplicates'] == {}


def test_generate_listops_writes_a_stamped_folder(tmp_path, capsys,
                                                  monkeypatch):
  small = dict(num_train=12, num_valid=4, num_test=4, min_length=5,
               max_length=40, max_depth=4, max_args=4)
  real = listops.generate_dataset
  monkeypatch.setattr(listops, 'generate_dataset',
                      lambda folder, seed: real(folder, seed=seed, **small))
  out = str(tmp_path / 'out')
  assert prepare.main(['--generate_listops', '--listops_seed', '3',
                       '--out', out]) == 0
  printed = capsys.readouterr().out
  assert 'listops-1000: generated (seed 3)' in printed
  assert printed.splitlines()[-1].endswith(
      f'(ListOps: --config.data_dir={out}/listops-1000) with the configs in '
      'configs/listops/.')
  manifest = json.load(open(os.path.join(out, 'prepared.json')))
  assert manifest['listops_generated']['settings']['seed'] == 3
  config = task_config('listops', data_dir=out)
  config.data.max_length = 64
  data = listops.get_datasets(config, out)
  assert data.notes['data_source'] == 'generated'
  assert (len(data.train), len(data.eval), len(data.test)) == (12, 4, 4)
  # A folder of release files is never overwritten by generated ones.
  release = str(tmp_path / 'rel')
  _task_folders(release)
  assert prepare.main(['--generate_listops', '--out', release]) == 1
  assert 'already holds release data' in capsys.readouterr().err


def test_the_closing_hint_names_the_tasks_prepared(capsys):
  stamp = {'spec': {'seed': 0, 'num_examples': 4},
           'details': {'labels': {'0': 2, '1': 2}, 'generation_seconds': 1.0,
                       'workers': 1}}
  report = {'pathfinder_generated': {'pathfinder32/curv_baseline': stamp,
                                     'pathfinder128/curv_contour_length_14':
                                     stamp}}
  prepare._print_report(report, '/data/out')  # pylint: disable=protected-access
  last = capsys.readouterr().out.splitlines()[-1]
  assert last == ('Wrote /data/out/prepared.json. Use '
                  '--config.data_dir=/data/out with the configs in '
                  'configs/pathfinder/, configs/pathx/.')
  tasks = prepare.prepared_tasks(
      {'tfds': {'imdb_reviews': {}, 'cifar10': {}},
       'release': {'folders': {'tsv_data': {'complete': True},
                               'pathfinder32': {'complete': False}}}})
  assert tasks == ['text', 'retrieval', 'image']
  prepare._print_report({}, '/data/out')  # pylint: disable=protected-access
  assert "no task's data is complete" in capsys.readouterr().out


def test_undecodable_pngs_are_named(tmp_path, capsys, monkeypatch):
  root = flat_release(str(tmp_path / 'src'))
  hard = pathfinder.folder_path(root, 32, 'hard')
  truncated = os.path.join(hard, 'imgs', '0', 'sample_0.png')
  with open(truncated, 'r+b') as f:
    f.truncate(40)
  wrong_size = os.path.join(hard, 'imgs', '1', 'sample_9.png')
  png.write(wrong_size, np.zeros((16, 16), np.uint8))
  out = str(tmp_path / 'out')
  code, _, err = _run(capsys, '--lra_release', root, '--out', out)
  assert code == 1
  assert '2 image(s)' in err
  assert f'{truncated}: cannot decode the PNG' in err
  assert f'{wrong_size}: expected a 32x32 single-channel image' in err
  assert not os.path.exists(os.path.join(out, prepare.MANIFEST))
  # Many bad files: the first ones are named, the rest counted.
  monkeypatch.setattr(prepare, 'MAX_LISTED', 1)
  code, _, err = _run(capsys, '--lra_release', root, '--out', out)
  assert code == 1 and '... and 1 more' in err
