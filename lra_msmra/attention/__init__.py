"""Attention mechanisms by name.

`REGISTRY` maps a config's `model.attention` to a module class following the
contract in `lra_msmra.attention.base`. A new mechanism is one file here and one
line below.
"""

from __future__ import annotations

from lra_msmra.attention.adamra import AdaMRAAttention
from lra_msmra.attention.base import Attention
from lra_msmra.attention.bigbird import BigBirdAttention
from lra_msmra.attention.linformer import LinformerAttention
from lra_msmra.attention.local import LocalAttention
from lra_msmra.attention.longformer import LongformerAttention
from lra_msmra.attention.sparse import SparseAttention
from lra_msmra.attention.combiner import CombinerAttention
from lra_msmra.attention.cst import CompositeSliceAttention
from lra_msmra.attention.linear import LinearAttention
from lra_msmra.attention.long_short import LongShortAttention
from lra_msmra.attention.performer import PerformerAttention
from lra_msmra.attention.reformer import ReformerAttention
from lra_msmra.attention.sinkhorn import SinkhornAttention
from lra_msmra.attention.softmax import SoftmaxAttention
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


__all__ = ['Attention', 'REGISTRY', 'get_attention']
