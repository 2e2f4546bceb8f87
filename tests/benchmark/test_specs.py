"""The benchmarks' spec mini-language: specs, knob values, lengths."""

import pytest

from lra_msmra_tools.benchmark import specs


def test_parse_specs():
  parsed = specs.parse_specs(
      'softmax,cst:slice_length=8,alpha=1,adamra:compression_rates=(1/2,1/8)'
      ',combiner:variant=fixed')
  assert [s.name for s in parsed] == ['softmax', 'cst', 'adamra', 'combiner']
  assert parsed[1].kw == {'slice_length': 8, 'alpha': 1}
  assert parsed[2].kw == {'compression_rates': (0.5, 0.125)}
  assert parsed[3].kw == {'variant': 'fixed'}
  assert specs.parse_specs(parsed[1].label)[0] == parsed[1]
  assert specs.parse_specs(parsed[2].label)[0] == parsed[2]
  with pytest.raises(ValueError, match='before any mechanism'):
    specs.parse_specs('alpha=1')
  with pytest.raises(ValueError, match='twice'):
    specs.parse_specs('softmax,softmax')
  assert specs.parse_lengths('2K,1024,16') == [16, 1024, 2048]


@pytest.mark.parametrize('text, value', [
    ('true', True), ('False', False), ('TRUE', True), ('none', None),
    ('None', None), ('8', 8), (' 8 ', 8), ('-3', -3), ('0.5', 0.5),
    ('.5', 0.5), ('2.', 2.0), ('1e-3', 1e-3), ('-2.5E2', -250.0),
    ('1/2', 0.5), ('1 / 4', 0.25), ('-1/2', -0.5), ('3/1.5', 2.0),
    ('4/2', 2.0), ('(1/2,1/8,1/32)', (0.5, 0.125, 0.03125)),
    ('[1/2, 1/8]', (0.5, 0.125)), ('(8,)', (8,)), ('()', ()),
    ('(1,(2,3))', (1, (2, 3))), ('(fixed,true)', ('fixed', True)),
    ('fixed', 'fixed'), ('joint_softmax', 'joint_softmax'), ('yes', 'yes'),
    ('inf', 'inf'), ('nan', 'nan'), ('1.2.3', '1.2.3'), ('(1,2]', '(1,2]'),
])
def test_parse_value(text, value):
  parsed = specs.parse_value(text)
  assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize('text', ['2*4', '1+1', '1-2', '1/2/2', '2 * 0.5'])
def test_arithmetic_other_than_one_fraction_is_an_error(text):
  with pytest.raises(ValueError, match='arithmetic is not supported'):
    specs.parse_value(text)


def test_a_fraction_over_zero_is_an_error():
  with pytest.raises(ValueError, match='divides by zero'):
    specs.parse_value('1/0')
