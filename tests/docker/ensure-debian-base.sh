#!/usr/bin/env bash
# Make the Debian base image with Python (IMAGE), when missing or built from another
# recipe: `debootstrap --variant=minbase` of bookworm with python3 and python3-venv,
# from the Debian mirror apt uses, then `docker import` (no registry is pulled from).
# It is cached on the daemon: a machine pays for it once (a few minutes: the packages
# are downloaded from the mirror); an image of the same recipe under another tag is
# tagged IMAGE instead.
#
# Usage: tests/docker/ensure-debian-base.sh [IMAGE]   (default vramctl-debian-python:bookworm)
#   Exit 0 when IMAGE is on the daemon and up to date (built now or before); 1 when it
#   cannot be made, the reason on stderr (it needs root, debootstrap or apt to install
#   it, and the Debian mirror).
#
# Used by tests/docker/ensure-compose.sh (the bases the tests build the controller's
# image on) and manifests/examples/run (the stand-in's base where Docker Hub cannot be
# reached). Logs in $VRAMCTL_BASE_LOGS (default ${TMPDIR:-/tmp}/vramctl-test-state).
set -euo pipefail

BASE_IMAGE="${1:-vramctl-debian-python:bookworm}"
LOGS="${VRAMCTL_BASE_LOGS:-${TMPDIR:-/tmp}/vramctl-test-state}"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv
RECIPE="debootstrap --variant=minbase --include=$BASE_PACKAGES $SUITE; apt lists and caches dropped; v1"
LABEL=vramctl.test.recipe-sha256

log() { printf 'ensure-debian-base: %s\n' "$*" >&2; }
fail() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

want="$(printf '%s' "$RECIPE" | sha256sum | cut -d' ' -f1)"
up_to_date() {
    [[ "$(docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$BASE_IMAGE" 2>/dev/null || true)" == "$want" ]]
}
if up_to_date; then
    log "image $BASE_IMAGE is up to date"
    exit 0
fi
# the same recipe under another tag on this daemon (the tests' base, say): tagged, not
# made again. Its import is one layer; an image built on it carries its label too.
for same in $(docker image ls -q --no-trunc --filter "label=$LABEL=$want" 2>/dev/null | sort -u); do
    [[ "$(docker image inspect -f '{{len .RootFS.Layers}}' "$same" 2>/dev/null)" == 1 ]] || continue
    docker tag "$same" "$BASE_IMAGE" || break
    log "image $BASE_IMAGE: tagged from ${same#sha256:}, made by the same recipe"
    exit 0
done
[[ $(id -u) == 0 ]] || fail "building $BASE_IMAGE needs root (debootstrap): run this script as root"

mkdir -p "$LOGS"
if command -v flock >/dev/null 2>&1; then  # one build of one image at a time on this machine
    exec 9>"$LOGS/debian-base.$(printf '%s' "$BASE_IMAGE" | sha256sum | cut -c1-12).lock"
    flock -w 900 9 || fail "another build of $BASE_IMAGE held its lock for 15 minutes"
    if up_to_date; then
        log "image $BASE_IMAGE is up to date (built meanwhile)"
        exit 0
    fi
fi
tmp="$(mktemp -d "${TMPDIR:-/tmp}/vramctl-base.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

t0="$(now)"
if ! command -v debootstrap >/dev/null 2>&1; then
    log "apt-get update; apt-get install debootstrap ..."
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap; } \
        >"$LOGS/apt-debootstrap.log" 2>&1; then
        tail -n 20 "$LOGS/apt-debootstrap.log" >&2
        fail "apt-get install debootstrap failed (log: $LOGS/apt-debootstrap.log)"
    fi
fi
# The Debian mirror apt uses here (the first source whose path ends in /debian, in
# deb822 or one-line form), else Debian's own.
mirror="$(grep -rhoE '^(URIs:[[:space:]]*|deb[[:space:]]+)(\[[^]]*\][[:space:]]+)?https?://[^[:space:]]+' \
    /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
    grep -oE 'https?://[^[:space:]]+' | grep -E '/debian/?$' | head -n 1 || true)"
mirror="${mirror:-http://deb.debian.org/debian}"
log "debootstrap $SUITE ($BASE_PACKAGES) from $mirror ..."
if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$tmp/root" "$mirror" \
    >"$LOGS/debootstrap.log" 2>&1; then
    tail -n 20 "$LOGS/debootstrap.log" >&2
    fail "debootstrap failed (log: $LOGS/debootstrap.log)"
fi
rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
if ! tar -C "$tmp/root" -c . | docker import \
    --change "LABEL $LABEL=$want" --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null; then
    fail "docker import of $BASE_IMAGE failed"
fi
rm -rf "$tmp/root"
log "STAGE base-image: $(elapsed "$t0")s ($BASE_IMAGE)"
