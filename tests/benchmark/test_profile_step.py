"""The training-step profile runs the trainer's step and splits its time."""

import os
import tempfile

from lra_msmra_tools.benchmark import profile_step
from tests import helpers


def test_profile_of_a_tiny_step_names_the_parts(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  config = helpers.tiny_listops_config()
  result = profile_step.profile(config, steps=2, batch_size=8)
  # The trace went to a temporary folder, removed afterwards.
  assert not os.listdir(tmp_path)
  assert result['step_seconds'] > 0 and len(result['step_seconds_all']) == 2
  parts = result['parts']
  names = {name for name, _ in profile_step.PARTS} | {'other'}
  assert parts and set(parts) <= names
  assert {'attention', 'mlp', 'layer norm'} <= set(parts)
  table = profile_step.markdown('tiny', result)
  assert '| attention |' in table and 'all operations' in table


def test_parts_follow_the_source_path():
  assert profile_step.part_of(
      'jvp(Classifier)/encoder/block_0/mlp/Dropout_0/jit(_bernoulli)/x') == (
          'dropout random bits')
  assert profile_step.part_of(
      'transpose(jvp(Classifier))/encoder/block_1/ln_mlp/mul') == 'layer norm'
  assert profile_step.part_of('x/attention/query/dot_general') == 'attention'
  assert profile_step.part_of('add') == 'other'
