"""How attention is computed, apart from what it computes.

A mechanism (`lra_msmra.attention.<name>`) says what a layer computes: its
parameters, its masks, its numerics. An implementation says how: which
operations, fused kernels or memory layout compute that function on a given
platform. A layer picks one with the contract's field `implementation`
(`lra_msmra.attention.base.Attention`), set from a config as
`--config.model.attention_kw.implementation=...`; each mechanism lists the
ones it has in its class constant `IMPLEMENTATIONS`.

`'xla'` is the mechanism's own code in `lra_msmra.attention`, written with
jax.numpy and lowered by XLA on every platform. It is the default and the
numerical reference: every other implementation is tested against it.
The modules here hold the others and the pieces they share:

* `flash`: one Pallas flash-attention kernel family (forward and
  backward) over a window of sequence keys and a set of extra keys under
  one softmax, with padding flags and in-kernel dropout; lowered with
  Triton on NVIDIA GPUs, Mosaic on TPUs, and interpreted on the CPU.
* `mesh`: fused kernels under data parallelism (one call per batch shard).
* `softmax`: the fused softmax attentions users run on accelerators
  (`'cudnn'`, `'tpu_flash'`).
* `cst`: `'pallas'` of `cst`, its local attention inside slices and its
  global attention among slice embeddings as calls of `flash`.
* `combiner`: `'pallas'` of `combiner` (fixed, axial, mixture), direct
  keys and span summaries under one softmax through `flash`.
* `long_short`: `'pallas'` of `long_short`, its attention core (window
  keys and landmarks under one softmax) as one call of `flash`.
* `safe_softmax`, `combiner_spans`: what the mechanisms' `'xla'` code and
  the kernels' glue share (a softmax over valid entries that is safe for
  rows with none; Combiner's span pooling and grid layout).
* `adamra`: `'pallas'` of `adamra`, its query side (each query's routed
  resolution head against the heads' key summaries) as kernels of its own,
  dispatched per platform as `flash`'s are.
* `sequence_sums`: weighted sums over the sequence in the model's layout
  (Transformer-LS's landmark projections, AdaMRA's key summaries under
  `'pallas'`): a fused multiply-reduce on GPUs, without the transposed
  copies of a matrix product whose batch axis (the heads) is not leading.
"""
