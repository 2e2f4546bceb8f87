r"""Text with Composite Slice Attention, slices of L = 16 (CST Table 1).

  python -m lra_msmra.main --config configs/text/cst_l16.py:cst \
      --config.data_dir=... --workdir DIR

Identical to `cst.py` except the slice length (see its docstring and
configs/common/cst.py for the options and ablations). With `:cst` the
paper reports 73.60% test accuracy (Table 1, PyTorch port, one V100).
"""

from lra_msmra import config_lib

cst = config_lib.load_sibling(__file__, 'cst')


def get_config(arg=None):
  config = cst.get_config(arg)
  config.model.attention_kw.slice_length = 16
  return config
