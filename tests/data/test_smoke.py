"""One train step and one evaluation per task with `:runlocal` (tiny data)."""

import json
import os

import pytest

from lra_msmra import records
from lra_msmra import train
from tests.data.helpers import task_config

# Generated data as small as the splits allow; test splits stay tiny because
# the trainer evaluates them whole.
SMALL_DATA = {
    'listops': {'generator': {'num_train': 16, 'num_valid': 8,
                             'num_test': 8}},
    'text': {'generator': {'num_train': 16, 'num_test': 8}},
    'retrieval': {'generator': {'num_train': 16, 'num_valid': 8,
                               'num_test': 8}},
    'image': {'generator': {'num_train': 20, 'num_test': 8}},
    'pathfinder': {'generator': {'num_examples': 30}},
    'pathx': {'generator': {'num_examples': 30}},
}


@pytest.mark.parametrize('task', sorted(SMALL_DATA))
def test_one_train_and_eval_step(task, tmp_path):
  config = task_config(task, **SMALL_DATA[task])
  config.batch_size = config.eval_batch_size = 8
  config.num_train_steps = config.eval_every_steps = 1
  config.num_eval_steps = 1
  config.checkpoint_every_steps = config.log_every_steps = 1
  # A tiny encoder of the same kind keeps compiles short.
  m = config.model
  m.num_layers, m.emb_dim, m.qkv_dim, m.mlp_dim, m.num_heads = 1, 16, 16, 16, 2
  m.head_hidden = (16,) * len(m.head_hidden)
  workdir = str(tmp_path)
  results = train.train_and_evaluate(config, workdir)
  assert results['final']['step'] == 1
  assert 0.0 <= results['test_accuracy'] <= 1.0
  notes = results['data_notes']
  assert notes['data_source'] == (
      'generated' if task in ('listops', 'pathfinder', 'pathx') else 'mock')
  if task != 'listops':
    for switch in ('zero_id_is_padding', 'pooling', 'train_shuffle'):
      assert switch in notes
  with open(os.path.join(workdir, 'results.json')) as f:
    written = json.load(f)
  assert written['task'] == task
  # Provenance: data source, setting fingerprint, code, versions, devices,
  # times.
  assert written['data_source']['kind'] == notes['data_source']
  assert len(written['setting_fingerprint']) == 12
  prov = written['provenance']
  assert len(prov['code']['commit']) == 40
  # Also where there is no git checkout: the package sources' digest.
  assert prov['code']['source_digest'] == records.source_digest()
  assert prov['versions']['jax'] and prov['versions']['flax']
  assert prov['devices']['platform'] == 'cpu'
  assert prov['devices']['num_devices'] >= 1
  assert 0 < written['train_seconds'] <= written['wall_seconds']
