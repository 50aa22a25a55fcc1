#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests of the docs' Slurm
# recipe (tests/cli/slurm.rs) and of the Snakemake workflow's Slurm executor:
# Debian's slurm-wlm and munge packages (`apt-get install slurm-wlm munge`, as
# root), everything else in DIR.
#
#   scripts/slurm_cluster.sh start DIR   # prints SLURM_CONF=DIR/slurm.conf
#   scripts/slurm_cluster.sh stop DIR    # cancels every job, stops the daemons
#
# start writes a munge key, starts munged on its own socket, writes a
# slurm.conf naming this host (`hostname -s`, at 127.0.0.1) as the controller
# and as the one node, with the CPUs and memory `slurmd -C` finds, on two free
# ports; then starts slurmctld and slurmd as daemons and waits until the node
# takes jobs. Nothing is written to /etc, /run or /var: state, spool, pid
# files, logs and the socket are in DIR, so that a system's own munge or
# Slurm, if any, is not touched (slurmd's jobs see DIR/etc at /etc/slurm, in
# a mount namespace that only slurmd and its jobs share). Clients find the
# cluster through $SLURM_CONF. stop cancels the jobs, waits for them to end,
# stops the three daemons by the pids in DIR and fails if one of them, or a
# job step (slurmstepd), is still running afterwards. Needs root (slurmd runs
# jobs as their users); a failed start stops what it started and prints the
# logs.
set -euo pipefail
# Debian puts the daemons in /usr/sbin, which a user's PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

usage() {
  echo "usage: $0 start|stop DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")
conf="$dir/slurm.conf"

# The pids of the daemons this script started, from their pid files.
daemon_pids() {
  local f
  for f in "$dir"/run/slurmd.pid "$dir"/run/slurmctld.pid "$dir"/run/munged.pid; do
    [ -s "$f" ] && cat "$f"
  done
  return 0
}

alive() {
  kill -0 "$1" 2>/dev/null
}

stop() {
  if [ -f "$conf" ] && [ -S "$dir/run/munge.socket" ]; then
    # Jobs first: slurmstepd outlives slurmd.
    SLURM_CONF="$conf" scancel --quiet --full --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 1 100); do
      if [ -z "$(SLURM_CONF="$conf" squeue --noheader --states=all 2>/dev/null | grep -v -E ' (CD|CA|F|TO|NF|PR|OOM|BF|DL) ')" ]; then
        break
      fi
      sleep 0.1
    done
  fi
  local pids pid
  pids=$(daemon_pids)
  for pid in $pids; do
    kill "$pid" 2>/dev/null || true
  done
  for _ in $(seq 1 100); do
    local running=0
    for pid in $pids; do
      alive "$pid" && running=1
    done
    [ $running -eq 0 ] && break
    sleep 0.1
  done
  local left=0
  for pid in $pids; do
    if alive "$pid"; then
      echo "slurm_cluster: process $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)) did not stop; killing it" >&2
      kill -9 "$pid" 2>/dev/null || true
      left=1
    fi
  done
  # Job steps of this cluster: their slurmstepd has its spool folder open.
  local step
  for step in $(pgrep -x slurmstepd || true); do
    if ls -l "/proc/$step/cwd" "/proc/$step/fd" 2>/dev/null | grep -q "$dir"; then
      echo "slurm_cluster: job step $step still running; killing it" >&2
      kill -9 "$step" 2>/dev/null || true
      left=1
    fi
  done
  rm -f "$dir"/run/*.pid
  return $left
}

fail_start() {
  echo "slurm_cluster: $1" >&2
  local log
  for log in "$dir"/log/*; do
    [ -f "$log" ] && { echo "--- $log" >&2; tail -n 30 "$log" >&2; }
  done
  stop || true
  exit 1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  for tool in munged mungekey slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || { echo "slurm_cluster: $tool not found: apt-get install slurm-wlm munge" >&2; exit 1; }
  done
  [ "$(id -u)" -eq 0 ] || { echo "slurm_cluster: needs root (slurmd runs jobs as their users)" >&2; exit 1; }
  mkdir -p "$dir"/{run,state,spool,log}
  # munged checks that no one else can write these folders or read the key.
  chmod 0755 "$dir" "$dir"/run "$dir"/log
  chmod 0700 "$dir"/state "$dir"/spool
  mungekey --create --force --keyfile="$dir/munge.key"
  chmod 0600 "$dir/munge.key"
  munged --socket="$dir/run/munge.socket" --key-file="$dir/munge.key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/state/munged.seed" ||
    fail_start "munged did not start"

  local host node ctld_port slurmd_port user
  host=$(hostname -s)
  # CPUs, sockets, cores and memory as slurmd finds them, so that it
  # accepts its own node line.
  node=$(slurmd -C | head -n 1 | sed "s/^NodeName=[^ ]*/NodeName=$host NodeAddr=127.0.0.1/")
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  user=$(id -un)
  cat >"$conf" <<EOF
ClusterName=deltacells-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
# cred_expire: a requeued job waits this long before it runs again (120 s by default)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/run/munge.socket,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups, accounting or MPI: a container has none of them
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# schedule every second (60 s and 30 s by default), so that a requeued job
# runs as soon as its begin time passes
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# a job that asks no memory gets 1 GiB per CPU, not the whole node
DefMemPerCPU=1024
ReturnToService=2
JobRequeue=1
# a job whose dependency can no longer be met (a shard failed) is cancelled,
# not left pending
DependencyParameters=kill_invalid_depend
MinJobAge=600
$node State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  slurmctld -f "$conf" || fail_start "slurmctld did not start"
  # The jobs find the cluster through $SLURM_CONF, which sbatch passes on;
  # but tools that start job steps with a cleaned environment (Snakemake's
  # Slurm executor runs srun without SLURM_* variables) look for the default
  # /etc/slurm/slurm.conf, as on a real cluster. Where it can, slurmd runs in
  # a mount namespace of its own in which DIR/etc is mounted on /etc/slurm:
  # its jobs see this cluster's slurm.conf there, and nothing else does.
  mkdir -p "$dir/etc"
  cp "$conf" "$dir/etc/slurm.conf"
  if [ -d /etc/slurm ] && unshare --mount --propagation private true 2>/dev/null; then
    unshare --mount --propagation private sh -c \
      'mount --bind "$1/etc" /etc/slurm && exec slurmd -f "$2"' sh "$dir" "$conf" ||
      fail_start "slurmd did not start (in a mount namespace)"
  else
    echo "slurm_cluster: no mount namespace here; jobs find the cluster through \$SLURM_CONF only" >&2
    slurmd -f "$conf" || fail_start "slurmd did not start"
  fi
  for _ in $(seq 1 100); do
    if [ "$(SLURM_CONF="$conf" sinfo --noheader --nodes="$host" --format=%t 2>/dev/null)" = "idle" ]; then
      echo "SLURM_CONF=$conf"
      return 0
    fi
    sleep 0.2
  done
  fail_start "the node is not idle after 20 s: $(SLURM_CONF="$conf" sinfo --noheader --long 2>&1 || true)"
}

case "$action" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
