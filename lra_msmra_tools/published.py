"""Published LRA accuracies, for the results table (`lra_msmra_tools.results`),
and the LRA paper's speed and memory table, for the training-step benchmark
(`LRA_TABLE2`, `lra_msmra_tools.benchmark.train_step`).

Every row carries its source and the protocol it was measured under, because
the papers used three protocols whose numbers are not comparable
(docs/protocol.md §9.2):

* `'lra'`: the official LRA JAX code and configs (Tay et al.): the LRA
  leaderboard and the Combiner paper.
* `'xiong'`: the PyTorch protocol of Xiong et al. (Nyströmformer), followed
  by AdaMRA and, except for Retrieval warm-up, by Transformer-LS.
* `'cst'`: the CST paper's re-tuned PyTorch port.

Accuracies are test accuracies in %. `avg` is the average the source
printed (the mean of the five tasks without Path-X; Transformer-LS prints
the mean of its three tasks). Task keys are the config task names.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

from lra_msmra import config_lib

TASKS = config_lib.TASKS
# The LRA average is over these five (docs/protocol.md §10.1).
AVERAGE_TASKS = TASKS[:5]
TASK_TITLES = {'listops': 'ListOps', 'text': 'Text',
               'retrieval': 'Retrieval', 'image': 'Image',
               'pathfinder': 'Pathfinder', 'pathx': 'Path-X'}
PROTOCOL_TITLES = {'lra': 'LRA official', 'xiong': 'Xiong et al.',
                   'cst': 'CST paper'}


@dataclasses.dataclass(frozen=True)
class Row:
  """One published row.

  Attributes:
    model: the model's name in the source.
    scores: task -> test accuracy in %; absent = not reported.
    avg: the average printed by the source.
    source: where the numbers come from.
    protocol: 'lra', 'xiong' or 'cst'.
    mechanism: our registry name for the same attention, if we have it.
    note: caveats (e.g. a different Pathfinder split).
    pathx: what the source prints for Path-X when not a number ('FAIL' =
      no better than chance, 'NA' = not run).
  """
  model: str
  scores: Mapping[str, float]
  avg: Optional[float]
  source: str
  protocol: str
  mechanism: Optional[str] = None
  note: str = ''
  pathx: str = ''


def _row(model, values, avg, source, protocol, mechanism=None, note='',
         tasks=AVERAGE_TASKS, pathx=''):
  return Row(model, dict(zip(tasks, values)), avg, source, protocol,
             mechanism, note, pathx)


_LRA = 'LRA leaderboard, README as of 8 Nov 2020 (docs/protocol.md §10.1)'
_LRA_EXT = _LRA + ', external entry'

LRA_LEADERBOARD = (
    _row('Local Attention', (15.82, 52.98, 53.39, 41.46, 66.63), 46.06,
         _LRA, 'lra', 'local', pathx='FAIL'),
    _row('Linear Transformer', (16.13, 65.90, 53.09, 42.34, 75.30), 50.55,
         _LRA, 'lra', 'linear', pathx='FAIL'),
    _row('Reformer', (37.27, 56.10, 53.40, 38.07, 68.50), 50.67, _LRA, 'lra',
         'reformer', pathx='FAIL'),
    _row('Sparse Transformer', (17.07, 63.58, 59.59, 44.24, 71.71), 51.24,
         _LRA, 'lra', 'sparse', pathx='FAIL'),
    _row('Sinkhorn Transformer', (33.67, 61.20, 53.83, 41.23, 67.45), 51.29,
         _LRA, 'lra', 'sinkhorn', pathx='FAIL', note='The printed average differs from the '
         'mean of the printed scores (51.48).'),
    _row('Linformer', (35.70, 53.94, 52.27, 38.56, 76.34), 51.36, _LRA,
         'lra', 'linformer', pathx='FAIL'),
    _row('Performer', (18.01, 65.40, 53.82, 42.77, 77.05), 51.41, _LRA,
         'lra', 'performer', pathx='FAIL'),
    _row('Synthesizer', (36.99, 61.68, 54.67, 41.61, 69.45), 52.88, _LRA,
         'lra', 'synthesizer', pathx='FAIL'),
    _row('Longformer', (35.63, 62.85, 56.89, 42.22, 69.71), 53.46, _LRA,
         'lra', 'longformer', pathx='FAIL'),
    _row('Transformer', (36.37, 64.27, 57.46, 42.44, 71.40), 54.39, _LRA,
         'lra', 'softmax', pathx='FAIL'),
    _row('BigBird', (36.05, 64.02, 59.29, 40.83, 74.87), 55.01, _LRA, 'lra',
         'bigbird', pathx='FAIL'),
    _row('IGLOO', (39.23, 82.0, 75.5, 47.0, 67.50), 62.25, _LRA_EXT, 'lra',
         pathx='NA'),
    _row('TLB', (37.05, 81.88, 76.91, 57.51, 79.06), 66.48, _LRA_EXT, 'lra',
         pathx='FAIL'),
)

_COMBINER = 'Combiner paper, Table 5 (docs/mechanisms/combiner.md §10)'
_INTER = ('Pathfinder re-run on pathfinder32_inter for every model; the '
          'other baselines are copied from Tay et al.')
COMBINER_PAPER = (
    _row('Transformer', (36.38, 64.27, 57.46, 42.44, 88.81), 57.87,
         _COMBINER, 'lra', 'softmax', _INTER),
    _row('Combiner-Fixed', (36.65, 64.99, 59.81, 41.67, 88.59), 58.34,
         _COMBINER, 'lra', 'combiner', _INTER + ' Variant: fixed.'),
    _row('Combiner-Axial', (36.15, 64.36, 56.10, 41.33, 88.43), 57.27,
         _COMBINER, 'lra', 'combiner', _INTER + ' Variant: axial.'),
)

_XIONG = ('Nyströmformer paper Table 3, as re-quoted in the AdaMRA paper '
          '(docs/protocol.md §8.4)')
XIONG = (
    _row('Transformer', (37.10, 65.02, 79.35, 38.20, 74.16), 58.77, _XIONG,
         'xiong', 'softmax'),
    _row('Reformer (2 hashes)', (19.05, 64.88, 78.64, 43.29, 69.36), 55.04,
         _XIONG, 'xiong', 'reformer'),
    _row('Linformer (k=256)', (37.25, 55.91, 79.37, 37.84, 67.60), 55.59,
         _XIONG, 'xiong', 'linformer'),
    _row('Performer (r=256)', (18.80, 63.81, 78.62, 37.07, 69.87), 53.63,
         _XIONG, 'xiong', 'performer'),
    _row('Nyströmformer (64 landmarks)', (37.15, 65.52, 79.56, 41.58, 70.94),
         58.95, _XIONG, 'xiong'),
)

_ADAMRA = 'AdaMRA paper, Table 1 (docs/mechanisms/adamra.md §10)'
ADAMRA_PAPER = (
    _row('AdaMRA', (40.40, 68.44, 84.83, 46.00, 75.77), 63.09, _ADAMRA,
         'xiong', 'adamra', 'Rates (1/2, 1/8, 1/32).'),
    _row('BigBird (AdaMRA re-run)', (38.55, 63.90, 81.50, 38.30, 74.89),
         59.43, _ADAMRA, 'xiong', 'bigbird'),
    _row('Linear Transformer (AdaMRA re-run)',
         (37.35, 64.15, 81.10, 38.20, 70.20), 58.20, _ADAMRA, 'xiong',
         'linear'),
)

_LS = ('Transformer-LS paper, Table 1, mean of 4 seeds '
       '(docs/mechanisms/long_short.md §10)')
_LS_NOTE = ('Three tasks only (Image/Pathfinder are in the unavailable '
            'appendix); avg over those three; Retrieval used more warm-up '
            'steps than Xiong et al.')
_LS_TASKS = ('listops', 'text', 'retrieval')
LONG_SHORT_PAPER = (
    _row('Full attention (LS paper)', (37.13, 65.35, 82.30), 61.59, _LS,
         'xiong', 'softmax', _LS_NOTE, _LS_TASKS),
    _row('Transformer-LS (w, r = 8, 32)', (37.50, 66.01, 81.79), 61.77, _LS,
         'xiong', 'long_short', _LS_NOTE, _LS_TASKS),
    _row('Transformer-LS (best)', (38.36, 68.40, 81.95), 62.90, _LS,
         'xiong', 'long_short', _LS_NOTE + ' Per-task best (w, r).',
         _LS_TASKS),
)

_CST = 'CST paper, Table 1 (docs/mechanisms/cst.md §10)'
CST_PAPER = (
    _row('Transformer (CST paper)', (39.92, 64.20, 82.11, 44.25, 74.79),
         61.05, _CST, 'cst', 'softmax'),
    _row('Long-Short Transformer (CST re-run)',
         (38.86, 64.93, 83.88, 47.45, 75.28), 62.08, _CST, 'cst',
         'long_short'),
    _row('Nyströmformer (CST re-run)', (37.50, 65.01, 80.42, 51.13, 69.73),
         60.76, _CST, 'cst'),
    _row('Performer (CST re-run)', (37.25, 64.65, 81.69, 41.73, 72.91),
         59.65, _CST, 'cst', 'performer'),
    _row('CST (L = 8)', (37.45, 77.23, 84.15, 51.27, 76.32), 65.28, _CST,
         'cst', 'cst', 'slice_length=8'),
    _row('CST (L = 16)', (37.90, 73.60, 84.00, 51.39, 76.97), 64.77, _CST,
         'cst', 'cst', 'slice_length=16'),
)

ALL_ROWS = (LRA_LEADERBOARD + COMBINER_PAPER + XIONG + ADAMRA_PAPER
            + LONG_SHORT_PAPER + CST_PAPER)


def rows_for_protocol(protocol: str) -> list[Row]:
  """Every published row measured under `protocol`."""
  return [r for r in ALL_ROWS if r.protocol == protocol]


def reference_rows(protocol: str, mechanisms: set[str]) -> list[Row]:
  """Rows to print beside our runs of `protocol`.

  The protocol's whole baseline table (LRA leaderboard, Xiong et al., or
  the CST paper's own Transformer), whether or not we ran its models, plus
  every paper row of a mechanism we ran under that protocol.
  """
  base = {'lra': LRA_LEADERBOARD, 'xiong': XIONG,
          'cst': CST_PAPER}.get(protocol, ())
  rows = list(base)
  ours = [r for r in rows_for_protocol(protocol)
          if r.mechanism in mechanisms - {'softmax'}]
  # With a paper's mechanism rows comes that paper's own baseline.
  sources = {r.source for r in ours}
  rows += [r for r in rows_for_protocol(protocol)
           if r not in rows and (r in ours or (
               r.source in sources and r.mechanism == 'softmax'))]
  return rows


# ------------------------------------------------- LRA Table 2: speed, memory


@dataclasses.dataclass(frozen=True)
class SpeedRow:
  """One model of the LRA paper's Table 2, at 1K, 2K, 3K and 4K tokens."""
  model: str
  steps_per_s: tuple[float, float, float, float]
  # The speed relative to the Transformer, as the paper prints it beside
  # each figure (rounded to 0.1; the Transformer row has none).
  printed_speedup: Optional[tuple[float, float, float, float]]
  memory_gb: tuple[float, float, float, float]  # Peak, per TPU device.


