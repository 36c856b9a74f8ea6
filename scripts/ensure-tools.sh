#!/usr/bin/env bash
# Installs the system tools the tests use, when missing and when it can (root + apt):
# - faketime: the chaos suite skews a real worker's clock with libfaketime (required);
# - promtool (Debian's `prometheus`): checks and unit-tests deploy/prometheus/alerts.yml
#   (best effort: without it tests/deploy.rs checks the rules' metric names only);
# - chromium and chromium-driver: tests/browser.rs drives the dashboard in a real
#   headless Chromium (required);
# - groff, zsh and fish: tests/manual.rs renders every manual page with groff and
#   completes every command in bash, zsh and fish (required);
# - openssl: tests/topologies.rs makes a CA and a server certificate for the dev
#   server's TLS (required).
set -euo pipefail
missing=()
[[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]] || missing+=(faketime)
command -v promtool >/dev/null || missing+=(prometheus)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
[[ -x /usr/bin/chromedriver ]] || missing+=(chromium-driver)
command -v groff >/dev/null || missing+=(groff-base)
command -v zsh >/dev/null || missing+=(zsh)
command -v fish >/dev/null || missing+=(fish)
command -v openssl >/dev/null || missing+=(openssl)
if [[ ${#missing[@]} == 0 ]]; then exit 0; fi
if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
  echo "ensure-tools: installing ${missing[*]} (Debian packages)" >&2
  apt-get update -qq >/dev/null || true
  for pkg in "${missing[@]}"; do
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null; then
      echo "ensure-tools: could not install $pkg" >&2
    fi
  done
  # The package may start a Prometheus server; the tests need only promtool.
  if command -v service >/dev/null; then service prometheus stop >/dev/null 2>&1 || true; fi
  pkill -x prometheus >/dev/null 2>&1 || true
else
  echo "ensure-tools: please install ${missing[*]} (faketime for the clock-skew chaos test; prometheus for promtool; chromium and chromium-driver for the browser tests; groff-base, zsh and fish for the manual and completion tests; openssl for the TLS test)" >&2
fi
