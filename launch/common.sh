# Shell helpers shared by the launch scripts (sourced, not run).

# Quotes one argument for a POSIX shell, only where needed.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Joins arguments into one shell-quoted command line.
join_quoted() {
  local out='' arg
  for arg in "$@"; do
    out+="${out:+ }$(quote "$arg")"
  done
  printf '%s\n' "$out"
}

# Prints an error naming the calling script and exits with status 2.
fail() { echo "launch/$(basename "$0"): $*" >&2; exit 2; }

# Runs a command, or prints it shell-quoted when $dry_run is 1.
run() {
  if [[ "${dry_run:-0}" == 1 ]]; then join_quoted "$@"; else "$@"; fi
}

# For a GPU machine with no package index: makes the pure-Python packages
# the project needs beyond JAX/Flax (ml_collections, tensorboardX)
# importable by $python. With INSTALL_WHEELS=auto (the default) and either
# of them missing, or with INSTALL_WHEELS=yes, installs the wheels in
# ${WHEELS:-.wheels} into the private folder ${SITE:-/tmp/lra_msmra_site}
# (no index, no dependencies; launch/README.md says how to fill .wheels).
# Sets `pythonpath` to the PYTHONPATH the project's commands then need:
# [$SITE:]$PWD (call it from the repository root).
setup_wheels() {
  local install="${INSTALL_WHEELS:-auto}" wheels="${WHEELS:-.wheels}"
  local site="${SITE:-/tmp/lra_msmra_site}"
  case "$install" in
    auto) if "$python" -c 'import ml_collections, tensorboardX' 2>/dev/null
          then install=no; else install=yes; fi ;;
    yes|no) ;;
    *) fail "INSTALL_WHEELS=$install: auto, yes or no" ;;
  esac
  pythonpath="$(pwd)"
  if [[ "$install" == yes ]]; then
    local found
    shopt -s nullglob
    found=("$wheels"/*.whl)
    shopt -u nullglob
    [[ ${#found[@]} -gt 0 ]] || fail "no wheels in $wheels (launch/README.md)"
    run "$python" -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target "$site" "${found[@]}"
    pythonpath="$site:$pythonpath"
  fi
}

# Parses `[--dry_run] OUT_DIR [-- FLAGS...]` into the globals dry_run, out
# and extra (the flags after --); $1 names what those flags are for. -h
# prints the calling script's `usage`.
parse_out_args() {
  local what="$1"
  shift
  dry_run=0
  out=''
  extra=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -h|--help) usage; exit 0 ;;
      --dry_run) dry_run=1; shift ;;
      --) shift; extra=("$@"); break ;;
      -*) echo "Unknown option '$1'; put flags for the $what after --." >&2
          usage >&2; exit 2 ;;
      *) [[ -z "$out" ]] || { echo "One OUT_DIR only ('$out', '$1')." >&2;
                              exit 2; }
         out="$1"; shift ;;
    esac
  done
}
