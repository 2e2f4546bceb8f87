"""The layer profile times one attention point and splits it by operation."""

import json
import os
import tempfile

import pytest

from lra_msmra_tools.benchmark import profile_layer

HLO = """HloModule m

%fused_dot (p0: f32[4,8], p1: f32[8,2]) -> f32[4,2] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,2]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_move (p0.1: f32[4,2]) -> f32[2,4] {
  %p0.1 = f32[4,2]{1,0} parameter(0)
  ROOT %transpose.1 = f32[2,4]{1,0} transpose(%p0.1), dimensions={1,0}
}

%fused_exp (p0.2: f32[2,4]) -> f32[2,4] {
  %p0.2 = f32[2,4]{1,0} parameter(0)
  %t = f32[2,4]{1,0} transpose(%p0.2), dimensions={0,1}
  ROOT %exp.1 = f32[2,4]{1,0} exponential(%t)
}

ENTRY %main (x: f32[4,8], w: f32[8,2]) -> f32[2,4] {
  %x = f32[4,8]{1,0} parameter(0)
  %w = f32[8,2]{1,0} parameter(1)
  %ynn_fusion = f32[4,2]{1,0} fusion(%x, %w), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(f)/layer/query/dot_general"}
  %transpose_fusion = f32[2,4]{1,0} fusion(%ynn_fusion), kind=kLoop, calls=%fused_move, metadata={op_name="jit(f)/layer/transpose"}
  ROOT %exp_fusion = f32[2,4]{1,0} fusion(%transpose_fusion), kind=kLoop, calls=%fused_exp
}
"""


def test_instructions_are_sorted_by_what_their_fusion_does():
  ops = profile_layer.instructions(HLO)
  assert ops['ynn_fusion'] == {
      'shape': 'f32[4,2]{1,0}', 'kind': 'matrix products',
      'source': 'jit(f)/layer/query/dot_general'}
  assert ops['transpose_fusion']['kind'] == 'layout copies'
  # A fusion with arithmetic in it is not a copy, whatever else it does.
  assert ops['exp_fusion']['kind'] == 'element-wise and reductions'
  assert ops['exp_fusion']['source'] == ''


LOOP_HLO = """HloModule m

%fused_argmax (p0: f32[2,4]) -> (f32[2], s32[2]) {
  %p0 = f32[2,4]{1,0} parameter(0)
  %m = f32[2]{0} reduce(%p0, %p0), dimensions={1}, to_apply=%max
  %i = s32[2]{0} convert(%m)
  ROOT %t = (f32[2]{0}, s32[2]{0}) tuple(%m, %i)
}

ENTRY %main (x: f32[2,4], s: (s32[], f32[2,4])) -> (f32[2], s32[2]) {
  %x = f32[2,4]{1,0} parameter(0)
  %s = (s32[], f32[2,4]{1,0}) parameter(1)
  %while.1 = (s32[], f32[2,4]{1,0}) while(%s), condition=%cond, body=%body
  ROOT %argmax_fusion = (f32[2]{0}, s32[2]{0}) fusion(%x), kind=kLoop, calls=%fused_argmax, metadata={op_name="jit(f)/argmax"}
}
"""


def test_multi_output_fusions_count_and_loops_do_not():
  ops = profile_layer.instructions(LOOP_HLO)
  # A fusion with several outputs has a tuple shape; it is timed like any.
  assert ops['argmax_fusion'] == {
      'shape': '(f32[2]{0}, s32[2]{0})',
      'kind': 'element-wise and reductions', 'source': 'jit(f)/argmax'}
  # A loop's event spans its body's operations, which are traced themselves.
  assert 'while.1' not in ops


@pytest.mark.parametrize('mode', ['fwd', 'fwd_bwd'])
def test_profile_of_a_small_layer(mode, tmp_path):
  payload = {'name': 'long_short', 'kw': {'window_size': 4,
                                          'num_landmarks': 4},
             'batch': 2, 'length': 32, 'features': 16, 'heads': 2,
             'dtype': 'float32', 'mode': mode}
  result = profile_layer.profile(payload, calls=2, trace_dir=str(tmp_path))
  assert result['seconds'] > 0 and len(result['seconds_all']) == 2
  assert result['ops'], 'no operation of the program was found in the trace'
  assert set(result['kinds']) <= set(profile_layer.KINDS)
  assert 'matrix products' in result['kinds']
  assert sum(o['seconds'] for o in result['ops']) == pytest.approx(
      sum(result['kinds'].values()))
  # The layer's own projections are among the named sources.
  assert any('query' in o['source'] for o in result['ops'])
  table = profile_layer.markdown('tiny', result, top=3)
  assert '| all operations |' in table
  op_rows = [l for l in table.splitlines()
             if l.startswith('| ') and l.split('|')[2].strip().startswith('`')]
  assert len(op_rows) == 3


def test_command_line_writes_its_report(tmp_path, capsys, monkeypatch):
  system_temp = tmp_path / 'temp'
  system_temp.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(system_temp))
  assert profile_layer.main([
      '--mechanism', 'long_short:window_size=4,num_landmarks=4',
      '--length', '16', '--batch', '1', '--features', '8', '--heads', '2',
      '--calls', '1', '--top', '2', '--out', str(tmp_path)]) == 0
  assert 'ms per call' in capsys.readouterr().out
  report = json.load(open(tmp_path / 'profile.json'))
  assert report['payload']['kw'] == {'window_size': 4, 'num_landmarks': 4}
  assert report['command'].startswith(
      'python -m lra_msmra_tools.benchmark.profile_layer --mechanism long_short')
  # The trace (tens of MB at full size) is not left in the temp folder.
  assert not os.listdir(system_temp)


@pytest.mark.parametrize('args, message', [
    (['--mechanism', 'nope', '--length', '8'], "unknown mechanism 'nope'"),
    (['--mechanism', 'cst,long_short', '--length', '8'], 'one mechanism'),
    (['--mechanism', 'cst', '--length', '8', '--calls', '0'], '>= 1'),
])
def test_bad_arguments_name_the_problem(args, message, capsys):
  with pytest.raises(SystemExit):
    profile_layer.main(args)
  assert message in capsys.readouterr().err
