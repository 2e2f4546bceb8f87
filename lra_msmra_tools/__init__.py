"""Tools that work on the library `lra_msmra` from outside it.

The library never imports this package; the tools import the library.
Importing this package imports nothing (no JAX): each tool sets up what it
needs before JAX starts.

* `lra_msmra_tools.targets`: the TPU slices and NVIDIA GPU hosts a config
  can be compiled for on a CPU (deviceless), and their published figures.
* `lra_msmra_tools.compile`: compiles a config's train and eval steps for
  those targets and reports memory per device, whether it fits, the largest
  batch that fits and a roofline estimate of the step time
  (`python -m lra_msmra_tools.compile --help`, docs/scaling.md).
"""
