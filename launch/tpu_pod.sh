#!/usr/bin/env bash
# Creates a Cloud TPU VM slice and runs `python -m lra_msmra.main` on every
# worker with the same command (`--distributed`: JAX finds its peers).
#
# Data and runs live in a Cloud Storage bucket mounted with gcsfuse at the
# same path on every worker: every host reads the task files there, and the
# checkpoints, which all hosts must see, are written there. See
# docs/scaling.md.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/tpu_pod.sh [--dry_run] STEP... [-- MAIN_FLAGS...]

Steps (in the order given):
  create   gcloud compute tpus tpu-vm create (the slice)
  setup    copy the committed code (git archive HEAD) to every worker,
           install requirements.txt (and requirements-tfds.txt for a
           Text or Image CONFIG) and jax[tpu], mount the bucket
  run      on every worker: python3 -m lra_msmra.main --config=$CONFIG \
             --workdir=$MOUNT/$RUN_SUBDIR \
             [--config.data_dir=$MOUNT/$DATA_SUBDIR] --distributed \
             [MAIN_FLAGS...]
  delete   gcloud compute tpus tpu-vm delete
  all      create setup run

Environment:
  TPU_NAME          name of the slice (required)
  ZONE              e.g. us-central2-b (required)
  PROJECT           Google Cloud project (default: gcloud's)
  ACCELERATOR_TYPE  e.g. v4-32 = 4 hosts (default: v4-32)
  RUNTIME_VERSION   TPU VM image (default: tpu-ubuntu2204-base)
  SPOT=1            create a Spot slice (may be preempted; rerun `run`
                    after recreating it and the run resumes)
  BUCKET            gs://NAME holding data and runs (required for setup, run)
  MOUNT             where the bucket is mounted on the workers
                    (default: /mnt/lra)
  CONFIG            config file with options, e.g. configs/listops/cst.py
                    (required for run)
  DATA_SUBDIR       task data inside the bucket, e.g.
                    lra_release/lra_release/listops-1000 (default: none,
                    the config's generated or mock data)
  RUN_SUBDIR        run folder inside the bucket (default: runs/$TPU_NAME)
  JAX_VERSION       jax[tpu] version (default: the jax pin of
                    requirements.txt)

Options:
  --dry_run         print the commands instead of running them
  -h, --help        this text

Example:
  TPU_NAME=lra ZONE=us-central2-b BUCKET=gs://my-lra \
      CONFIG=configs/listops/cst.py DATA_SUBDIR=lra_release/listops-1000 \
      launch/tpu_pod.sh all -- --config.model.dtype=bfloat16
EOF
}

dry_run=0
steps=()
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry_run) dry_run=1; shift ;;
    create|setup|run|delete) steps+=("$1"); shift ;;
    all) steps+=(create setup run); shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "Unknown argument '$1'." >&2; usage >&2; exit 2 ;;
  esac
