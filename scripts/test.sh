#!/usr/bin/env bash
# The project's test command: formatting, lints, and every test against a real
# MongoDB-wire server (the dev server, started if needed; or MONGODB_URI).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

echo "== dev database"
URI="$(scripts/dev-mongo.sh start)"
export MONGODB_URI="$URI"
echo "using $(echo "$URI" | sed -E 's#://([^:@/]+):[^@/]*@#://\1:****@#')"

echo "== mongosh (for the inspection tests)"
scripts/mongosh.sh --install-only

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --all-targets --quiet -- -D warnings

echo "== cargo test"
cargo test --all-targets "$@"
cargo test --doc --quiet
