"""Self-pretraining (lra_msmra.objectives, models.TokenPredictor) and
fine-tuning from a pretrained encoder (config.init_from)."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_msmra import attention
from lra_msmra import checkpoint as checkpoint_lib
from lra_msmra import config_lib
from lra_msmra import models
from lra_msmra import objectives
from lra_msmra import steps
from lra_msmra import train
from lra_msmra import validation
from tests import helpers

ROOT = helpers.ROOT


def _real(shape, lengths):
  return np.arange(shape[1])[None, :] < np.asarray(lengths)[:, None]


# ------------------------------------------------------------- the masks


@pytest.mark.parametrize('rate, span', [(0.15, 1), (0.5, 1), (0.3, 4)])
def test_mask_covers_the_rate_of_real_tokens_and_never_padding(rate, span):
  real = jnp.asarray(_real((64, 512), np.arange(64) * 8 + 8))
  masked = np.asarray(objectives.mask_positions(jax.random.PRNGKey(1), real,
                                                rate, span))
  assert not (masked & ~np.asarray(real)).any()
  share = masked.sum() / np.asarray(real).sum()
  assert abs(share - rate) < 0.03, share
  assert masked.any(axis=1).all()  # Every row with a real token has a target.


def test_span_masking_masks_runs():
  real = jnp.ones((16, 1024), bool)
  one = np.asarray(objectives.mask_positions(jax.random.PRNGKey(0), real,
                                             0.3, 1))
  runs = np.asarray(objectives.mask_positions(jax.random.PRNGKey(0), real,
                                              0.3, 5))

  def mean_run(m):
    starts = m[:, 1:] & ~m[:, :-1]
    return m.sum() / max(starts.sum() + m[:, 0].sum(), 1)

  assert mean_run(runs) > 2.5 * mean_run(one)


def test_masked_inputs_replace_only_the_masked_tokens():
  ids = jnp.asarray(np.random.RandomState(0).randint(1, 9, (4, 32)))
  real = jnp.asarray(_real((4, 32), [32, 20, 5, 1]))
  ids = jnp.where(real, ids, 0)
  inputs, targets, weights = objectives.masked_inputs(
      jax.random.PRNGKey(3), ids, real, rate=0.4, span=1, mask_id=9)
  masked = np.asarray(weights) > 0
  np.testing.assert_array_equal(np.asarray(targets), np.asarray(ids))
  np.testing.assert_array_equal(np.asarray(inputs)[masked], 9)
  np.testing.assert_array_equal(np.asarray(inputs)[~masked],
                                np.asarray(ids)[~masked])
  assert not masked[~np.asarray(real)].any()


def test_causal_targets_are_the_next_real_token():
  ids = jnp.asarray([[5, 6, 7, 0, 0], [1, 2, 3, 4, 8]])
  real = ids > 0
  inputs, targets, weights = objectives.causal_targets(ids, real)
  np.testing.assert_array_equal(inputs, ids)
  np.testing.assert_array_equal(targets, [[6, 7, 0, 0, 0], [2, 3, 4, 8, 0]])
  np.testing.assert_array_equal(weights, [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])


# ------------------------------------------------------------- the model


def _model_config(name='softmax', **kw):
  c = config_lib.default_config().model
  c.num_layers, c.emb_dim, c.num_heads, c.qkv_dim, c.mlp_dim = 1, 16, 2, 16, 32
  c.head_hidden = (8,)
  c.attention = name
  for key, value in kw.items():
    c[key] = value
  return c


def _predictor(objective, name='softmax', dual=False, vocab=11, max_len=24,
               **kw):
  return models.create_model(_model_config(name, **kw), vocab_size=vocab,
                             num_classes=3, max_len=max_len, dual=dual,
                             objective=objective,
                             masking={'rate': 0.3, 'span': 1})


def _init(model, batch):
  return model.init({'params': jax.random.PRNGKey(0),
                     'masking': jax.random.PRNGKey(1)}, batch,
                    deterministic=True)['params']


def test_masked_model_has_a_mask_row_and_predicts_the_vocabulary():
  model = _predictor('masked')
  ids = jnp.asarray(np.random.RandomState(0).randint(1, 11, (3, 24)))
  params = _init(model, {'inputs': ids})
  assert params['encoder']['embed']['embedding'].shape == (12, 16)
  logits, targets, weights = model.apply(
      {'params': params}, {'inputs': ids}, deterministic=True,
      rngs={'masking': jax.random.PRNGKey(2)})
  assert logits.shape == (3, 24, 11) and targets.shape == (3, 24)
  assert 0 < float(weights.sum()) < 3 * 24
  # The classifier over the same config has the same encoder, less the row.
  classifier = models.create_model(_model_config(), vocab_size=11,
                                   num_classes=3, max_len=24, dual=False)
  cparams = _init(classifier, {'inputs': ids})
  assert cparams['encoder']['embed']['embedding'].shape == (11, 16)
  assert (jax.tree.structure(cparams['encoder']) ==
          jax.tree.structure(params['encoder']))


@pytest.mark.parametrize('name', ['softmax', 'long_short'])
def test_causal_objective_never_sees_the_token_it_predicts(name):
  kw = {'attention_kw': config_lib.attention_kw(
      {'window_size': 4, 'num_landmarks': 2})} if name == 'long_short' else {}
  model = _predictor('causal', name, pooling='MEAN', **kw)
  rng = np.random.RandomState(0)
  ids = rng.randint(1, 11, (1, 24))
  params = _init(model, {'inputs': jnp.asarray(ids)})
  logits, targets, _ = model.apply({'params': params},
                                   {'inputs': jnp.asarray(ids)},
                                   deterministic=True)
  for i in (0, 7, 22):
    later = ids.copy()
    later[0, i + 1:] = rng.randint(1, 11, 23 - i)  # Its target and after.
    other, _, _ = model.apply({'params': params},
                              {'inputs': jnp.asarray(later)},
                              deterministic=True)
    np.testing.assert_allclose(other[0, :i + 1], logits[0, :i + 1],
                               rtol=1e-6, atol=1e-6)
    assert int(targets[0, i]) == ids[0, i + 1]


def test_retrieval_documents_pretrain_as_rows_of_their_own():
  model = _predictor('masked', dual=True)
  rng = np.random.RandomState(0)
  batch = {'inputs': jnp.asarray(rng.randint(1, 11, (2, 24))),
           'inputs2': jnp.asarray(rng.randint(1, 11, (2, 24))),
           'weights': jnp.asarray([1.0, 0.0])}
  params = _init(model, batch)
  logits, targets, weights = model.apply(
      {'params': params}, batch, deterministic=True,
      rngs={'masking': jax.random.PRNGKey(0)})
  assert logits.shape[0] == 4
  np.testing.assert_array_equal(targets[2:], batch['inputs2'])
  # An evaluation batch's padded example (weight 0) adds no token.
  assert float(weights[1].sum()) == float(weights[3].sum()) == 0


def test_padding_is_never_masked_nor_predicted():
  for objective in ('masked', 'causal'):
    model = _predictor(objective, pooling='MEAN')
    ids = np.random.RandomState(0).randint(1, 11, (2, 24))
    ids[:, 10:] = 0
    batch = {'inputs': jnp.asarray(ids)}
    params = _init(model, batch)
    _, targets, weights = model.apply(
        {'params': params}, batch, deterministic=True,
        rngs={'masking': jax.random.PRNGKey(0)})
    weights = np.asarray(weights)
    assert weights[:, 9:].sum() == 0 if objective == 'causal' else (
        weights[:, 10:].sum() == 0)
    assert (np.asarray(targets)[weights > 0] > 0).all()


def test_causal_objective_of_a_mechanism_without_one_names_masked():
  config = helpers.load_config('configs/listops/adamra.py', 'runlocal,spt')
  config.objective = 'causal'
  with pytest.raises(ValueError, match=r"config.objective='masked'"):
    validation.trace(config)


@pytest.mark.parametrize('key, value, match', [
    ('objective', 'mlm', r"config.objective='mlm'; valid"),
    ('masking.rate', 1.0, r'config.masking.rate=1.0 must be a number'),
    ('masking.span', 0, r'config.masking.span=0 must be a positive'),
])
def test_bad_pretraining_settings_are_one_line(key, value, match):
  config = helpers.tiny_listops_config(**{key: value})
  with pytest.raises(ValueError, match=match):
    validation.trace(config)


def test_init_from_with_a_pretraining_objective_is_refused():
  config = helpers.tiny_listops_config(objective='masked', init_from='/x')
  with pytest.raises(ValueError, match=r"config.objective='classify'"):
    validation.trace(config)


# ------------------------------------------- pretraining, then fine-tuning


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
  """A masked pretraining run of the tiny ListOps config (4 steps)."""
  workdir = str(tmp_path_factory.mktemp('pretrain'))
  results = train.train_and_evaluate(
      helpers.tiny_listops_config(objective='masked'), workdir)
  return workdir, results


def test_pretraining_run_records_its_objective(pretrained):
  workdir, results = pretrained
  assert results['objective'] == 'masked'
  assert results['warnings'] == []
  assert 0.0 <= results['final']['val_accuracy'] <= 1.0
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['objective'] == 'masked'


def test_pretraining_resumes_exactly(pretrained, tmp_path):
  # The masks are drawn from each step's key, so an interrupted pretraining
  # run resumed from its checkpoint is the uninterrupted one.
  _, full = pretrained
  workdir = str(tmp_path)
  train.train_and_evaluate(
      helpers.tiny_listops_config(objective='masked', num_train_steps=2),
      workdir)
  resumed = train.train_and_evaluate(
      helpers.tiny_listops_config(objective='masked'), workdir)
  assert resumed['final'] == full['final']


def test_fine_tuning_starts_from_the_pretrained_encoder(pretrained, tmp_path,
                                                        monkeypatch):
  source, pre = pretrained
  _, _, pre_params = checkpoint_lib.load_checkpoint(source, 'latest')
  started = {}
  real_start = train._start_from

  def spy(init_from, state, tx, state_sharding):
    out = real_start(init_from, state, tx, state_sharding)
    started['params'] = jax.device_get(out.params)
    started['opt_state'] = jax.device_get(out.opt_state)
    return out

  monkeypatch.setattr(train, '_start_from', spy)
  results = train.train_and_evaluate(
      helpers.tiny_listops_config(init_from=source), str(tmp_path))
  enc = started['params']['encoder']
  np.testing.assert_array_equal(
      enc['embed']['embedding'],
      np.asarray(pre_params['encoder']['embed']['embedding'])[:-1])
  jax.tree.map(np.testing.assert_array_equal,
               {k: v for k, v in enc.items() if k != 'embed'},
               jax.device_get({k: v for k, v in
                               pre_params['encoder'].items() if k != 'embed'}))
  assert 'head' in started['params'] and 'token_head' not in started['params']
  # A fresh optimizer state: every moment is zero.
  assert all(float(np.abs(x).max()) == 0 for x in
             jax.tree.leaves(started['opt_state'])
             if np.asarray(x).dtype == np.float32 and np.asarray(x).ndim)
  record = results['pretraining']
  assert record['objective'] == 'masked' and record['steps'] == 4
  assert record['workdir'] == os.path.abspath(source)
  assert record['final_val_loss'] == pre['final']['val_loss']
  assert record['masking'] == {'rate': 0.15, 'span': 1}


def test_fine_tuning_resumes_from_its_own_checkpoint(pretrained, tmp_path):
  source, _ = pretrained
  workdir = str(tmp_path)
  full = train.train_and_evaluate(
      helpers.tiny_listops_config(init_from=source),
      str(tmp_path / 'full'))
  train.train_and_evaluate(
      helpers.tiny_listops_config(init_from=source, num_train_steps=2),
      workdir)
  resumed = train.train_and_evaluate(
      helpers.tiny_listops_config(init_from=source), workdir)
  assert resumed['final'] == full['final']


def test_a_different_model_is_refused_naming_the_keys(pretrained, tmp_path):
  source, _ = pretrained
  config = helpers.tiny_listops_config(init_from=source)
  config.model.mlp_dim = 2 * config.model.mlp_dim
  with pytest.raises(ValueError) as e:
    train.train_and_evaluate(config, str(tmp_path / 'w'))
  text = str(e.value)
  assert '\n' not in text
  assert 'its encoder does not fit' in text and 'dense_in/kernel' in text


def test_an_unfinished_source_is_refused(tmp_path):
  with pytest.raises(ValueError, match='no results.json there'):
    train.train_and_evaluate(
        helpers.tiny_listops_config(init_from=str(tmp_path / 'none')),
        str(tmp_path / 'w'))


# ----------------------------- every task and mechanism, at runlocal size

MAIN = ('cst', 'long_short', 'adamra', 'combiner_axial', 'transformer')
# The default test set: the main mechanisms on ListOps, softmax and cst on
# every task; the rest are marked slow (CI runs both sets).
DEFAULT = {('listops', m) for m in MAIN} | {
    (t, m) for t in config_lib.TASKS for m in ('cst', 'transformer')}


def _spt_cases():
  cases = []
  for task in config_lib.TASKS:
    for path in sorted(os.listdir(os.path.join(ROOT, 'configs', task))):
      if path == 'base.py' or not path.endswith('.py'):
        continue
      mark = () if (task, path[:-3]) in DEFAULT else (pytest.mark.slow,)
      cases.append(pytest.param((f'configs/{task}/{path}', None), marks=mark,
                                id=f'{task}/{path[:-3]}'))
  # A registered mechanism without a ListOps file: the base config with its
  # default knobs (`helpers.mechanism_case`).
  for name in sorted(attention.REGISTRY):
    path, overrides = helpers.mechanism_case(name)
    if overrides:
      cases.append(pytest.param((path, name), id=f'listops/base:{name}'))
  return cases


def _step(config, spec, params=None):
  """One jitted training step of `config` on a random batch; the state."""
  model, tx, schedule = steps.build(config, spec)
  batch = steps.example_batch(spec, 4)
  rng = np.random.RandomState(0)
  batch = {k: rng.randint(1, spec['vocab_size'], v.shape).astype(np.int32)
           for k, v in batch.items()}
  for v in batch.values():
    v[0, v.shape[1] // 2:] = 0  # Padding in one row.
  batch['targets'] = np.arange(4, dtype=np.int32) % spec['num_classes']
  state = steps.create_train_state(jax.random.PRNGKey(0), model, tx, batch)
  if params is not None:
    state = state.replace(params=params, opt_state=tx.init(params))
  step = jax.jit(functools.partial(steps.train_step, model=model, tx=tx,
                                   schedule=schedule, grad_accum_steps=1))
  state, m = step(state, batch)
  assert np.isfinite(float(m['loss_sum'])) and float(m['count']) > 0
  return state


def _load(case, arg):
  path, name = case
  config = helpers.load_config(path, arg)
  if name is not None:
    config.model.attention = name
  return config


@pytest.mark.parametrize('case', _spt_cases())
def test_every_config_pretrains_and_fine_tunes_at_runlocal_size(case):
  pre_config = _load(case, 'runlocal,spt')
  assert pre_config.objective == 'masked'
  spec, _ = validation.trace(pre_config)
  pre = _step(pre_config, spec)
  config = _load(case, 'runlocal')
  assert validation.trace(config)[0] == spec
  fresh = _step(config, spec)
  flat = lambda t: {'/'.join(str(k.key) for k in p): v for p, v in
                    jax.tree_util.tree_leaves_with_path(t)}
  source, target = flat(pre.params['encoder']), flat(fresh.params['encoder'])
  source['embed/embedding'] = source['embed/embedding'][:-1]
  assert {k: v.shape for k, v in source.items()} == {
      k: v.shape for k, v in target.items()}
  params = dict(jax.device_get(fresh.params),
                encoder=jax.device_get(pre.params['encoder']))
  params['encoder']['embed']['embedding'] = params['encoder']['embed'][
      'embedding'][:-1]
  _step(config, spec, params)
