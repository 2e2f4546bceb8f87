"""Attention benchmark: a small end-to-end run, FLOP counts."""

import json

import jax
import jax.numpy as jnp
import pytest

from lra_msmra import flops
from lra_msmra_tools.benchmark import attention
from tests.benchmark import run_benchmark

# One test worker runs this file, so its module-scoped fixture is built
# once (pytest-xdist's `--dist loadgroup`, set in pytest.ini).
pytestmark = pytest.mark.xdist_group('benchmark_attention')

MECHANISMS = ['softmax', 'cst:slice_length=4']
LENGTHS = [16, 32]


@pytest.fixture(scope='module')
def bench_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp('attention')
  run_benchmark('lra_msmra_tools.benchmark.attention', MECHANISMS, LENGTHS, out,
                '--batch', '1', '--features', '16', '--heads', '2',
                '--repeats', '2', '--torch', 'off')
  return out


def test_outputs_cover_every_mechanism_and_length(bench_dir):
  with open(bench_dir / 'attention.json') as f:
    report = json.load(f)
  assert report['settings']['mechanisms'] == MECHANISMS
  assert report['settings']['lengths'] == LENGTHS
  seen = {(r['mechanism'], r['mode'], r['length']): r
          for r in report['records']}
  for m in MECHANISMS:
    for n in LENGTHS:
      for mode in attention.MODES:
        rec = seen[(m, mode, n)]
        assert rec['status'] == 'ok', rec
        assert rec['time_s'] > 0 and rec['compile_s'] > 0
        assert rec['flops'] > 0
        assert rec['net_peak_bytes'] is not None
        assert rec['faults_per_call'] >= 0
  # Forward+backward costs more matmul FLOPs than the forward pass.
  for m in MECHANISMS:
    assert (seen[(m, 'fwd_bwd', 32)]['flops']
            > 2 * seen[(m, 'fwd', 32)]['flops'])
  assert report['environment']['versions']['jax']
  text = (bench_dir / 'attention.md').read_text()
  assert report['command'] in text
  for m in MECHANISMS:
    assert f'`{m}`' in text
  for n in LENGTHS:
    assert f'| {n} |' in text or f'| {n}' in text
  assert 'PyTorch comparison turned off' in text
  for name in ('attention_time.png', 'attention_memory.png'):
    data = (bench_dir / name).read_bytes()
    assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 1000


def test_unknown_mechanism_is_rejected(capsys):
  with pytest.raises(SystemExit):
    attention.parse_args(['--mechanisms', 'nope', '--out', 'x'])
  assert 'unknown mechanism' in capsys.readouterr().err


def test_matmul_flops_of_softmax_attention():
  b, n, d_model, h = 2, 8, 16, 4

  def attn(x, wq, wk, wv, wo):
    q = jnp.einsum('bnf,fhd->bnhd', x, wq)
    k = jnp.einsum('bnf,fhd->bnhd', x, wk)
    v = jnp.einsum('bnf,fhd->bnhd', x, wv)
    p = jax.nn.softmax(jnp.einsum('bqhd,bkhd->bhqk', q, k))
    y = jnp.einsum('bhqk,bkhd->bqhd', p, v)
    return jnp.einsum('bqhd,hdf->bqf', y, wo)

  x = jnp.ones((b, n, d_model))
  w = jnp.ones((d_model, h, d_model // h))
  wo = jnp.ones((h, d_model // h, d_model))
  counted = flops.matmul_flops(jax.jit(attn), x, w, w, w, wo)
  # 4 projections of N x D x D and two N x N x D products, 2 FLOPs a MAC.
  assert counted['flops'] == 2 * b * (4 * n * d_model ** 2
                                      + 2 * n * n * d_model)
  # scan bodies count once per step.
  def scanned(x):
    return jax.lax.scan(lambda c, _: (c @ c, None), x, None, length=3)[0]
  m = jnp.ones((4, 4))
  assert flops.matmul_flops(scanned, m)['flops'] == 3 * 2 * 4 ** 3


@pytest.mark.parametrize('flag,value,message', [
    ('--mechanisms', 'cst:slice_length=2*4', '--mechanisms: Knob value'),
    ('--mechanisms', 'slice_length=8', '--mechanisms: Knob'),
    ('--lengths', '1024,x', "--lengths: Length 'x' is not an integer"),
])
def test_a_bad_spec_or_length_is_one_usage_line(flag, value, message, capsys):
  from lra_msmra_tools.benchmark import train_step  # pylint: disable=g-import-not-at-top
  for command in (attention, train_step):
    with pytest.raises(SystemExit) as exit_info:
      command.parse_args(['--out', 'x', flag, value])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
