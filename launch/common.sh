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
