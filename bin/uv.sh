# shellcheck shell=bash
# Sourced by bin/vramctl, bin/test and bin/build-image: finds or installs the pinned uv.
#
#   source "$ROOT/bin/uv.sh"
#   uv_bin=$(vramctl_uv) || ...   # the path of a uv of VRAMCTL_UV_VERSION, or status 1
#
# Where uv comes from, first hit wins:
#   1. $VRAMCTL_UV, when it names an executable;
#   2. `uv` on PATH, when it is the pinned version (the lock's format follows uv);
#   3. a small venv of its own under ${XDG_CACHE_HOME:-~/.cache}/vramctl/uv-VERSION,
#      made once per machine with `python3 -m pip install uv==VERSION` (PyPI).
# uv then uses the system's CA certificates (so an HTTPS proxy with its own CA
# works as it does for pip) and never downloads a Python: the venv is made
# from `python3`, as before.

VRAMCTL_UV_VERSION="0.13.9"
export UV_SYSTEM_CERTS="${UV_SYSTEM_CERTS:-1}"
export UV_PYTHON_DOWNLOADS="${UV_PYTHON_DOWNLOADS:-never}"
export UV_PYTHON="${UV_PYTHON:-python3}"

vramctl_uv() {
    if [[ -n "${VRAMCTL_UV:-}" && -x "${VRAMCTL_UV}" ]]; then
        printf '%s\n' "$VRAMCTL_UV"
        return 0
    fi
    local onpath
    onpath="$(command -v uv 2>/dev/null || true)"
    if [[ -n "$onpath" && "$("$onpath" --version 2>/dev/null)" == "uv $VRAMCTL_UV_VERSION"* ]]; then
        printf '%s\n' "$onpath"
        return 0
    fi
    local dir="${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/vramctl/uv-$VRAMCTL_UV_VERSION"
    if [[ ! -x "$dir/bin/uv" ]]; then
        mkdir -p "$(dirname "$dir")" || return 1
        (
            if command -v flock >/dev/null 2>&1; then
                exec 7>"$dir.lock"
                flock 7
            fi
            [[ -x "$dir/bin/uv" ]] && exit 0
            echo "uv: installing uv $VRAMCTL_UV_VERSION into $dir (once per machine) ..." >&2
            rm -rf "$dir.tmp"
            python3 -m venv "$dir.tmp" >&2 &&
                PIP_DISABLE_PIP_VERSION_CHECK=1 "$dir.tmp/bin/python" -m pip install -q \
                    "uv==$VRAMCTL_UV_VERSION" >&2 &&
                mv "$dir.tmp" "$dir"
        ) || { rm -rf "$dir.tmp"; return 1; }
    fi
    [[ -x "$dir/bin/uv" ]] || return 1
    printf '%s\n' "$dir/bin/uv"
}