LRA_TABLE2_SOURCE = (
    'LRA paper (Tay et al., ICLR 2021), Table 2, p. 7: byte-level Text, '
    'batch 32, 4x4 TPU v3 chips, the official JAX code; as transcribed in '
    'github.com/viktor-shcherb/msc_thesis '
    '(references/2021-05-long-range-arena/analysis.md)')
# Thousands of tokens of the table's columns.
LRA_TABLE2_LENGTHS_K = (1, 2, 3, 4)
# Keyed by registry name. Sparse Transformer and Longformer are not in the
# table. The Synthesizer's 3K speed (6.6, equal to the Sinkhorn
# Transformer's) breaks its own trend (5.7 at 2K, 1.9 at 4K); its printed
# ratio agrees with it, so it is kept as published.
LRA_TABLE2 = {
    'softmax': SpeedRow('Transformer', (8.1, 4.9, 2.3, 1.4), None,
                        (0.85, 2.65, 5.51, 9.48)),
    'local': SpeedRow('Local Attention', (9.2, 8.4, 7.4, 7.4),
                      (1.1, 1.7, 3.2, 5.3), (0.42, 0.76, 1.06, 1.37)),
    'linformer': SpeedRow('Linformer', (9.3, 9.1, 8.5, 7.7),
                          (1.2, 1.9, 3.7, 5.5), (0.37, 0.55, 0.99, 0.99)),
    'reformer': SpeedRow('Reformer', (4.4, 2.2, 1.5, 1.1),
                         (0.5, 0.4, 0.7, 0.8), (0.48, 0.99, 1.53, 2.28)),
    'sinkhorn': SpeedRow('Sinkhorn Transformer', (9.1, 7.9, 6.6, 5.3),
                         (1.1, 1.6, 2.9, 3.8), (0.47, 0.83, 1.13, 1.48)),
    'synthesizer': SpeedRow('Synthesizer', (8.7, 5.7, 6.6, 1.9),
                            (1.1, 1.2, 2.9, 1.4), (0.65, 1.98, 4.09, 6.99)),
    'bigbird': SpeedRow('BigBird', (7.4, 3.9, 2.7, 1.5),
                        (0.9, 0.8, 1.2, 1.1), (0.77, 1.49, 2.18, 2.88)),
    'linear': SpeedRow('Linear Transformer', (9.1, 9.3, 8.6, 7.8),
                       (1.1, 1.9, 3.7, 5.6), (0.37, 0.57, 0.80, 1.03)),
    'performer': SpeedRow('Performer', (9.5, 9.4, 8.7, 8.0),
                          (1.2, 1.9, 3.8, 5.7), (0.37, 0.59, 0.82, 1.06)),
}


def lra_table2_ratios(mechanism: str, length: int
                      ) -> Optional[tuple[float, float]]:
  """(speed, memory) of `mechanism` relative to the Transformer in the LRA
  paper's Table 2 at `length` tokens, or None where the table has no such
  model or length (its columns are 1K-4K; 1,024 reads as 1K)."""
  row = LRA_TABLE2.get(mechanism)
  k = round(length / 1000)
  if row is None or k not in LRA_TABLE2_LENGTHS_K or abs(
      length - 1000 * k) > 100:
    return None
  i = LRA_TABLE2_LENGTHS_K.index(k)
  base = LRA_TABLE2['softmax']
  return (row.steps_per_s[i] / base.steps_per_s[i],
          row.memory_gb[i] / base.memory_gb[i])
