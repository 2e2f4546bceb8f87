"""Generated Text and Image examples without TFDS, the same as through
`tfds.load`; one clear line wherever the optional TensorFlow and TFDS
packages are needed and missing."""

import os
import sys

import numpy as np
import pytest

from lra_msmra import errors
from lra_msmra.data import image
from lra_msmra.data import prepare
from lra_msmra.data import text
from lra_msmra.data import tfds_io
from tests.data.helpers import needs_tfds_extra
from tests.data.helpers import task_config
from tests.data.helpers import tfds_mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
INSTALL = 'pip install -e .[tfds]'


def _examples(num_train, num_test):
  rng = np.random.default_rng(num_train)
  return {split: {
      'text': np.array([f'{split} {i} é'.encode() for i in range(n)],
                       dtype=object),
      'image': rng.integers(0, 256, (n, 4, 4, 3)).astype(np.uint8),
      'label': rng.integers(0, 10, n).astype(np.int64)}
          for split, n in (('train', num_train), ('test', num_test))}


def test_from_examples_slices_in_stored_order():
  examples = _examples(25, 4)
  out = tfds_io.from_examples(
      examples, ['train[:90%]', 'train[90%:]', 'test', 'test+train[:2]'],
      ['text', 'label'])
  assert set(out) == {'train[:90%]', 'train[90%:]', 'test', 'test+train[:2]'}
  train, test = examples['train'], examples['test']
  # 22.5 rounds to 22 (TFDS's 'closest', halves to even).
  np.testing.assert_array_equal(out['train[:90%]']['label'],
                                train['label'][:22])
  assert out['train[90%:]']['text'].tolist() == train['text'][22:].tolist()
  assert out['test+train[:2]']['text'].tolist() == (
      test['text'].tolist() + train['text'][:2].tolist())
  for split in out.values():
    assert set(split) == {'text', 'label'}
    assert split['text'].dtype == object and split['label'].dtype == np.int64
  images = tfds_io.from_examples(examples, ['train[90%:]'], ['image'])
  assert images['train[90%:]']['image'].shape == (3, 4, 4, 3)
  assert images['train[90%:]']['image'].dtype == np.uint8
  with pytest.raises(ValueError, match="Unknown split 'validation'"):
    tfds_io.from_examples(examples, ['validation'], ['label'])


@pytest.mark.parametrize('num_train,num_test', [(1, 1), (9, 3), (25, 7),
                                                (101, 2)])
@needs_tfds_extra
def test_from_examples_equals_tfds_load(num_train, num_test):
  examples = _examples(num_train, num_test)
  specs = ['train', 'test', *image.SPLITS.values(), 'test+train[-1:]']
  expected = {}
  with tfds_mock({s: {'text': f['text'], 'label': f['label']}
                  for s, f in examples.items()}):
    expected['imdb_reviews'] = tfds_io.load(text.TFDS_NAME, specs, None,
                                            ('text', 'label'))
  with tfds_mock({s: {'image': f['image'], 'label': f['label']}
                  for s, f in examples.items()}):
    expected['cifar10'] = tfds_io.load(image.TFDS_NAME, specs, None,
                                       ('image', 'label'))
  for name, fields in (('imdb_reviews', ('text', 'label')),
                       ('cifar10', ('image', 'label'))):
    ours = tfds_io.from_examples(examples, specs, fields)
    for spec in specs:
      for field in fields:
        want, got = expected[name][spec][field], ours[spec][field]
        if not len(want):  # TFDS's empty split has no shape or dtype.
          assert not len(got)
          continue
        assert (got.dtype, got.shape) == (want.dtype, want.shape), (
            name, spec, field)
        assert got.tolist() == want.tolist(), (name, spec, field)


@pytest.mark.parametrize('task', ['text', 'image'])
@needs_tfds_extra
def test_generated_data_equals_its_tfds_load(task, tmp_path):
  # data.generate=True (no TFDS) against the same generated examples served
  # to the real-data path by tfds.testing.mock_data: the same batches.
  module = {'text': text, 'image': image}[task]
  generator = {'num_train': 23, 'num_test': 6, 'seed': 4}
  config = task_config(task, generator=generator)
  generated = module.get_datasets(config, str(tmp_path))
  with tfds_mock(module._mock_examples(config.data.generator)):  # pylint: disable=protected-access
    served = module.get_datasets(
        task_config(task, data_dir=str(tmp_path)), str(tmp_path))
  for split in ('train', 'eval', 'test'):
    a, b = getattr(generated, split), getattr(served, split)
    assert len(a) == len(b) > 0
    batch_a, batch_b = a.get(np.arange(len(a))), b.get(np.arange(len(b)))
    assert set(batch_a) == set(batch_b)
    for key in batch_a:
      np.testing.assert_array_equal(batch_a[key], batch_b[key])


def _without_tfds(monkeypatch):
  """Makes TensorFlow and TFDS impossible to import, as in an install
  without the extra."""
  for module in ('tensorflow', 'tensorflow_datasets',
                 'tensorflow.tsl.profiler.protobuf.xplane_pb2'):
    monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize('task', ['text', 'image'])
def test_generated_data_needs_no_tfds(task, tmp_path, monkeypatch):
  _without_tfds(monkeypatch)
  config = task_config(task, generator={'num_train': 20, 'num_test': 4})
  data = {'text': text, 'image': image}[task].get_datasets(config,
                                                          str(tmp_path))
  assert data.notes['data_source'] == 'mock'
  assert len(data.test) == 4


def test_real_data_without_the_extra_fails_in_one_line(tmp_path, monkeypatch,
                                                        capsys):
  from lra_msmra import main  # pylint: disable=g-import-not-at-top
  _without_tfds(monkeypatch)
  for task, name in (('text', 'imdb_reviews'), ('image', 'cifar10')):
    module = {'text': text, 'image': image}[task]
    config = task_config(task, data_dir=str(tmp_path))
    with pytest.raises(tfds_io.ExtraMissing, match=f'Reading TFDS {name} '
                       'needs the optional `tfds` extra') as e:
      module.get_datasets(config, str(tmp_path))
    assert errors.is_user_error(e.value)
    assert isinstance(e.value, ImportError)
    # The command line prints it as one `error:` line.
    assert main.run_guarded(lambda m=module, c=config: m.get_datasets(
        c, str(tmp_path))) == 1
    err = capsys.readouterr().err
    assert err.startswith(f'error: Reading TFDS {name} needs')
    assert err.count('\n') == 1 and INSTALL in err
    assert 'requirements-tfds.txt' in err


def test_prepare_tfds_without_the_extra_stops_first(tmp_path, monkeypatch,
                                                    capsys):
  _without_tfds(monkeypatch)
  out = tmp_path / 'out'
  code = prepare.main(['--tfds', '--generate_listops', '--out', str(out)])
  err = capsys.readouterr().err
  assert code == 1
  assert err.startswith('error: Preparing IMDb and CIFAR-10 (--tfds) needs')
  assert err.count('\n') == 1 and INSTALL in err
  assert not out.exists()  # Before any other work.
