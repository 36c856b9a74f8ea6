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
PACKAGE="kubernetes-validate==1.37.0"
VERSIONS=(1.30.0 1.37.0)

source "$ROOT/scripts/py-tool.sh"
BIN="$(py_tool kube-validate "$PACKAGE")"

manifests=("$@")
if [[ ${#manifests[@]} == 0 ]]; then
  for f in "$ROOT"/deploy/kubernetes/*.yaml; do
    [[ "$(basename "$f")" == kustomization.yaml ]] || manifests+=("$f")
  done
fi
for v in "${VERSIONS[@]}"; do
  "$BIN/kubernetes-validate" --strict --kubernetes-version "$v" --quiet "${manifests[@]}"
done
echo "kube-validate: ${#manifests[@]} manifests pass Kubernetes ${VERSIONS[*]} strictly" >&2
