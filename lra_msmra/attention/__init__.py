"""Attention mechanisms by name, and the one route from settings to layers.

`REGISTRY` maps a config's `model.attention` to a module class following the
contract in `lra_msmra.attention.base`. A new mechanism is one file here and one
line below.

`Mechanism` carries a mechanism's settings (its name, its knobs, i.e.
`config.model.attention_kw`, and the contract fields its layers share) and
makes both the model-level shared module and the layers from them::

  mechanism = Mechanism('cst', {'slice_length': 8},
                        {'num_heads': 4, 'qkv_features': 256})
  mechanism.check()  # the knobs, without building a model.
  # Inside a model's compact method:
  shared = mechanism.shared_inputs(features=256, max_len=4096)
  y = mechanism.layer(name='attention')(x, padding_mask=mask, **shared)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from flax.core import FrozenDict
import flax.linen as nn

from lra_msmra.attention.adamra import AdaMRAAttention
from lra_msmra.attention.base import Attention
from lra_msmra.attention.bigbird import BigBirdAttention
from lra_msmra.attention.combiner import CombinerAttention
from lra_msmra.attention.cst import CompositeSliceAttention
from lra_msmra.attention.linear import LinearAttention
from lra_msmra.attention.linformer import LinformerAttention
from lra_msmra.attention.local import LocalAttention
from lra_msmra.attention.long_short import LongShortAttention
from lra_msmra.attention.longformer import LongformerAttention
from lra_msmra.attention.performer import PerformerAttention
from lra_msmra.attention.reformer import ReformerAttention
from lra_msmra.attention.sinkhorn import SinkhornAttention
from lra_msmra.attention.softmax import SoftmaxAttention
from lra_msmra.attention.sparse import SparseAttention
from lra_msmra.attention.synthesizer import SynthesizerAttention

REGISTRY: dict[str, type[Attention]] = {
    'softmax': SoftmaxAttention,
    'local': LocalAttention,
    'sparse': SparseAttention,
    'longformer': LongformerAttention,
    'bigbird': BigBirdAttention,
    'linformer': LinformerAttention,
    'cst': CompositeSliceAttention,
    'long_short': LongShortAttention,
    'adamra': AdaMRAAttention,
    'combiner': CombinerAttention,
    'linear': LinearAttention,
    'performer': PerformerAttention,
    'synthesizer': SynthesizerAttention,
    'reformer': ReformerAttention,
    'sinkhorn': SinkhornAttention,
}


def get_attention(name: str) -> type[Attention]:
  """Returns the attention class registered as `name`.

  Raises:
    ValueError: `name` is not registered; the message lists the valid names.
  """
  try:
    return REGISTRY[name]
  except KeyError:
    raise ValueError(
        f'Unknown attention {name!r}; valid names: {sorted(REGISTRY)}. '
        'Set config.model.attention to one of them.') from None


@dataclasses.dataclass(frozen=True)
class Mechanism:
  """A mechanism's settings; makes its shared module and its layers.

  Every layer of a model and its shared module (`Attention.shared_module`)
  are built from this one object, so they cannot disagree: the shared
  module reads the fields of a layer built like the others.

  Attributes:
    name: registry name (`REGISTRY`); an unknown name raises ValueError.
    knobs: the mechanism's own fields (`config.model.attention_kw`).
    fields: the contract fields of `base.Attention` that every layer shares
      (`num_heads`, `qkv_features`, `dropout_rate`, `causal`, `dtype`, ...);
      those not given take the class defaults.
    layer_class: the registered class (derived from `name`).
  """
  name: str
  knobs: Mapping[str, Any] = FrozenDict()
  fields: Mapping[str, Any] = FrozenDict()
  layer_class: type[Attention] = dataclasses.field(init=False, repr=False,
                                                   compare=False)

  def __post_init__(self):
    object.__setattr__(self, 'knobs', FrozenDict(self.knobs))
    object.__setattr__(self, 'fields', FrozenDict(self.fields))
    object.__setattr__(self, 'layer_class', get_attention(self.name))

  def layer(self, **fields: Any) -> Attention:
    """A layer: `fields` (e.g. `name`, initialisers) over `self.fields`.

    Built in the calling module's compact method, it belongs to that module.
    Building it checks its `implementation` and knobs (`Attention.
    check_knobs`); a knob the class does not have raises TypeError.
    """
    return self.layer_class(**{**self.fields, **fields}, **self.knobs)

  def check(self) -> None:
    """Checks the settings without building a model (config validation).

    Raises:
      TypeError: a knob the class does not have.
      ValueError: a bad knob value.
      NotImplementedError: a combination the mechanism has no form for.
    """
    self.layer(parent=None)

  def shared_module(self, *, features: int, max_len: int,
                    name: str = 'attention_shared') -> Optional[nn.Module]:
    """The model-level module of the layers (`Attention.shared_module`).

    Args:
      features: model width.
      max_len: longest sequence the model sees (CLS included).
      name: its parameter scope.

    Returns:
      The module, created in the calling module's compact method, or None
      when the mechanism has none with these settings.
    """
    return self.layer(parent=None).shared_module(
        features=features, max_len=max_len, name=name)

  def shared_inputs(self, *, features: int, max_len: int
                    ) -> dict[str, Any]:
    """Creates and calls the shared module: what every layer is called with.

    Called once per forward pass in the model's compact method, before the
    layers; the module's parameters live under `attention_shared`.

    Returns:
      `{'shared': output}`, or `{}` for a mechanism without one.
    """
    module = self.shared_module(features=features, max_len=max_len)
    return {} if module is None else {'shared': module()}


__all__ = ['Attention', 'Mechanism', 'REGISTRY', 'get_attention']
