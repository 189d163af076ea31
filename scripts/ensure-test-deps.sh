#!/bin/sh
# Install what the integration tests need from Debian and is not a Python package: Slurm
# (slurmctld, slurmd, scontrol, salloc) and MUNGE for the Slurm tests, Prometheus for
# tests/integration/test_prometheus.py, Alertmanager (prometheus-alertmanager, amtool) for
# tests/integration/test_alertmanager.py, systemd's offline tools (systemd-analyze,
# systemd-sysusers) for tests/integration/test_systemd_units.py, OpenIPMI's BMC simulator
# (ipmi_sim) and ipmitool for tests/integration/test_bmc_ipmi.py, and the PostgreSQL server for
# the shared-journal tests (cli/dev/pg_server.py starts a throwaway one from
# /usr/lib/postgresql/<version>/bin; the package's own cluster is not used), and perftest's
# ib_write_bw for the pre-flight runner test (tests/unit/agent/preflight/test_preflight_real.py runs it on a
# machine without RDMA devices and expects a clean failure).
# Idempotent and quiet: does nothing when every command is already there, and installs only the
# packages of the commands that are missing.
# Needs root (apt-get); the tests start their own daemons, nothing here configures or starts any
# (on a host with systemd, Debian's prometheus and prometheus-alertmanager packages start their
# own services on 9090 and 9093; the tests use free ports of their own and never touch those).
set -eu

PATH="$PATH:/usr/sbin:/sbin"
missing=""
packages=""
need() {  # need COMMAND PACKAGE
    command -v "$1" >/dev/null 2>&1 && return 0
    missing="$missing $1"
    case " $packages " in *" $2 "*) ;; *) packages="$packages $2" ;; esac
}
for cmd in slurmctld slurmd scontrol salloc sbatch scancel; do need "$cmd" slurm-wlm; done
need munged munge
need prometheus prometheus
need prometheus-alertmanager prometheus-alertmanager
need amtool prometheus-alertmanager
need systemd-analyze systemd
need systemd-sysusers systemd
need ipmi_sim openipmi
need ipmitool ipmitool
need ib_write_bw perftest
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing="$missing initdb"
    packages="$packages postgresql"
fi
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-test-deps: missing:$missing; run as root, or:" >&2
    echo "  sudo apt-get install -y --no-install-recommends$packages" >&2
    exit 1
fi

echo "ensure-test-deps: installing$packages (missing:$missing)" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
install() {
    # shellcheck disable=SC2086 # one word per package
    apt-get install -y -qq --no-install-recommends $packages >"$log" 2>&1
}
# A fresh image may have no package lists yet: update once and try again.
if ! install && ! { apt-get update -qq >>"$log" 2>&1 && install; }; then
    cat "$log" >&2
    rm -f "$log"
    exit 1
fi
rm -f "$log"
