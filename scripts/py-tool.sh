# Sourced by the scripts that run a PyPI tool from a venv of its own under .state/
# (kube-validate.sh, schemathesis.sh): `py_tool NAME PACKAGE` installs PACKAGE into
# .state/NAME once (again when PACKAGE changes), under a lock (tests run in parallel, and two installs at once
# would each remove the other's half-made venv), and prints the venv's bin directory.
py_tool() {
  local name="$1" package="$2" root venv
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  venv="$root/.state/$name"
  mkdir -p "$root/.state"
  (
    flock 9
    if [[ "$(cat "$venv/.installed" 2>/dev/null)" != "$package" ]]; then
      echo "$name: installing $package into $venv (once)" >&2
      rm -rf "$venv"
      python3 -m venv "$venv"
      source "$root/scripts/retry.sh"
      retry "$name: pip install" \
        "$venv/bin/pip" install --quiet --disable-pip-version-check "$package" >&2
      echo "$package" > "$venv/.installed"
    fi
  ) 9>"$root/.state/$name.lock"
  echo "$venv/bin"
}
