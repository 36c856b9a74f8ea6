#!/usr/bin/env bash
# The command shapes the dev servers saw (scripts/devdb/serve.py writes them to
# .state/shapes/, or SLOTPOOL_DEV_SHAPES_DIR), against docs/mongodb.md's audited table.
#
#   scripts/shapes.sh check     fail, listing them, if any shape seen is not audited
#   scripts/shapes.sh seen      every shape seen, with the clients (appName) that sent it
#   scripts/shapes.sh unused    audited rows no dev server saw in this run
#
# A shape is refused by the dev server as it is sent, too (unless the server ran with
# SLOTPOOL_DEV_SHAPES=learn); this check catches a refusal that a retry hid.
set -euo pipefail
export LC_ALL=C
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SLOTPOOL_DEV_SHAPES_DIR:-$ROOT/.state/shapes}"
audited() {
  "$ROOT/.venv/bin/python" -c '
import sys; sys.path.insert(0, sys.argv[1])
from serve import audited_shapes
print("\n".join(sorted(audited_shapes(sys.argv[2]))))' "$ROOT/scripts/devdb" "$ROOT/docs/mongodb.md"
}
seen() {
  cat "$DIR"/seen-*.tsv 2>/dev/null | sort -u | awk -F'\t' '
    { apps[$1] = ($1 in apps) ? apps[$1] "," $2 : $2 }
    END { for (s in apps) print s "\t" apps[s] }' | sort
}
case "${1:-check}" in
  check)
    missing="$(comm -23 <(seen | cut -f1 | sort -u) <(audited | sort -u))"
    if [[ -n "$missing" ]]; then
      echo "shapes: sent, and not in docs/mongodb.md's audited table:" >&2
      echo "$missing" | sed 's/^/  /' >&2
      [[ -n "${SLOTPOOL_SHAPES_SOFT:-}" ]] || exit 1
      echo "shapes: $(seen | wc -l) distinct command shapes sent, $(echo "$missing" | wc -l) not audited (reported, not failed)"
      exit 0
    fi
    echo "shapes: $(seen | wc -l) distinct command shapes sent, every one audited"
    ;;
  seen) seen ;;
  unused) comm -13 <(seen | cut -f1 | sort -u) <(audited | sort -u) ;;
  *) echo "usage: $0 [check|seen|unused]" >&2; exit 2 ;;
esac
