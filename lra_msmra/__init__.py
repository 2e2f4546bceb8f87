"""lra_msmra: multi-scale multi-range attention on the Long Range Arena."""

__version__ = '0.1.0'


def load_checkpoint(workdir, which='best'):
  """Loads (config, model, params) from a workdir; see lra_msmra.checkpoint."""
  from lra_msmra import checkpoint  # pylint: disable=g-import-not-at-top
  return checkpoint.load_checkpoint(workdir, which)
