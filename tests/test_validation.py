"""Bad configs fail before training, with a message naming the key and the fix.

Each case starts from the tiny ListOps config, changes one thing, and checks
that `validation.validate` (or the trainer's entry, for what depends on the
devices or the data folder) raises with the config key in the message.
"""

import re

from absl import flags
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import pytest

from lra_msmra import main as main_lib
from lra_msmra import train
from lra_msmra import validation
from lra_msmra.kernels import softmax as fused_softmax
from tests import helpers


def _config(**overrides):
  """The tiny ListOps config with dotted-key overrides, types unchecked.

  The config is rebuilt from a dict, so a value of the wrong type gets in as
  it would from a JSON file or a hand-built dict (the command line and
  ConfigDict assignment already refuse most type changes).
  """
  d = helpers.tiny_listops_config().to_dict()
  for key, value in overrides.items():
    target = d
    *path, last = key.split('.')
    for p in path:
      target = target[p]
    target[last] = value
  return ml_collections.ConfigDict(d)


# (overrides, text the error must contain: the key, and often the fix).
CASES = {
    'unknown_key': ({'num_trian_steps': 3}, "unknown ['num_trian_steps']"),
    'unknown_task': ({'task': 'listop'}, 'config.task'),
    'batch_size_zero': ({'batch_size': 0}, 'config.batch_size'),
    'batch_size_bool': ({'batch_size': True}, 'config.batch_size'),
    'batch_size_str': ({'batch_size': '32'}, 'config.batch_size'),
    'seed_negative': ({'seed': -1}, 'config.seed'),
    'num_eval_steps_zero': ({'num_eval_steps': 0}, 'config.num_eval_steps'),
    'grad_accum_not_divisor': ({'grad_accum_steps': 3},
                               'config.grad_accum_steps=3'),
    'data_dir_not_str': ({'data_dir': None}, 'config.data_dir'),
    'pooling': ({'model.pooling': 'cls'}, 'config.model.pooling'),
    'heads_do_not_divide_qkv': ({'model.num_heads': 3},
                                'config.model.num_heads=3'),
    'negative_width': ({'model.emb_dim': -16}, 'config.model.emb_dim'),
    'dropout_one': ({'model.dropout_rate': 1.0}, 'config.model.dropout_rate'),
    'layer_norm_eps_zero': ({'model.layer_norm_eps': 0.0},
                            'config.model.layer_norm_eps'),
    'causal_not_bool': ({'model.causal': 'yes'}, 'config.model.causal'),
    'head_hidden': ({'model.head_hidden': (16, 0)},
                    'config.model.head_hidden'),
    'dtype': ({'model.dtype': 'float16'}, 'config.model.dtype'),
    'causal_with_cls_pooling': ({'model.causal': True},
                                "pooling='MEAN'"),
    'unknown_attention': ({'model.attention': 'softmx'},
                          'config.model.attention'),
    'unknown_attention_knob': (
        {'model.attention': 'cst', 'model.attention_kw': {'slice_len': 4},
         'model.pos_emb': 'none'},
        'config.model.attention_kw'),
    'bad_knob_value': (
        {'model.attention': 'cst', 'model.attention_kw': {'slice_length': 0},
         'model.pos_emb': 'none'},
        'config.model.attention_kw'),
    'unknown_implementation': (
        {'model.attention_kw': {'implementation': 'cuda'}},
        "config.model.attention_kw of 'softmax' (SoftmaxAttention): "
        "SoftmaxAttention has no implementation='cuda'; valid: ('xla', "
        "'cudnn', 'tpu_flash')."),
    'implementation_of_another_mechanism': (
        {'model.attention': 'cst', 'model.pos_emb': 'none',
         'model.attention_kw': {'implementation': 'xla_rows'}},
        "CompositeSliceAttention has no implementation='xla_rows'"),
    'fused_softmax_with_attention_dropout': (
        {'model.attention_kw': {'implementation': 'tpu_flash'}},
        'config.model.attention_dropout_rate=0'),
    'cudnn_in_float32': (
        {'model.attention_kw': {'implementation': 'cudnn'},
         'model.attention_dropout_rate': 0.0},
        "config.model.dtype='bfloat16'"),
    'knob_of_another_variant': (
        {'model.attention': 'combiner',
         'model.attention_kw': {'variant': 'fixed', 'row_length': 4}},
        'config.model.attention_kw'),
    # Checked only when the layer is called: caught by the traced model.
    'call_time_knob_check': (
        {'model.attention': 'long_short',
         'model.attention_kw': {'window_size': -1, 'num_landmarks': 4}},
        'config.model.attention_kw'),
    'knob_for_causal_only': (
        {'model.attention': 'long_short',
         'model.attention_kw': {'window_size': 4, 'num_landmarks': 4,
                                'chunk_size': 4}},
        'config.model.attention_kw'),
    'mechanism_refuses_causal': (
        {'model.attention': 'adamra', 'model.causal': True,
         'model.pooling': 'MEAN'},
        'config.model.causal=True'),
    'knob_refuses_causal': (
        {'model.attention': 'long_short', 'model.causal': True,
         'model.pooling': 'MEAN',
         'model.attention_kw': {'window_size': 4, 'num_landmarks': 4,
                                'conv_kernel_size': 3}},
        'config.model.causal=False'),
    'negative_length': ({'data.max_length': -5}, 'config.data.max_length'),
    'pad_below_length': ({'data.pad_to_length': 16},
                         'config.data.pad_to_length'),
    'generated_longer_than_max_length': (
        {'data.generator.max_length': 64}, 'config.data.max_length=32'),
    'unknown_data_key': ({'data.max_len': 32}, 'config.data'),
    'eps_zero': ({'optimizer.eps': 0.0}, 'config.optimizer.eps'),
    'beta_one': ({'optimizer.b1': 1.0}, 'config.optimizer.b1'),
    'negative_learning_rate': ({'schedule.base_learning_rate': -0.05},
                               'config.schedule.base_learning_rate'),
    'negative_weight_decay': ({'optimizer.weight_decay': -0.1},
                              'config.optimizer.weight_decay'),
    'unknown_schedule_factor': ({'schedule.factors': 'constant*warmup'},
                                'config.schedule.factors'),
    'optimizer_needs_one_cycle': (
        {'optimizer': {'name': 'adam_cycled_b1', 'b1_range': (0.95, 0.85),
                       'b2': 0.999, 'eps': 1e-6, 'weight_decay': 0.0,
                       'grad_clip_norm': 0.0}},
        "config.schedule.name='one_cycle'"),
}


