#!/usr/bin/env bash
# Installs the system tools the tests use, when missing and when it can (root + apt):
# faketime (the chaos suite skews a real worker's clock with libfaketime).
set -euo pipefail
if [[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]]; then exit 0; fi
if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
  echo "ensure-tools: installing faketime (Debian package)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime) >/dev/null
else
  echo "ensure-tools: please install the 'faketime' package (the clock-skew chaos test needs libfaketime)" >&2
fi
