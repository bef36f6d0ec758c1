#!/usr/bin/env bash
# Bring up what the docker tests need, on a bare Debian machine if need be:
#   1. Debian's docker.io and busybox-static (apt-get, as root) when missing;
#   2. a Docker daemon: `dockerd --iptables=false --bridge=none`, started in the
#      background when `docker info` gets no answer;
#   3. the test image vramctl-test:latest, FROM scratch with a static busybox.
#
# Usage: tests/docker/ensure-docker.sh [ENV_FILE]
#   Writes `export NAME=VALUE` lines for the tests to ENV_FILE (default: stdout;
#   everything else goes to stderr):
#     VRAMCTL_TEST_IMAGE=vramctl-test:latest  and  VRAMCTL_DOCKER=available
#   When Docker cannot be brought up: with CI=true it exits non-zero; otherwise
#   it warns loudly and writes VRAMCTL_DOCKER=unavailable (the docker tests are
#   then skipped, loudly) and exits 0. That fallback is for laptops only.
#
# Environment:
#   VRAMCTL_TEST_IMAGE   image tag to build (default vramctl-test:latest)
#   VRAMCTL_STATE_DIR    where the dockerd log and lock live
#                        (default ${TMPDIR:-/tmp}/vramctl-test-state)
#   VRAMCTL_DOCKERD_WAIT seconds to wait for a started dockerd (default 60)
set -euo pipefail

HERE="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
IMAGE="${VRAMCTL_TEST_IMAGE:-vramctl-test:latest}"
STATE_DIR="${VRAMCTL_STATE_DIR:-${TMPDIR:-/tmp}/vramctl-test-state}"
WAIT_S="${VRAMCTL_DOCKERD_WAIT:-60}"
ENV_FILE="${1:-/dev/stdout}"
BUSYBOX=/bin/busybox
HASH_LABEL=vramctl.test.context-sha256

case "${CI:-}" in true | TRUE | True | 1 | yes) IN_CI=1 ;; *) IN_CI=0 ;; esac

