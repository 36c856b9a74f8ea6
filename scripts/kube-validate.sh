#!/usr/bin/env bash
# Checks every Kubernetes manifest in deploy/kubernetes/ against the Kubernetes
# OpenAPI schemas, offline and strict (a field the schema does not know is an
# error), for the oldest and the newest Kubernetes version we support:
#
#   scripts/kube-validate.sh            validate (installs the checker once)
#   scripts/kube-validate.sh FILE…      validate these files instead (tests/deploy.rs
#                                       passes the worker with a patch applied)
#
# The checker is the PyPI package kubernetes-validate, which carries the schemas of
# every Kubernetes release with it; it is installed into .state/kube-validate/ (a
# venv of its own) on first use. kustomization.yaml is kustomize's, not a cluster
# object: tests/deploy.rs checks that it lists every manifest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.state/kube-validate"
PACKAGE="kubernetes-validate==1.37.0"
VERSIONS=(1.30.0 1.37.0)

# One install at a time: tests run in parallel, and two at once would each remove
# the other's half-made venv.
mkdir -p "$ROOT/.state"
exec 9>"$ROOT/.state/kube-validate.lock"
flock 9
if [[ ! -x "$VENV/bin/kubernetes-validate" ]]; then
  echo "kube-validate: installing $PACKAGE into $VENV (once)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  source "$ROOT/scripts/retry.sh"
  retry "kube-validate: pip install" \
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$PACKAGE"
fi
flock -u 9

manifests=("$@")
if [[ ${#manifests[@]} == 0 ]]; then
  for f in "$ROOT"/deploy/kubernetes/*.yaml; do
    [[ "$(basename "$f")" == kustomization.yaml ]] || manifests+=("$f")
  done
fi
for v in "${VERSIONS[@]}"; do
  "$VENV/bin/kubernetes-validate" --strict --kubernetes-version "$v" --quiet "${manifests[@]}"
done
echo "kube-validate: ${#manifests[@]} manifests pass Kubernetes ${VERSIONS[*]} strictly" >&2
