#!/usr/bin/env bash
# Installs Debian's slurm-wlm and munge packages, which the test of the docs'
# Slurm recipe (tests/cli/slurm.rs) runs a one-node cluster with
# (scripts/slurm_cluster.sh). Only as root: `.ci/run` calls it before
# scripts/test.sh on CI's fresh machine. For anyone else it says what it
# would install and does nothing; the Slurm test then notes that it is
# skipped (a failure under DELTACELLS_REQUIRE_ALL). Safe to run again: it
# installs only what is missing.
#
# The packages' services are not started: the test starts its own daemons
# in a temporary folder and stops them, and nothing else may keep running.
# apt-get asks policy-rc.d whether to start a service; while it installs, one
# that says no is put in place, unless the machine has one already (container
# images usually do).
set -euo pipefail
if command -v sbatch >/dev/null && command -v munged >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup_slurm: not root: slurm-wlm and munge not installed (as root: apt-get install slurm-wlm munge); the Slurm test will be skipped" >&2
  exit 0
fi
started=$SECONDS
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 0755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq slurm-wlm munge >/dev/null
echo "setup_slurm: slurm-wlm and munge installed in $((SECONDS - started)) s" >&2
