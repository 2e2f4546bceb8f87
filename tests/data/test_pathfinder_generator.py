"""Our Pathfinder generator: pinned images, seeding, layout, labels, errors.

No TensorFlow here: PNGs are read with `read_png` (our writer's format).
The reader on generated folders is tested in test_pathfinder.py.
"""

import json
import math
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from lra_msmra.data import pathfinder
from lra_msmra.data import pathfinder_generator as pg
from lra_msmra.data import png
from lra_msmra.data import prepare

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'pathfinder_fixture')
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# (resolution, difficulty, images in the fixture)
FIXTURE_SETS = [(32, 'easy', 4), (32, 'intermediate', 4), (32, 'hard', 4),
                (128, 'hard', 2)]


def read_png(path):
  """uint8 [H, W] of an 8-bit grayscale PNG with unfiltered rows (what
  `png.write` writes)."""
  with open(path, 'rb') as f:
    data = f.read()
  assert data[:8] == b'\x89PNG\r\n\x1a\n', path
  pos, idat, size = 8, b'', None
  while pos < len(data):
    length, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + length]
    if kind == b'IHDR':
      w, h, depth, color = struct.unpack('>IIBB', body[:10])
      assert (depth, color) == (8, 0), path
      size = (h, w)
    elif kind == b'IDAT':
      idat += body
    pos += 12 + length
  rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(
      size[0], size[1] + 1)
  assert not rows[:, 0].any(), f'{path}: filtered rows'
  return rows[:, 1:]


def metadata_lines(folder, batch=0):
  with open(os.path.join(folder, 'metadata', f'{batch}.npy')) as f:
    return f.read().splitlines()


@pytest.mark.parametrize('resolution,difficulty,count', FIXTURE_SETS)
def test_first_images_of_seed_0_are_pinned(resolution, difficulty, count):
  folder = pathfinder.folder_path(FIXTURE, resolution, difficulty)
  s = pg.settings(resolution, difficulty)
  lines = metadata_lines(folder)
  assert len(lines) == count
  for n in range(count):
    pixels, label, margin = pg.generate_image(s, 0, difficulty, n)
    assert pixels.dtype == np.uint8
    np.testing.assert_array_equal(
        pixels, read_png(os.path.join(folder, f'imgs/0/sample_{n}.png')))
    fields = lines[n].split(' ')
    assert fields[:4] == ['imgs/0', f'sample_{n}.png', str(n), str(label)]
    assert int(fields[9]) == margin


def test_an_image_alone_equals_it_in_a_written_set(tmp_path):
  folder = pathfinder.generate_dataset(
      str(tmp_path), resolution=32, difficulty='easy', num_examples=7,
      seed=3, per_folder=3)
  assert sorted(os.listdir(os.path.join(folder, 'imgs'))) == ['0', '1', '2']
  s = pg.settings(32, 'easy')
  for n in (0, 4, 6):  # imgs/0/sample_0, imgs/1/sample_1, imgs/2/sample_0
    pixels, label, margin = pg.generate_image(s, 3, 'easy', n)
    batch, i = divmod(n, 3)
    np.testing.assert_array_equal(
        pixels, read_png(os.path.join(folder, f'imgs/{batch}/sample_{i}.png')))
    assert metadata_lines(folder, batch)[i] == (
        f'imgs/{batch} sample_{i}.png {i} {label} 1.0 6 2 2 0.5 {margin} 1')
  # Another seed, another image.
  other, _, _ = pg.generate_image(s, 4, 'easy', 0)
  assert not np.array_equal(other, pg.generate_image(s, 3, 'easy', 0)[0])
  stamp = pathfinder.read_stamp(folder)
  assert stamp['spec']['seed'] == 3 and stamp['spec']['num_examples'] == 7
  assert stamp['spec']['settings']['contour_length'] == 6
  labels = stamp['details']['labels']
  assert labels['0'] + labels['1'] == 7
  assert stamp['details']['generation_seconds'] >= 0


def _tree(folder):
  out = {}
  for dirpath, _, files in os.walk(folder):
    for name in files:
      if name != 'generator.json':
        path = os.path.join(dirpath, name)
        with open(path, 'rb') as f:
          out[os.path.relpath(path, folder)] = f.read()
  return out


def test_two_workers_write_the_same_files(tmp_path):
  n = pathfinder.CHUNK + 3  # Two units of work.
  one = pathfinder.generate_dataset(
      str(tmp_path / 'one'), resolution=32, difficulty='easy',
      num_examples=n, seed=0, per_folder=40)
  # Two worker processes, from the command line (forking this test process,
  # which holds JAX's threads, is not safe).
  subprocess.run(
      [sys.executable, '-m', 'lra_msmra.data.prepare',
       '--generate_pathfinder', '--out', str(tmp_path / 'two'),
       '--pathfinder_sets', '32/easy', '--pathfinder_num_examples', str(n),
       '--workers', '2'], check=True, cwd=ROOT, capture_output=True)
  two = pathfinder.folder_path(str(tmp_path / 'two'), 32, 'easy')
  assert pathfinder.read_stamp(two)['details']['workers'] == 2
  # per_folder differs (1000 from the command): compare image by image.
  lines = metadata_lines(two)
  assert len(lines) == n
  for k in range(n):
    batch, i = divmod(k, 40)
    np.testing.assert_array_equal(
        read_png(os.path.join(one, f'imgs/{batch}/sample_{i}.png')),
        read_png(os.path.join(two, f'imgs/0/sample_{k}.png')))
    assert (metadata_lines(one, batch)[i].split(' ')[3:] ==
            lines[k].split(' ')[3:])


