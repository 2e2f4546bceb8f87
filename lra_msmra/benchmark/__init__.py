"""Speed and memory benchmarks of the attention mechanisms.

* `python -m lra_msmra.benchmark.attention`: one attention layer, forward and
  forward+backward, over lengths (time, peak memory, FLOPs; optional PyTorch
  comparison).
* `python -m lra_msmra.benchmark.train_step`: training steps of a task config
  (LRA Table 2 style: steps/s and peak memory relative to softmax).

Every measured point runs in a separate process, so that its peak memory is
its own (see `lra_msmra.benchmark.workers`). docs/benchmarks.md records the
figures and the commands that produced them.
"""
