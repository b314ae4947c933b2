#!/usr/bin/env bash
# Brings up a one-node Slurm cluster (munged, slurmctld, slurmd from Debian's packages) under
# WORKDIR, runs COMMAND with SLURM_CONF pointing at it, and tears everything down again.
#   test/dist/slurm_cluster.sh WORKDIR COMMAND...
# Needs root (the daemons run as root in the test) and free ports; used by the dist tests.
set -euo pipefail
work="$1"; shift
mkdir -p "$work"/{state,spool,munge,log}
host="$(hostname -s)"
cpus="$(getconf _NPROCESSORS_ONLN)"  # not nproc: it honours OMP_NUM_THREADS
base=$(( 45000 + RANDOM % 10000 ))  # trainer derives MASTER_PORT from the job id in 20000-39999

source "$(dirname "${BASH_SOURCE[0]}")/slurm_common.sh"
start_munge "$work"

{
  echo "ClusterName=trainertest"
  echo "SlurmctldHost=$host(127.0.0.1)"
  echo "SlurmdSpoolDir=$work/spool"
  echo "SlurmdPidFile=$work/slurmd.pid"
  echo "SlurmdLogFile=$work/log/slurmd.log"
  slurm_conf_common "$work" "$base"
  echo "NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN"
  echo "PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE"
} > "$work/slurm.conf"
export SLURM_CONF="$work/slurm.conf"

cleanup() { stop_pidfiles "$work/slurmd.pid" "$work/slurmctld.pid" "$work/munge/munged.pid"; }
trap cleanup EXIT
trap "exit 124" INT TERM  # run the EXIT trap on a signal too (a timeout must not leave daemons behind)

slurmctld -f "$SLURM_CONF" -i
slurmd -f "$SLURM_CONF"
for i in $(seq 1 450); do  # up to 90 s: slow to start on a loaded 2-core machine
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then break; fi
  sleep 0.2
done
if ! sinfo -h -o %T | grep -qE '^(idle|mixed|allocated)'; then
  echo "slurm_cluster: the node did not come up" >&2
  sinfo >&2 || true
  tail -n 20 "$work/log/slurmctld.log" "$work/log/slurmd.log" >&2 || true
  exit 1
fi
"$@"