done
[[ ${#steps[@]} -gt 0 ]] || { usage >&2; exit 2; }

# quote, join_quoted, fail.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$(dirname "$0")/.."
[[ -n "${TPU_NAME:-}" ]] || fail 'set TPU_NAME, the name of the slice'
[[ -n "${ZONE:-}" ]] || fail 'set ZONE, e.g. ZONE=us-central2-b'
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v4-32}"
RUNTIME_VERSION="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
MOUNT="${MOUNT:-/mnt/lra}"
RUN_SUBDIR="${RUN_SUBDIR:-runs/$TPU_NAME}"
JAX_VERSION="${JAX_VERSION:-$(sed -n 's/^jax==//p' requirements.txt)}"
ARCHIVE=/tmp/lra_msmra_code.tar.gz

where=("--zone=$ZONE")
if [[ -n "${PROJECT:-}" ]]; then
  where+=("--project=$PROJECT")
fi

# Prints a command (quoted so that it can be pasted) or runs it.
do_cmd() {
  if [[ "$dry_run" == 1 ]]; then
    join_quoted "$@"
  else
    "$@"
  fi
}

# Runs a shell command on every worker of the slice.
on_all_workers() {
  do_cmd gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${where[@]}" \
    --worker=all "--command=$1"
}

need_bucket() {
  [[ "${BUCKET:-}" == gs://* ]] || fail 'set BUCKET=gs://NAME (data and runs)'
}

step_create() {
  local spot=()
  if [[ "${SPOT:-0}" == 1 ]]; then
    spot=(--spot)
  fi
  do_cmd gcloud compute tpus tpu-vm create "$TPU_NAME" "${where[@]}" \
    "--accelerator-type=$ACCELERATOR_TYPE" "--version=$RUNTIME_VERSION" \
    ${spot[@]+"${spot[@]}"}
}

step_setup() {
  need_bucket
  local bucket="${BUCKET#gs://}"
  bucket="${bucket%/}"
  # The committed code only: what runs on the pod is what git knows.
  do_cmd git archive --format=tar.gz -o "$ARCHIVE" HEAD
  do_cmd gcloud compute tpus tpu-vm scp "$ARCHIVE" "$TPU_NAME:$ARCHIVE" \
    "${where[@]}" --worker=all
  local install="set -e; mkdir -p ~/lra_msmra"
  install+="; tar xzf $ARCHIVE -C ~/lra_msmra; cd ~/lra_msmra"
  # Text and Image read their real data with TFDS: the optional extra.
  local tfds=""
  case "${CONFIG:-}" in
    configs/text/*|configs/image/*) tfds=" -r requirements-tfds.txt" ;;
  esac
  install+="; python3 -m pip install -r requirements.txt$tfds -e ."
  install+="; python3 -m pip install 'jax[tpu]==$JAX_VERSION'"
  on_all_workers "$install"
  # gcsfuse from Google's apt repository; --rename-dir-limit lets orbax
  # finalise a checkpoint by renaming its temporary folder.
  local keyring=/usr/share/keyrings/cloud.google.asc
  local repo=https://packages.cloud.google.com/apt
  local mount="set -e; if ! command -v gcsfuse >/dev/null; then"
  mount+=" curl -fsSL $repo/doc/apt-key.gpg | sudo tee $keyring >/dev/null"
  mount+="; echo \"deb [signed-by=$keyring] $repo gcsfuse-\$(lsb_release -cs)"
  mount+=" main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list"
  mount+="; sudo apt-get update; sudo apt-get install -y gcsfuse; fi"
  mount+="; sudo mkdir -p $MOUNT; sudo chown \$USER $MOUNT"
  mount+="; mountpoint -q $MOUNT"
  mount+=" || gcsfuse --implicit-dirs --rename-dir-limit=1000000 $bucket $MOUNT"
  on_all_workers "$mount"
}

step_run() {
  need_bucket
  [[ -n "${CONFIG:-}" ]] \
    || fail 'set CONFIG, e.g. CONFIG=configs/listops/cst.py'
  [[ -f "${CONFIG%%:*}" ]] \
    || fail "CONFIG=$CONFIG: no file ${CONFIG%%:*} in $(pwd)"
  local main=(python3 -m lra_msmra.main "--config=$CONFIG"
              "--workdir=$MOUNT/$RUN_SUBDIR")
  if [[ -n "${DATA_SUBDIR:-}" ]]; then
    main+=("--config.data_dir=$MOUNT/$DATA_SUBDIR")
  fi
  main+=(--distributed ${extra[@]+"${extra[@]}"})
  local quoted
  quoted="$(join_quoted "${main[@]}")"
  # The same command on every worker; exec so that a preemption's SIGTERM
  # reaches the trainer, which checkpoints before exiting.
  on_all_workers "cd ~/lra_msmra && exec $quoted"
}

step_delete() {
  do_cmd gcloud compute tpus tpu-vm delete "$TPU_NAME" "${where[@]}" --quiet
}

for step in "${steps[@]}"; do
  "step_$step"
done