def test_an_interrupted_set_resumes_from_its_finished_folders(tmp_path):
  kwargs = dict(resolution=32, difficulty='easy', num_examples=6, seed=1,
                per_folder=3)
  folder = pathfinder.generate_dataset(str(tmp_path), **kwargs)
  before = _tree(folder)
  spec = pathfinder.read_stamp(folder)['spec']
  # What an interrupted run leaves: its progress file, folder 0 finished,
  # folder 1 without metadata, no stamp.
  os.remove(os.path.join(folder, 'generator.json'))
  os.remove(os.path.join(folder, 'metadata', '1.npy'))
  os.remove(os.path.join(folder, 'imgs', '1', 'sample_2.png'))
  with open(os.path.join(folder, 'generating.json'), 'w') as f:
    json.dump(spec, f)
  finished = os.path.join(folder, 'imgs', '0', 'sample_0.png')
  os.utime(finished, (0, 0))
  pathfinder.generate_dataset(str(tmp_path), **kwargs)
  assert _tree(folder) == before
  assert os.stat(finished).st_mtime == 0  # Not rewritten.
  assert not os.path.exists(os.path.join(folder, 'generating.json'))
  # Other settings start over.
  pathfinder.generate_dataset(str(tmp_path), **dict(kwargs, num_examples=2))
  assert len(metadata_lines(folder)) == 2
  assert not os.path.exists(os.path.join(folder, 'metadata', '1.npy'))


def test_labels_are_balanced_and_drawn_first():
  labels = np.array([pg.image_label(0, 32, 'hard', n) for n in range(4000)])
  # Binomial(4000, 1/2): 4 standard deviations are 0.032.
  assert abs(labels.mean() - 0.5) < 0.032
  s = pg.settings(32, 'hard')
  for n in range(3):
    assert pg.generate_image(s, 0, 'hard', n)[1] == labels[n]


def test_lra_settings_per_set():
  hard = pg.settings(32, 'hard')
  assert (hard.contour_length, hard.distractor_length,
          hard.num_distractor_snakes) == (14, 4, 5)
  assert (hard.paddle_length, hard.paddle_thickness, hard.paddle_margins,
          hard.seed_distance, hard.snake_contrasts,
          hard.paddle_contrasts) == (2, 0.5, (1,), 7, (2.0,), (0.75,))
  easy = pg.settings(32, 'easy')
  assert (easy.contour_length, easy.distractor_length,
          easy.num_distractor_snakes) == (6, 2, 10)
  pathx = pg.settings(128, 'hard')
  assert (pathx.paddle_margins, pathx.seed_distance, pathx.continuity,
          pathx.num_distractor_snakes) == ((2, 3), 20, 1.8, 17)
  assert pg.settings(128, 'hard', 'documented').num_distractor_snakes == 8


def test_seed_directions_follow_the_official_quirk():
  # At 32x32 the official code seeds snakes only in the 30 directions
  # whose dilation structure covers all four quadrants around its anchor
  # (see _Geometry.seed_kernel); at 128x128 in nearly all.
  usable = {}
  for resolution in (32, 128):
    s = pg.settings(resolution, 'hard')
    for margin in s.paddle_margins:
      g = pg._Geometry(s, margin)  # pylint: disable=protected-access
      usable[resolution, margin] = [
          d for d in range(-180, 180)
          if not g.seed_kernel(d * math.pi / 180).blind]
  assert usable[32, 1] == list(range(-150, -120))
  assert len(usable[128, 2]) == 354 and len(usable[128, 3]) == 360


def test_bad_input_gives_one_clear_line(tmp_path, capsys):
  with pytest.raises(ValueError, match='resolution 64'):
    pg.settings(64, 'hard')
  with pytest.raises(ValueError, match="difficulty 'medium'"):
    pg.settings(32, 'medium')
  with pytest.raises(ValueError, match='num_examples=0 must be an integer'):
    pathfinder.generate_dataset(str(tmp_path), resolution=32,
                                difficulty='easy', num_examples=0, seed=0)
  out = str(tmp_path / 'out')
  for flags, message in (
      (['--pathfinder_sets', '64/hard'],
       "--pathfinder_sets: '64/hard' is not one of 32/easy,"),
      (['--workers', '0'], '--workers=0 must be at least 1.'),
      (['--pathfinder_num_examples', '0'],
       '--pathfinder_num_examples=0 must be at least 1.')):
    with pytest.raises(SystemExit) as e:
      prepare.main(['--generate_pathfinder', '--out', out] + flags)
    assert e.value.code == 2
    errors = [l for l in capsys.readouterr().err.splitlines()
              if l.startswith('python -m lra_msmra.data.prepare: error:')]
    assert len(errors) == 1 and message in errors[0], errors
  # A folder that holds other data is not overwritten.
  release = pathfinder.folder_path(out, 32, 'easy')
  os.makedirs(os.path.join(release, 'metadata'))
  with open(os.path.join(release, 'metadata', '0.npy'), 'w') as f:
    f.write('imgs/0 sample_0.png 0 1\n')
  assert prepare.main(['--generate_pathfinder', '--out', out,
                       '--pathfinder_sets', '32/easy',
                       '--pathfinder_num_examples', '2']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'already holds release data' in err[0], err
