#!/usr/bin/env bash
# One stretch of a suite (launch/suite.py) on a GPU machine that starts bare
# and is lent for a few minutes at a time: install the wheels, generate the
# ListOps or Pathfinder data, unpack the runs carried in from the last stretch (.carry/),
# run the suite until a deadline (the runs still going checkpoint and stop),
# then pack what the runs need to resume into OUT_DIR (launch/carry.py), to
# be carried into the next stretch. launch/README.md describes the loop.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/gpu_stretch.sh [--dry_run] OUT_DIR [-- SUITE_FLAGS...]

Runs, from the repository root, within BUDGET_S seconds in all:
  [pip install of .wheels/*.whl into $SITE, if ml_collections or
   tensorboardX is missing]
  [python3 -m lra_msmra.data.prepare --generate_listops --out $DATA
   when --tasks is listops only, or
   python3 -m lra_msmra.data.prepare --generate_pathfinder --out $DATA \
      --pathfinder_sets 32/DIFFICULTY --workers <cores>
   when --tasks is pathfinder only (DIFFICULTY: hard, LRA's, unless an
   --override data.difficulty=... says otherwise), and SUITE_FLAGS give no
   --data_dir; the suite then gets --data_dir $DATA]
  [python3 launch/carry.py unpack $CARRY $RUNS --held_stubs, if
   $CARRY/carry.json exists]
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=[$SITE:]$PWD \
      timeout --kill-after=5 <STOP + STOP_GRACE_S + 20> \
      python3 launch/suite.py --root $RUNS --jobs $JOBS --stop_after STOP \
      --stop_grace_s $STOP_GRACE_S [--data_dir $DATA] SUITE_FLAGS...
  (STOP = BUDGET_S - RESERVE_S - the seconds spent before the suite)
  python3 launch/carry.py pack $RUNS OUT_DIR --part_mib $PART_MIB \
      --max_files 7
all printed into OUT_DIR/stretch.log as well. OUT_DIR then holds at most 8
files: carry.json, carry.tar.gz.000 ... (at most 6 parts: 90 MiB) and
stretch.log, which holds the results table (the suite prints it). Exit
status: the suite's (0 all finished, 3 runs unfinished: run the next
stretch, 1 a run failed), or 2 when a step before the suite, or the
packing, failed.

Between stretches, on the workstation (launch/README.md):
  python3 launch/carry.py unpack OUT_DIR runs/NAME        # the runs so far
  python3 launch/carry.py pack runs/NAME .carry --max_mib 63   # carry-in
and carry .wheels and .carry with the working tree.

Environment:
  BUDGET_S       seconds for the whole stretch (default 540)
  RESERVE_S      of which kept after the suite's deadline for the runs to
                 save, the results table and the packing (default 75)
  STOP_GRACE_S   seconds a run has to exit after SIGTERM (default 30)
  JOBS           runs side by side (default 2: what the carry-in holds of
                 ListOps `:cst` runs, launch/README.md)
  RUNS           the suite's --root (default runs/stretch)
  CARRY          folder of carried-in state (default .carry)
  DATA           folder for the generated data; keep it the same in
                 every stretch, runs record it (default runs/<task>_data,
                 relative to the repository root, where the runs run)
  PART_MIB       largest part packed (default 15)
  WHEELS, SITE, INSTALL_WHEELS, PYTHON  as in launch/gpu_benchmark.sh

Options:
  --dry_run      print the commands instead of running them
  -h, --help     this text
EOF
}

# quote, join_quoted, fail, run, setup_wheels, parse_out_args.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_out_args suite "$@"

[[ -n "$out" ]] || { usage >&2; fail 'give OUT_DIR'; }
[[ "$out" == /* ]] || out="$PWD/$out"
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
budget="${BUDGET_S:-540}"
reserve="${RESERVE_S:-75}"
grace="${STOP_GRACE_S:-30}"
jobs="${JOBS:-2}"
runs="${RUNS:-runs/stretch}"
carry="${CARRY:-.carry}"
part_mib="${PART_MIB:-15}"
for pair in BUDGET_S:budget RESERVE_S:reserve STOP_GRACE_S:grace JOBS:jobs; do
  var="${pair#*:}"
  value="${!var}"
  [[ "${value}" =~ ^[0-9]+$ ]] || fail "${pair%%:*}=$value: give whole seconds \
(JOBS: a whole number)"
done
(( jobs > 0 )) || fail 'JOBS must be at least 1'
(( budget > reserve )) || fail "BUDGET_S=$budget must exceed RESERVE_S=$reserve"

# What the suite flags say about the data; the flags this script sets.
tasks='listops,text,retrieval,image,pathfinder'  # launch/suite.py's default.
data_given=0
generated=0
difficulty=hard  # configs/pathfinder/base.py's data.difficulty.
for ((i = 0; i < ${#extra[@]}; i++)); do
  arg="${extra[$i]}"
  value="${extra[$((i + 1))]:-}"
  [[ "$arg" == *=* ]] && value="${arg#*=}"
  case "$arg" in
    --tasks|--tasks=*) tasks="$value" ;;
    --data_dir|--data_dir=*) data_given=1 ;;
    --options|--options=*) [[ ",$value," == *,runlocal,* ]] && generated=1 ;;
    --override|--override=*)
      [[ "${value// /}" == data.generate=True ]] && generated=1
      [[ "${value// /}" == data.difficulty=* ]] && difficulty="${value#*=}"
      ;;
    --root|--root=*|--jobs|--jobs=*|--stop_after|--stop_after=*|\
    --stop_grace_s|--stop_grace_s=*)
      fail "${arg%%=*} is set by this script (RUNS, JOBS, BUDGET_S," \
        "STOP_GRACE_S)" ;;
  esac
done
generate=0
if [[ "$data_given" == 0 && "$generated" == 0 ]]; then
  case "$tasks" in
    listops) prepare=(--generate_listops) ;;
    pathfinder)
      [[ "$difficulty" =~ ^(easy|intermediate|hard)$ ]] ||
        fail "data.difficulty=$difficulty: easy, intermediate or hard"
      prepare=(--generate_pathfinder --pathfinder_sets "32/$difficulty"
               --workers "$(nproc 2>/dev/null || echo 1)") ;;
    *) fail "--tasks $tasks: ListOps or Pathfinder data is generated here \
(one task at a time); give --data_dir for other tasks" ;;
  esac
  generate=1
fi
data="${DATA:-runs/${tasks}_data}"

stretch() {
  set -e
  setup_wheels  # Sets pythonpath.
  local pyenv=(env "PYTHONPATH=$pythonpath${PYTHONPATH:+:$PYTHONPATH}"
               PYTHONUNBUFFERED=1)
  local suite_data=()
  if [[ "$generate" == 1 ]]; then
    run "${pyenv[@]}" "$python" -m lra_msmra.data.prepare "${prepare[@]}" \
      --out "$data" || fail "generating the $tasks data failed"
    suite_data=(--data_dir "$data")
  fi
  if [[ -f "$carry/carry.json" ]]; then
    run "$python" launch/carry.py unpack "$carry" "$runs" --held_stubs ||
      fail "unpacking $carry failed; nothing was trained"
  fi
  local spent=$SECONDS
  [[ "$dry_run" == 1 ]] && spent=0
  local stop=$((budget - reserve - spent))
  (( stop > 0 )) || fail "no time left for the suite ($spent s spent)"
  local status=0
  run "${pyenv[@]}" XLA_PYTHON_CLIENT_PREALLOCATE=false \
    timeout --kill-after=5 "$((stop + grace + 20))" \
    "$python" launch/suite.py --root "$runs" --jobs "$jobs" \
    --stop_after "$stop" --stop_grace_s "$grace" \
    ${suite_data[@]+"${suite_data[@]}"} ${extra[@]+"${extra[@]}"} ||
    status=$?
  run "$python" launch/carry.py pack "$runs" "$out" --part_mib "$part_mib" \
    --max_files 7 || fail 'packing the runs failed'
  if [[ "$dry_run" == 0 ]]; then
    echo "stretch: suite exit status $status (0 all finished, 3 unfinished:" \
      "run another stretch, 1 failed) after $SECONDS s"
  fi
  return "$status"
}

run mkdir -p "$out"
if [[ "$dry_run" == 1 ]]; then
  stretch
else
  set +e
  stretch 2>&1 | tee "$out/stretch.log"
  status=${PIPESTATUS[0]}
  set -e
  ls -l "$out" | tee -a "$out/stretch.log"
  exit "$status"
fi
