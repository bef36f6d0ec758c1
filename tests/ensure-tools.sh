#!/usr/bin/env bash
# Install what the page's browser tests and the alert-rule checks need, when missing:
#   chromium  (Debian's; Playwright drives it by its path, /usr/bin/chromium)
#   promtool  (Debian's `prometheus` package ships it)
# as root with apt-get (`apt-get update` first). Nothing is done when both are there.
#
# Usage: tests/ensure-tools.sh
#   Under CI=true a tool that cannot be installed fails this script (exit 1);
#   elsewhere it warns loudly and exits 0, and the tests that need the tool are
#   skipped (they fail under CI).
set -euo pipefail

case "${CI:-}" in true | TRUE | True | 1 | yes) IN_CI=1 ;; *) IN_CI=0 ;; esac
LOG="${TMPDIR:-/tmp}/vramctl-ensure-tools.log"

log() { printf 'ensure-tools: %s\n' "$*" >&2; }
give_up() {
    if [[ $IN_CI == 1 ]]; then
        log "ERROR: $* (CI=true: the browser and promtool tests may not be skipped)"
        exit 1
    fi
    log "WARNING: $*: the tests that need it will be SKIPPED"
    exit 0
}

want=()
[[ -x "${VRAMCTL_CHROMIUM:-/usr/bin/chromium}" ]] || want+=(chromium)
command -v promtool >/dev/null 2>&1 || want+=(prometheus)
((${#want[@]})) || exit 0

if [[ $(id -u) != 0 ]]; then
    give_up "missing ${want[*]} and not root, so cannot apt-get install them (run: sudo apt-get install ${want[*]})"
fi
command -v apt-get >/dev/null 2>&1 || give_up "missing ${want[*]} and no apt-get"
log "apt-get update ..."
DEBIAN_FRONTEND=noninteractive apt-get update -q >"$LOG" 2>&1 ||
    give_up "apt-get update failed (log: $LOG)"
log "apt-get install ${want[*]} ..."
# policy-rc.d 101: the package's prometheus service is not started by the install
policy=/usr/sbin/policy-rc.d
made_policy=0
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
rc=0
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${want[@]}" \
    >>"$LOG" 2>&1 || rc=$?
((made_policy)) && rm -f "$policy"
((rc == 0)) || give_up "apt-get install ${want[*]} failed (log: $LOG)"
log "installed ${want[*]}"
