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

# munge: a key of our own and a socket in the work dir, so the host's munge (if any) is untouched.
key="$work/munge/munge.key"
dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
chmod 400 "$key"
socket="$work/munge/munge.socket"
munged --force --key-file="$key" --socket="$socket" --pid-file="$work/munge/munged.pid" \
  --log-file="$work/log/munged.log" --seed-file="$work/munge/seed"

cat > "$work/slurm.conf" <<CONF
ClusterName=trainertest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$base
SlurmdPort=$((base + 1))
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF="$work/slurm.conf"

cleanup() {
  for pidfile in "$work/slurmd.pid" "$work/slurmctld.pid" "$work/munge/munged.pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 0.5
  for pidfile in "$work/slurmd.pid" "$work/slurmctld.pid" "$work/munge/munged.pid"; do
    [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  done
}
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
