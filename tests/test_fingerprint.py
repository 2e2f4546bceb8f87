"""Settings and fingerprints (lra_msmra/fingerprint.py): keys added after
runs were recorded leave those runs' settings unchanged."""

import copy

from lra_msmra import fingerprint
from tests import helpers

SOURCE = {'kind': 'generated'}


def _recorded_before_the_key():
  """A config as runs recorded it before `attention_kw.implementation`."""
  config = helpers.tiny_listops_config().to_dict()
  assert config['model']['attention_kw'] == {'implementation': 'xla'}
  old = copy.deepcopy(config)
  del old['model']['attention_kw']['implementation']
  return config, old


def test_the_xla_implementation_is_the_setting_of_earlier_runs():
  config, old = _recorded_before_the_key()
  assert fingerprint.setting(config, SOURCE) == fingerprint.setting(
      old, SOURCE)
  assert 'model.attention_kw.implementation' not in fingerprint.setting(
      config, SOURCE)
  # A resumed run compares whole configs: no difference either.
  assert fingerprint.differing_keys(old, config) == []
  assert fingerprint.differing_keys(fingerprint.flatten(old),
                                    fingerprint.flatten(config)) == []
  # The same code one batch row at a time: the same experiment.
  config['model']['attention_kw']['implementation'] = 'xla_rows'
  assert fingerprint.setting(config, SOURCE) == fingerprint.setting(
      old, SOURCE)


def test_another_implementation_is_another_setting():
  config, old = _recorded_before_the_key()
  config['model']['attention_kw']['implementation'] = 'cudnn'
  fused = fingerprint.setting(config, SOURCE)
  assert fused['model.attention_kw.implementation'] == 'cudnn'
  assert fingerprint.fingerprint(fused) != fingerprint.fingerprint(
      fingerprint.setting(old, SOURCE))
  assert fingerprint.differing_keys(old, config) == ['model']
  assert fingerprint.differences(fused, fingerprint.setting(old, SOURCE)) == [
      'model.attention_kw.implementation=cudnn']
