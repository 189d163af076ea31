#!/bin/sh
# Install what the integration tests need from Debian and is not a Python package: Slurm
# (slurmctld, slurmd, scontrol, salloc) and MUNGE for the Slurm tests, and Prometheus for
# tests/integration/test_prometheus.py.
# Idempotent and quiet: does nothing when every command is already there.
# Needs root (apt-get); the tests start their own daemons, nothing here configures or starts any.
set -eu

PATH="$PATH:/usr/sbin:/sbin"
missing=""
for cmd in slurmctld slurmd scontrol salloc scancel munged prometheus; do
    command -v "$cmd" >/dev/null 2>&1 || missing="$missing $cmd"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-test-deps: missing:$missing; run as root, or:" >&2
    echo "  sudo apt-get install -y --no-install-recommends slurm-wlm munge prometheus" >&2
    exit 1
fi

echo "ensure-test-deps: installing slurm-wlm, munge, prometheus (missing:$missing)" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
install() {
    apt-get install -y -qq --no-install-recommends slurm-wlm munge prometheus >"$log" 2>&1
}
# A fresh image may have no package lists yet: update once and try again.
if ! install && ! { apt-get update -qq >>"$log" 2>&1 && install; }; then
    cat "$log" >&2
    rm -f "$log"
    exit 1
fi
rm -f "$log"