log() { printf 'ensure-docker: %s\n' "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

unavailable() {
    if [[ $IN_CI == 1 ]]; then
        log "ERROR: $*"
        log "ERROR: CI=true, so the docker tests may not be skipped: failing."
        exit 1
    fi
    {
        echo
        echo "######################################################################"
        echo "#  WARNING: Docker is NOT available: $*"
        echo "#  The docker tests will be SKIPPED (VRAMCTL_DOCKER=unavailable)."
        echo "#  This is allowed on a developer machine only; CI fails here."
        echo "######################################################################"
        echo
    } >&2
    printf 'export VRAMCTL_DOCKER=unavailable\nexport VRAMCTL_TEST_IMAGE=%q\n' "$IMAGE" >"$ENV_FILE"
    exit 0
}

is_static() {
    local f="$1" out
    [[ -x "$f" ]] || return 1
    if command -v file >/dev/null 2>&1; then
        out="$(file -L "$f" 2>/dev/null)" || return 1
        [[ "$out" == *"statically linked"* || "$out" == *"static-pie linked"* ]]
        return
    fi
    # No `file`: ldd says "not a dynamic executable" (glibc) or "statically linked".
    out="$(ldd "$f" 2>&1 || true)"
    [[ "$out" == *"not a dynamic executable"* || "$out" == *"statically linked"* ]]
}

docker_answers() { timeout 20 docker info >/dev/null 2>&1; }

mkdir -p "$STATE_DIR"
# Two test runs on one machine must not both install or start a daemon.
if command -v flock >/dev/null 2>&1; then
    exec 8>"$STATE_DIR/lock"
    flock -w 900 8 || unavailable "another test run held $STATE_DIR/lock for 15 minutes"
fi

# ---------------------------------------------------------------- packages
want=()
command -v dockerd >/dev/null 2>&1 || want+=(docker.io)
command -v docker >/dev/null 2>&1 || want+=(docker.io)
is_static "$BUSYBOX" || want+=(busybox-static)
if ((${#want[@]})); then
    mapfile -t want < <(printf '%s\n' "${want[@]}" | sort -u)
    if [[ $(id -u) != 0 ]]; then
        unavailable "missing ${want[*]} and not root, so cannot apt-get install them" \
            "(run: sudo apt-get install ${want[*]})"
    fi
    t0="$(now)"
    log "apt-get update ..."
    if ! DEBIAN_FRONTEND=noninteractive apt-get update -q >"$STATE_DIR/apt.log" 2>&1; then
        tail -n 20 "$STATE_DIR/apt.log" >&2
        unavailable "apt-get update failed (log: $STATE_DIR/apt.log)"
    fi
    log "apt-get install ${want[*]} ..."
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${want[@]}" >>"$STATE_DIR/apt.log" 2>&1; then
        tail -n 20 "$STATE_DIR/apt.log" >&2
        unavailable "apt-get install ${want[*]} failed (log: $STATE_DIR/apt.log)"
    fi
    log "STAGE apt-install: $(elapsed "$t0")s (${want[*]})"
fi
is_static "$BUSYBOX" || unavailable "$BUSYBOX is not a static binary (need Debian's busybox-static)"

# ------------------------------------------------------------------ daemon
# pid_alive PID NAME: PID is a live (not zombie) process called NAME.
pid_alive() {
    local pid="$1" name="$2" state
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]] || return 1
    state="$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)"
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# wait_for_daemon PID: until `docker info` answers (0), PID dies or WAIT_S pass (1).
wait_for_daemon() {
    local pid="$1" i
    for ((i = 0; i < WAIT_S * 2; i++)); do
        docker_answers && return 0
        pid_alive "$pid" dockerd || { docker_answers && return 0; return 1; }
        sleep 0.5
    done
    return 1
}

DOCKERD_PIDFILE=/var/run/docker.pid
CONTAINERD_PIDFILE=/var/run/docker/containerd/containerd.pid
DOCKERD_LOG="$STATE_DIR/dockerd.log"
if docker_answers; then
    log "docker daemon already answering"
else
    [[ $(id -u) == 0 ]] || unavailable "no Docker daemon answers and we are not root to start one"
    t0="$(now)"
    running="$(cat "$DOCKERD_PIDFILE" 2>/dev/null || true)"
    if pid_alive "$running" dockerd; then
        # Started by someone else and still coming up: wait for it, start no second one.
        log "dockerd (pid $running) is running but not answering yet; waiting up to ${WAIT_S}s"
        wait_for_daemon "$running" || unavailable "the running dockerd (pid $running) does not answer"
        log "STAGE dockerd-start: $(elapsed "$t0")s (waited for pid $running)"
    else
        # A daemon killed without its clean-up (SIGKILL at the end of a session)
        # leaves pid files behind; dockerd refuses to start over its own while that
        # pid is any live process (pids are reused), so drop the stale ones.
        for pf in "$DOCKERD_PIDFILE:dockerd" "$CONTAINERD_PIDFILE:containerd"; do
            f="${pf%%:*}"
            if [[ -f "$f" ]] && ! pid_alive "$(cat "$f" 2>/dev/null || true)" "${pf##*:}"; then
                log "removing stale $f"
                rm -f "$f"
            fi
        done
        log "starting dockerd (log: $DOCKERD_LOG) ..."
        # setsid + nohup + redirects: the daemon holds neither this script's
        # terminal nor its stdout/stderr pipes, and outlives the script. 8>&-: nor
        # the lock above (else the daemon, and its containerd, would hold it for
        # ever and the next run would wait on it). Appends: the log may belong to
        # a daemon that is still running. dockerd starts its own containerd.
        echo "=== ensure-docker.sh starting dockerd at $(date -u '+%Y-%m-%dT%H:%M:%SZ')" >>"$DOCKERD_LOG"
        setsid nohup dockerd --iptables=false --bridge=none \
            </dev/null >>"$DOCKERD_LOG" 2>&1 8>&- &
        dockerd_pid=$!
        if ! wait_for_daemon "$dockerd_pid"; then
            log "dockerd did not answer; last lines of $DOCKERD_LOG:"
            tail -n 30 "$DOCKERD_LOG" >&2 || true
            unavailable "dockerd did not come up within ${WAIT_S}s"
        fi
        log "STAGE dockerd-start: $(elapsed "$t0")s (pid $dockerd_pid)"
    fi
fi
log "$(docker version --format 'daemon {{.Server.Version}} (API {{.Server.APIVersion}}), client {{.Client.Version}}' 2>&1 || true)," \
    "storage driver $(docker info --format '{{.Driver}}' 2>/dev/null || echo '?')"

# ------------------------------------------------------------------- image
# The label holds a hash of everything that goes into the image, so the image
# is rebuilt when the Dockerfile or the busybox binary changes, and only then.
want_hash="$(cat "$HERE/Dockerfile" "$BUSYBOX" | sha256sum | cut -d' ' -f1)"
have_hash="$(docker image inspect --format "{{ index .Config.Labels \"$HASH_LABEL\" }}" "$IMAGE" 2>/dev/null || true)"
if [[ "$have_hash" == "$want_hash" ]]; then
    log "image $IMAGE is up to date"
else
    t0="$(now)"
    ctx="$(mktemp -d "${TMPDIR:-/tmp}/vramctl-test-ctx.XXXXXX")"
    trap 'rm -rf "$ctx"' EXIT
    cp "$HERE/Dockerfile" "$ctx/Dockerfile"
    cp "$BUSYBOX" "$ctx/busybox"
    log "building $IMAGE ..."
    if ! docker build --label "$HASH_LABEL=$want_hash" -t "$IMAGE" "$ctx" >"$STATE_DIR/build.log" 2>&1; then
        tail -n 30 "$STATE_DIR/build.log" >&2
        unavailable "docker build of $IMAGE failed (log: $STATE_DIR/build.log)"
    fi
    log "STAGE image-build: $(elapsed "$t0")s"
fi

printf 'export VRAMCTL_DOCKER=available\nexport VRAMCTL_TEST_IMAGE=%q\n' "$IMAGE" >"$ENV_FILE"
