#!/usr/bin/env bash
# Runs the GPU benchmark (`python -m lra_msmra_tools.benchmark.device`) on a GPU
# machine in one go, within a time budget, and leaves its JSON, markdown
# report, plot and log in OUT_DIR. For a machine with no package index:
# the pure-Python wheels the project needs beyond JAX/Flax (ml_collections,
# tensorboardX) come from the git-ignored folder .wheels/ (launch/README.md
# says how to fill it), installed into a private folder, not the system.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/gpu_benchmark.sh [--dry_run] OUT_DIR [-- DEVICE_FLAGS...]

Runs, from the repository root:
  [pip install of .wheels/*.whl into $SITE, if ml_collections or
   tensorboardX is missing]
  [the tile sweep, unless TILE_SWEEP=no:
   python3 -m lra_msmra_tools.benchmark.tile_sweep --out OUT_DIR --install \
       --budget_s $TILE_BUDGET_S 2>&1 | tee OUT_DIR/tile_sweep.log]
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=[$SITE:]$PWD \
      timeout $((BUDGET_S + 60)) python3 -m lra_msmra_tools.benchmark.device \
      --out OUT_DIR --budget_s $BUDGET_S [DEVICE_FLAGS...] \
      2>&1 | tee OUT_DIR/device.log

OUT_DIR then holds tile_sweep.json and tile_table.json (the flash kernels'
tiles, warps and stages timed beside cuDNN; installed as
lra_msmra/kernels/tile_table.json, so the benchmark runs with them: commit
that file after the compile matrix passes with it), device.json (every
record, the environment, the device), device.md, device.png and
device.log. Turn the JSON into the GPU section of
docs/benchmarks.md with
  python -m lra_msmra_tools.benchmark.device_report --json OUT_DIR/device.json \
      --docs docs/benchmarks.md --image docs/img/gpu_benchmark.png

Environment:
  BUDGET_S       seconds for the whole benchmark (default 440; it stops
                 starting work in time to write its outputs)
  WHEELS         folder of wheels to install (default: .wheels)
  SITE           folder they are installed into (default:
                 /tmp/lra_msmra_site)
  INSTALL_WHEELS auto (default: only if an import fails), yes or no
  TILE_SWEEP     yes (default) or no: the tile sweep first
  TILE_BUDGET_S  seconds for the tile sweep (default 120)
  PYTHON         interpreter (default: python3)

Options:
  --dry_run      print the commands instead of running them
  -h, --help     this text
EOF
}

# quote, join_quoted, fail, run, setup_wheels, parse_out_args.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_out_args benchmark "$@"

[[ -n "$out" ]] || { usage >&2; fail 'give OUT_DIR'; }
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
budget="${BUDGET_S:-440}"
[[ "$budget" =~ ^[0-9]+$ ]] || fail "BUDGET_S=$budget: give whole seconds"

setup_wheels  # Sets pythonpath.

tile_budget="${TILE_BUDGET_S:-120}"
[[ "$tile_budget" =~ ^[0-9]+$ ]] || fail "TILE_BUDGET_S=$tile_budget: give whole seconds"
[[ "${TILE_SWEEP:-yes}" =~ ^(yes|no)$ ]] || fail "TILE_SWEEP=${TILE_SWEEP}: give yes or no"

run mkdir -p "$out"
if [[ "${TILE_SWEEP:-yes}" == yes ]]; then
  sweep=(env XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
         "PYTHONPATH=$pythonpath${PYTHONPATH:+:$PYTHONPATH}"
         timeout --kill-after=20 "$((tile_budget + 120))"
         "$python" -m lra_msmra_tools.benchmark.tile_sweep --out "$out"
         --install --budget_s "$tile_budget")
  if [[ "$dry_run" == 1 ]]; then
    echo "$(join_quoted "${sweep[@]}") 2>&1 | $(join_quoted tee "$out/tile_sweep.log")"
  else
    "${sweep[@]}" 2>&1 | tee "$out/tile_sweep.log"
  fi
fi
cmd=(env XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
     "PYTHONPATH=$pythonpath${PYTHONPATH:+:$PYTHONPATH}"
     timeout --kill-after=20 "$((budget + 60))"
     "$python" -m lra_msmra_tools.benchmark.device --out "$out"
     --budget_s "$budget" ${extra[@]+"${extra[@]}"})
if [[ "$dry_run" == 1 ]]; then
  echo "$(join_quoted "${cmd[@]}") 2>&1 | $(join_quoted tee "$out/device.log")"
else
  "${cmd[@]}" 2>&1 | tee "$out/device.log"
fi
