# Sourced by the scripts that fetch packages (npm, PyPI): `retry WHAT CMD…` runs CMD
# up to three times, 5 s and then 10 s apart, saying so on stderr. A registry that
# drops one request must not turn a CI run red; one that is down still fails it,
# with the last attempt's own error.
retry() {
  local what="$1" attempt
  shift
  for attempt in 1 2 3; do
    if "$@"; then
      return 0
    fi
    if [[ $attempt == 3 ]]; then
      echo "$what: failed 3 times; the last attempt's errors are above" >&2
      return 1
    fi
    echo "$what: failed (attempt $attempt of 3); trying again in $((attempt * 5)) s" >&2
    sleep $((attempt * 5))
  done
}
