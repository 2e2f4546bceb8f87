#!/usr/bin/env bash
# Runs `python -m lra_msmra.main` on one GPU host or on each of several.
#
# One host: JAX uses every visible GPU (CUDA_VISIBLE_DEVICES picks them);
# batch sizes in the config are global and must divide by the GPU count.
# Several hosts: run this script on every host with the same settings and
# PROCESS_ID=0..N-1; host 0 is the coordinator. Under SLURM, SLURM=1 lets
# JAX read the cluster from SLURM's variables instead (`srun` this script).
# See docs/scaling.md.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/multi_gpu.sh [--dry_run] [-- MAIN_FLAGS...]

Runs, from the repository root:
  python -m lra_msmra.main --config=$CONFIG --workdir=$WORKDIR \
      [--config.data_dir=$DATA_DIR] [multi-host flags] [MAIN_FLAGS...]

Environment:
  CONFIG         config file with options, e.g. configs/listops/cst.py:xiong
                 (required)
  WORKDIR        run folder; with several hosts it must be the same folder
                 on a file system every host sees (NFS, a mounted bucket)
                 (required)
  DATA_DIR       the task's data folder (default: the config's data_dir)
  PYTHON         interpreter (default: python)
Several hosts, explicit (set all three on every host):
  COORDINATOR    HOST:PORT of process 0, reachable from every host
  NUM_PROCESSES  number of hosts
  PROCESS_ID     this host's index, 0..NUM_PROCESSES-1
Several hosts under SLURM:
  SLURM=1        pass --distributed (one task per host:
                 srun --ntasks-per-node=1)

Options:
  --dry_run      print the command instead of running it
  -h, --help     this text

Examples:
  CONFIG=configs/text/cst.py WORKDIR=/tmp/text_cst \
      DATA_DIR=/data/imdb launch/multi_gpu.sh -- --config.model.dtype=bfloat16
  # On host i of 2 (i = 0, 1):
  CONFIG=configs/listops/cst.py WORKDIR=/nfs/runs/listops_cst \
      COORDINATOR=10.0.0.2:12345 NUM_PROCESSES=2 PROCESS_ID=$i \
      launch/multi_gpu.sh
EOF
}

dry_run=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry_run) dry_run=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "Unknown argument '$1'; put flags for lra_msmra.main after --." >&2
       usage >&2; exit 2 ;;
  esac
done

# quote, join_quoted, fail.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ -n "${CONFIG:-}" ]] || fail 'set CONFIG, e.g. CONFIG=configs/listops/cst.py'
[[ -n "${WORKDIR:-}" ]] || fail 'set WORKDIR, the run folder'
cd "$(dirname "$0")/.."
[[ -f "${CONFIG%%:*}" ]] \
  || fail "CONFIG=$CONFIG: no file ${CONFIG%%:*} in $(pwd)"

cmd=("${PYTHON:-python}" -m lra_msmra.main "--config=$CONFIG"
     "--workdir=$WORKDIR")
if [[ -n "${DATA_DIR:-}" ]]; then
  cmd+=("--config.data_dir=$DATA_DIR")
fi
explicit="${COORDINATOR:-}${NUM_PROCESSES:-}${PROCESS_ID:-}"
if [[ "${SLURM:-0}" == 1 ]]; then
  [[ -z "$explicit" ]] \
    || fail 'SLURM=1 and COORDINATOR/NUM_PROCESSES/PROCESS_ID exclude each other'
  cmd+=(--distributed)
elif [[ -n "$explicit" ]]; then
  [[ -n "${COORDINATOR:-}" && -n "${NUM_PROCESSES:-}" \
     && -n "${PROCESS_ID:-}" ]] \
    || fail 'set all of COORDINATOR, NUM_PROCESSES and PROCESS_ID, or none'
  cmd+=("--coordinator_address=$COORDINATOR" "--num_processes=$NUM_PROCESSES"
        "--process_id=$PROCESS_ID")
fi
cmd+=(${extra[@]+"${extra[@]}"})

if [[ "$dry_run" == 1 ]]; then
  join_quoted "${cmd[@]}"
else
  # exec: SIGTERM from a scheduler reaches the trainer, which checkpoints.
  exec "${cmd[@]}"
fi
