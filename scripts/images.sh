#!/usr/bin/env bash
# Container images without a container registry, from the package registries only:
#
#   slotpool-base:HASH    Debian bookworm (mmdebstrap, minbase) with tini,
#                         ca-certificates, iproute2 (tc netem for the latency tests)
#                         and python3-venv (for the dev database); cached by a hash
#                         of its inputs, so it is built once per machine.
#   slotpool:local        the host's release binary on that base, with the runtime
#                         layout of the Dockerfile: tini as PID 1, user 10001,
#                         /opt/robots, port 7700, `worker` by default.
#   slotpool-devdb:local  the dev database (SecantusDB, from wheels pip downloads on
#                         the host) on the same base, serving port 27017, data in /data,
#                         behind mongod's rules (scripts/devdb, as dev-mongo.sh runs it;
#                         SLOTPOOL_DEV_SHAPES in its environment as there).
#
#   scripts/images.sh            install and start the engine if needed, build all three
#   scripts/images.sh engine     only make sure a Docker engine answers
#   SLOTPOOL_IMAGE_BINARY=target/debug/slotpool scripts/images.sh
#                                slotpool:local from a binary already built, not the
#                                release build (the test script does this: the tests
#                                check behaviour, and a release build from scratch is
#                                six and a half minutes of a CI run). The image is
#                                labelled `slotpool.build=given`; the benchmarks
#                                refuse it and ask for the release one.
#
# The multi-stage Dockerfile stays the way to build with a registry; both give the
# same runtime layout (tests/containers.rs checks it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="$ROOT/.state/images"
BASE_PACKAGES="tini,ca-certificates,iproute2,python3-venv"
SECANTUS="SecantusDB==0.7.0b3"
# Raise when the base's recipe changes, so a cached base is rebuilt.
BASE_RECIPE=1

say() { echo "images: $*" >&2; }

# A Docker engine that answers, installed (Debian's docker.io, mmdebstrap) and
# started (dockerd, as root) when it is not there yet.
engine() {
  mkdir -p "$STATE"
  if ! command -v dockerd >/dev/null || ! command -v mmdebstrap >/dev/null \
      || ! command -v docker >/dev/null || ! command -v docker-compose >/dev/null; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
      say "installing docker.io, docker-compose and mmdebstrap (Debian packages)"
      apt-get update -qq >/dev/null || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker.io docker-compose mmdebstrap >/dev/null
    else
      say "needs Debian's docker.io, docker-compose and mmdebstrap: run as root, or install them"
      exit 3
    fi
  fi
  if docker info >/dev/null 2>&1; then return; fi
  if [[ "$(id -u)" != 0 ]]; then
    say "no Docker engine answers, and only root can start one here (dockerd)"
    exit 3
  fi
  say "starting dockerd (log: $STATE/dockerd.log)"
  setsid nohup dockerd >>"$STATE/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    if docker info >/dev/null 2>&1; then return; fi
    sleep 0.5
  done
  say "dockerd did not answer within 60 s; this machine may not be able to run containers. Last lines of its log:"
  tail -n 20 "$STATE/dockerd.log" >&2
  exit 3
}

# The base image's tag, built if missing.
base() {
  local hash tag
  hash="$(printf 'bookworm minbase %s recipe %s\n' "$BASE_PACKAGES" "$BASE_RECIPE" | sha256sum | cut -c1-12)"
  tag="slotpool-base:$hash"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    say "building $tag from Debian packages (mmdebstrap; about half a minute)"
    rm -f "$STATE/base.tar"
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" bookworm "$STATE/base.tar" >&2
    docker import "$STATE/base.tar" "$tag" >/dev/null
    rm -f "$STATE/base.tar"
  fi
  echo "$tag"
}

# docker build of a context directory whose Dockerfile is written by the caller.
build() {
  local tag="$1" ctx="$2"
  DOCKER_BUILDKIT=0 docker build --quiet --tag "$tag" "$ctx" >/dev/null 2>"$STATE/build.log" || {
    say "building $tag failed:"; cat "$STATE/build.log" >&2; exit 1
  }
}