@pytest.mark.parametrize('overrides,expected', CASES.values(), ids=CASES)
def test_bad_config_names_the_key(overrides, expected):
  config = _config(**overrides)
  with pytest.raises(ValueError, match=re.escape(expected)):
    validation.validate(config)


def test_tiny_config_is_valid():
  validation.validate(_config())


def test_implementation_from_the_command_line_reaches_the_layers(
    monkeypatch):
  # The key exists in every config (config_lib.attention_kw), so the command
  # line can override it; validation traces the model, whose softmax layers
  # then call the fused kernel (replaced here by a spy: it cannot run on the
  # CPU).
  values = flag_values_for(['--config.model.attention_kw.implementation='
                            'tpu_flash', '--config.model.dtype=bfloat16',
                            '--config.model.attention_dropout_rate=0'])
  config = values.config
  assert config.model.attention_kw.implementation == 'tpu_flash'
  calls = []

  def spy(q, k, v, padding_mask, *, causal, scale):
    calls.append((q.shape, q.dtype, padding_mask.shape, causal, scale))
    return jnp.zeros_like(v)
  monkeypatch.setattr(fused_softmax, 'tpu_flash_attention', spy)
  validation.validate(config)
  heads, width = config.model.num_heads, config.model.qkv_dim
  assert len(calls) == config.model.num_layers
  shape, dtype, _, causal, scale = calls[0]
  assert (shape[2:], dtype, causal) == ((heads, width // heads),
                                        jnp.bfloat16, False)
  assert scale == pytest.approx((width // heads) ** -0.5)


def flag_values_for(overrides):
  """The tiny ListOps config parsed as the command line does."""
  argv = ['prog', '--config=tests/configs/tiny_listops.py', *overrides]
  values = flags.FlagValues()
  # The override flags are those of the config that `sys_argv` names.
  config_flags.DEFINE_config_file('config', flag_values=values,
                                  lock_config=True, sys_argv=argv)
  values(argv)
  return values


def test_length_that_a_mechanism_cannot_use_fails_in_validation():
  """An AdaMRA rate that is not 1/k fails at validation, not after data."""
  config = _config(**{'model.attention': 'adamra',
                      'model.attention_kw': {'compression_rates': (1, 0.3)}})
  with pytest.raises(ValueError, match='config.model.attention_kw.*1/k'):
    validation.validate(config)


@pytest.mark.parametrize('overrides,expected', [
    # 8 fake devices (tests/conftest.py).
    ({'batch_size': 12}, 'config.batch_size=12 is not divisible by 8 '
                         'devices; use a multiple of 8'),
    ({'batch_size': 8, 'grad_accum_steps': 2},
     '8 devices x 2 gradient-accumulation steps'),
    ({'eval_batch_size': 4}, 'config.eval_batch_size=4'),
], ids=['batch', 'accumulation', 'eval_batch'])
def test_batch_sizes_must_split_over_devices(tmp_path, overrides, expected):
  with pytest.raises(ValueError, match=re.escape(expected)):
    train.train_and_evaluate(_config(**overrides), str(tmp_path))


def test_missing_data_dir_names_the_expected_layout(tmp_path):
  config = _config(data_dir=str(tmp_path / 'nowhere'), **{'data.generate': False})
  with pytest.raises(FileNotFoundError,
                     match=r'config\.data_dir.*basic_\{train,val,test\}\.tsv'):
    train.train_and_evaluate(config, str(tmp_path / 'run'))


def test_data_dir_of_another_task_names_the_expected_layout(tmp_path):
  # E.g. the Retrieval folder of the LRA release given to ListOps.
  (tmp_path / 'new_aan_pairs.train.tsv').write_text('1\ta\tb\tx\ty\n')
  config = _config(data_dir=str(tmp_path), **{'data.generate': False})
  with pytest.raises(FileNotFoundError,
                     match=r'basic_train\.tsv not found.*listops-1000'):
    train.train_and_evaluate(config, str(tmp_path / 'run'))


@pytest.mark.parametrize('flags,expected', [
    ((False, 'localhost:1234', 2, None), 'give all three'),
    ((True, 'localhost:1234', 2, 0), '--distributed'),
    ((False, 'localhost', 2, 0), '--coordinator_address'),
    ((False, 'localhost:1234', 0, 0), '--num_processes'),
    ((False, 'localhost:1234', 2, 2), '--process_id=2 must be in 0..1'),
], ids=['partial', 'both_modes', 'no_port', 'no_processes', 'bad_id'])
def test_multi_process_flags_are_checked(flags, expected):
  with pytest.raises(main_lib.app.UsageError, match=re.escape(expected)):
    main_lib.check_distributed_flags(*flags)


def test_multi_process_flags_accepted():
  assert main_lib.check_distributed_flags(False, '10.0.0.2:1234', 4, 3)
  assert not main_lib.check_distributed_flags(True, None, None, None)


@pytest.mark.parametrize('task', ['listops', 'text', 'retrieval', 'image',
                                  'pathfinder', 'pathx'])
def test_full_config_without_data_stops_with_the_prepare_command(
    task, tmp_path):
  config = helpers.load_config(f'configs/{task}/transformer.py')
  with pytest.raises(ValueError, match='python -m lra_msmra.data.prepare'):
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  # Nothing was written: the run stopped before anything ran.
  assert not (tmp_path / 'run').exists()
