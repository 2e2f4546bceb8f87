"""The tile table the kernels read, and the GPU sweep that writes it."""

import json

import jax.numpy as jnp
import pytest

from lra_msmra.kernels import flash
from lra_msmra_tools.benchmark import tile_sweep


def test_the_table_replaces_the_rules(monkeypatch):
  # The rules: float32 [64, 64] tiles are too many elements; 8 warps from
  # 8192 elements; 2 stages.
  assert flash.max_block(64, jnp.float32) == 16
  assert flash.triton_warps(64, 128) == 8
  assert flash.triton_warps(32, 32) == 4 and flash.triton_warps(16, 32) == 2
  assert flash.triton_stages(64, 128) == flash.DEFAULT_STAGES
  monkeypatch.setattr(flash, 'TILE_TABLE', {
      'max_tile': {'64/4': 32, '128/2': 128},
      'launch': {'64x128': {'warps': 4, 'stages': 3}}})
  assert flash.max_block(64, jnp.float32) == 32
  assert flash.max_block(64, jnp.float32, block=16) == 16  # A call's cap.
  assert flash.max_block(128, jnp.bfloat16) == 64  # DEFAULT_BLOCK caps it.
  assert flash.max_block(128, jnp.bfloat16, block=128) == 128
  assert (flash.triton_warps(64, 128), flash.triton_stages(64, 128)) == (4, 3)
  launch = flash.Launch(0, 64, 128).triton()
  assert (launch.num_warps, launch.num_stages) == (4, 3)
  # An explicit setting of a call still wins.
  assert flash.Launch(0, 64, 128, warps=8, stages=1).triton().num_stages == 1
  # Entries it does not hold keep the rules.
  assert flash.triton_warps(32, 32) == 4 and flash.max_block(32, jnp.bfloat16)


def test_a_malformed_table_is_refused(tmp_path):
  path = tmp_path / 'tile_table.json'
  assert flash.load_tile_table(str(path)) == {'max_tile': {}, 'launch': {}}
  path.write_text(json.dumps({'max_tile': {'64/2': 48}}))
  with pytest.raises(ValueError, match='power of two'):
    flash.load_tile_table(str(path))
  path.write_text(json.dumps({'launch': {'64x64': {'warp': 4}}}))
  with pytest.raises(ValueError, match='"warps": W'):
    flash.load_tile_table(str(path))


def test_best_table_takes_the_fastest_candidate_timed_on_every_pattern():
  def rec(tile, warps, pattern, seconds=None, dtype='bfloat16'):
    r = {'head_dim': 64, 'dtype': dtype, 'pattern': pattern,
         'kernel': 'flash', 'tile': tile, 'warps': warps, 'stages': 2}
    if seconds is not None:
      r['seconds'] = seconds
    return r
  records = [rec(64, 4, 'full', 1.0), rec(64, 4, 'full-causal', 1.0),
             rec(32, 4, 'full', 0.5), rec(32, 4, 'full-causal', 0.6),
             # Faster, but it failed on one pattern: not a choice.
             rec(128, 8, 'full', 0.1), rec(128, 8, 'full-causal'),
             rec(64, 8, 'full', 0.2, 'float32'),
             rec(64, 8, 'full-causal', 0.2, 'float32'),
             {'head_dim': 64, 'dtype': 'bfloat16', 'pattern': 'full',
              'kernel': 'cudnn', 'seconds': 0.01}]
  table = tile_sweep.best_table(records, ['bfloat16', 'float32'])
  assert table['max_tile'] == {'64/2': 32, '64/4': 64}
  # Launch settings come from the first dtype only.
  assert table['launch'] == {'32x64': {'warps': 4, 'stages': 2}}


def test_the_sweep_writes_a_table_the_kernels_read(tmp_path, monkeypatch):
  """The plumbing, in Pallas' interpreter (its times mean nothing)."""
  monkeypatch.setattr(flash, 'TILE_TABLE_FILE', str(tmp_path / 'k.json'))
  assert tile_sweep.main([
      '--out', str(tmp_path), '--interpret', '--length', '64',
      '--head_dims', '16', '--tiles', '16,32', '--warps', '4',
      '--stages', '2', '--repeats', '1', '--install']) == 0
  result = json.loads((tmp_path / 'tile_sweep.json').read_text())
  flash_records = [r for r in result['records'] if r['kernel'] == 'flash']
  assert len(flash_records) == 2 * len(tile_sweep.PATTERNS)
  assert all(r['seconds'] > 0 for r in flash_records)
  # The tile-local patterns' backward, fused and split.
  forms = [(r['pattern'], r['kernel']) for r in result['records']
           if r['kernel'].startswith('flash-') and r['seconds'] > 0]
  assert sorted(forms) == sorted(
      (name, kind) for name, _ in tile_sweep.BACKWARD_PATTERNS
      for kind in ('flash-fused', 'flash-split'))
  assert flash.FUSED_BACKWARD  # Left as it was.
  table = flash.load_tile_table(str(tmp_path / 'k.json'))
  assert table['max_tile']['16/2'] in (16, 32)
  tile = table['max_tile']['16/2']
  assert table['launch'] == {f'{tile}x16': {'warps': 4, 'stages': 2}}
  assert flash.TILE_TABLE == flash.load_tile_table()  # Left as it was.


def test_without_a_gpu_the_sweep_says_so(tmp_path, capsys):
  with pytest.raises(SystemExit):
    tile_sweep.parse_args(['--out', str(tmp_path)])
  assert 'no GPU here' in capsys.readouterr().err