worker_image() {
  local from="$1" ctx bin build
  if [[ -n "${SLOTPOOL_IMAGE_BINARY:-}" ]]; then
    bin="$SLOTPOOL_IMAGE_BINARY" build=given
    [[ -x "$bin" ]] || { say "SLOTPOOL_IMAGE_BINARY=$bin is not an executable file"; exit 2; }
    say "building slotpool:local from $bin (not the release build: for tests, not benchmarks)"
  else
    bin=target/release/slotpool build=release
    say "building slotpool:local from the release binary"
    cargo build --release --locked --bin slotpool >&2
  fi
  ctx="$(mktemp -d)"
  cp "$bin" "$ctx/slotpool"
  cp -r examples/robots "$ctx/robots"
  cat >"$ctx/Dockerfile" <<EOF
FROM $from
RUN echo 'slotpool:x:10001:10001:slotpool:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \\
 && echo 'slotpool:x:10001:' >> /etc/group
COPY slotpool /usr/local/bin/slotpool
COPY robots /opt/robots
LABEL slotpool.build=$build
USER 10001
EXPOSE 7700
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/slotpool"]
CMD ["worker"]
EOF
  build slotpool:local "$ctx"
  rm -rf "$ctx"
}

devdb_image() {
  local from="$1" ctx
  say "building slotpool-devdb:local ($SECANTUS from PyPI wheels)"
  ctx="$(mktemp -d)"
  source "$ROOT/scripts/retry.sh"
  retry "images: pip download" python3 -m pip download --quiet --disable-pip-version-check \
    --only-binary=:all: --pre --dest "$ctx/wheels" "$SECANTUS" >&2
  # The rules front (scripts/devdb) and the audited table it checks shapes against,
  # as dev-mongo.sh runs them: a container database refuses what mongod refuses.
  mkdir "$ctx/front"
  cp scripts/devdb/serve.py scripts/devdb/rules.py docs/mongodb.md "$ctx/front/"
  cat >"$ctx/front/run.sh" <<'EOF'
#!/bin/sh
# slotpool-devdb's entry: the dev server behind mongod's rules; "$@" is the data path.
# SLOTPOOL_DEV_SHAPES: learn (the default: record shapes in DATA/shapes), enforce
# (also refuse a shape docs/mongodb.md has not audited; the tests set it), off.
exec /opt/devdb/bin/python /opt/devdb/front/serve.py \
  --shapes "${SLOTPOOL_DEV_SHAPES:-learn}" --audited /opt/devdb/front/mongodb.md \
  --shapes-dir "$1/shapes" -- \
  --host 0.0.0.0 --port 27017 --log-level WARNING --storage-path "$@"
EOF
  chmod +x "$ctx/front/run.sh"
  cat >"$ctx/Dockerfile" <<EOF
FROM $from
COPY wheels /wheels
RUN python3 -m venv /opt/devdb \\
 && /opt/devdb/bin/pip install --quiet --no-index --find-links /wheels --pre "$SECANTUS" \\
 && rm -rf /wheels \\
 && echo 'devdb:x:10002:10002:devdb:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \\
 && echo 'devdb:x:10002:' >> /etc/group \\
 && mkdir /data && chown 10002:10002 /data
COPY front /opt/devdb/front
USER 10002
VOLUME /data
EXPOSE 27017
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/devdb/front/run.sh"]
CMD ["/data"]
EOF
  build slotpool-devdb:local "$ctx"
  rm -rf "$ctx"
}

case "${1:-all}" in
  engine) engine ;;
  all)
    engine
    from="$(base)"
    worker_image "$from"
    devdb_image "$from"
    say "ready: slotpool:local, slotpool-devdb:local (on $from)"
    ;;
  *) say "usage: $0 [all|engine]"; exit 2 ;;
esac
