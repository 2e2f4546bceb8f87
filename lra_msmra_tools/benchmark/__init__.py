"""Speed and memory benchmarks of the attention mechanisms.

* `python -m lra_msmra_tools.benchmark.attention`: one attention layer, forward and
  forward+backward, over lengths (time, peak memory, FLOPs; optional PyTorch
  comparison).
* `python -m lra_msmra_tools.benchmark.train_step`: training steps of a task config
  (LRA Table 2 style: steps/s and peak memory relative to softmax).
* `python -m lra_msmra_tools.benchmark.device`: the GPU benchmark, every
  implementation of every mechanism and the ListOps `:cst` training steps
  in one bounded run, against the device's roofline and cuDNN's attention
  (`launch/gpu_benchmark.sh`); `device_report` writes its GPU section of
  docs/benchmarks.md.
* `python -m lra_msmra_tools.benchmark.tile_sweep`: on a GPU, the flash
  kernels' tile, warps and stages per head width, timed beside cuDNN, as
  the tile table the kernels read (run first by `launch/gpu_benchmark.sh`).
* `python -m lra_msmra_tools.benchmark.kernel_work`: without a device, what
  the Pallas kernels compute for what they must (kernels per layer, XLA
  ops around them, grid sizes, matmuls per tile, tiles visited and the
  useful share of the scores), into docs/benchmarks.md.

In the first two, every measured point runs in a separate process, so that
its peak memory is its own (see `lra_msmra_tools.benchmark.workers`); the GPU
benchmark runs a process per mechanism. docs/benchmarks.md records the
figures and the commands that produced them.
"""
