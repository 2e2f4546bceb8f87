"""TFDS's split arithmetic without TFDS (`lra_msmra.data.splits`)."""

import pytest

from lra_msmra.data import image
from lra_msmra.data import splits
from tests.data.helpers import needs_tfds_extra

# The specs the pipelines read (Text, Image, Pathfinder's percent slices)
# and more of TFDS's syntax.
SPECS = ['train', 'test', *image.SPLITS.values(), 'train[:80%]',
         'train[80%:90%]', 'train[90%:]', 'train[:10]', 'train[10:]',
         'train[-3:]', 'train[:-3]', 'train[-50%:]', 'train[:-10%]',
         'train[33.3%:66.7%]', 'train[1_0:]', 'train[2:2]', 'train[5:2]',
         'train[:0%]', 'train[100%:]', 'test+train[:50%]',
         'train[:25%] + test[75%:]', 'all']
SIZES = [0, 1, 2, 3, 5, 9, 10, 11, 15, 19, 20, 25, 45, 99, 100, 101, 1001,
         25000, 50000, 199999]
# Specs TFDS refuses for some or all sizes.
BAD_SPECS = ['train[10%]', 'train[:101%]', 'train[a:b]', 'train[:]',
             'train[1:2:3]', 'train[0.5:]', 'valid', ' train', 'train[2shard]',
             'all[:10%]', 'train[:12]', 'train[-12:]']


def _ours(spec, n):
  return [tuple(s) for s in splits.to_absolute(spec, {'train': n,
                                                      'test': n // 2 + 1})]


def test_pinned_slices():
  assert _ours('train[:90%]', 45) == [('train', 0, 40)]  # 40.5 -> 40.
  assert _ours('train[90%:]', 45) == [('train', 40, 45)]
  assert _ours('train[90%:]', 35) == [('train', 32, 35)]  # 31.5 -> 32.
  assert _ours('train[:90%]', 50000) == [('train', 0, 45000)]
  assert _ours('train[-3:]', 10) == [('train', 7, 10)]
  assert _ours('test+train[5:]', 10) == [('test', 0, 6), ('train', 5, 10)]
  assert _ours('all', 4) == [('train', 0, 4), ('test', 0, 3)]
  # Python's rounding of halves to even, as TFDS's 'closest'.
  assert [splits.percent_boundary(10, n) for n in (5, 15, 25, 35)] == [
      0, 2, 2, 4]
  with pytest.raises(ValueError, match='incompatible with 10 examples'):
    splits.to_absolute('train[:11]', {'train': 10})
  with pytest.raises(ValueError, match="Unknown split 'valid'"):
    splits.to_absolute('valid', {'train': 10})
  with pytest.raises(ValueError, match='shard'):
    splits.to_absolute('train[1shard:]', {'train': 10})


@needs_tfds_extra
def test_equals_tfds_read_instruction():
  from tensorflow_datasets.core import splits as tfds_splits  # pylint: disable=g-import-not-at-top

  def tfds_slices(spec, n):
    sizes = {'train': type('I', (), {'num_examples': n}),
             'test': type('I', (), {'num_examples': n // 2 + 1})}
    instructions = tfds_splits.ReadInstruction.from_spec(spec).to_absolute(
        sizes)
    return [(i.splitname, i.from_ or 0,
             sizes[i.splitname].num_examples if i.to is None else i.to)
            for i in instructions]

  compared = refused = 0
  for spec in SPECS + BAD_SPECS:
    for n in SIZES:
      if 'shard' in spec:  # Shards need stored files: refused by us.
        with pytest.raises(ValueError, match='shard'):
          _ours(spec, n)
        continue
      try:
        expected = tfds_slices(spec, n)
      except (ValueError, NotImplementedError):
        with pytest.raises(ValueError):
          _ours(spec, n)
        refused += 1
        continue
      assert _ours(spec, n) == expected, (spec, n)
      compared += 1
  assert compared > 300 and refused > 100
