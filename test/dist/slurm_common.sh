# Pieces shared by the test Slurm clusters (slurm_cluster.sh: one node; two_host_cluster.sh: two
# simulated hosts). Sourced; WORK is the cluster's work directory.

# start_munge WORK: munged with a key of its own and its socket under WORK/munge, so the host's
# munge (if any) is untouched. Sets munge_socket.
start_munge() {
  local work="$1"
  local key="$work/munge/munge.key"
  dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
  chmod 400 "$key"
  munge_socket="$work/munge/munge.socket"
  munged --force --key-file="$key" --socket="$munge_socket" --pid-file="$work/munge/munged.pid" \
    --log-file="$work/log/munged.log" --seed-file="$work/munge/seed"
}

# slurm_conf_common WORK BASE_PORT: the slurm.conf lines both clusters share (daemons as root on
# BASE_PORT and the next, munge authentication, controller state and log under WORK, no process
# tracking or accounting, CPUs scheduled one by one, oversubscription allowed by the partitions).
slurm_conf_common() {
  local work="$1" base="$2"
  cat <<CONF
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$base
SlurmdPort=$((base + 1))
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmctldPidFile=$work/slurmctld.pid
SlurmctldLogFile=$work/log/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
CONF
}

# stop_pidfiles FILE...: TERM to the processes the existing FILEs name, then KILL after half a
# second to whatever is left.
stop_pidfiles() {
  local pidfile
  for pidfile in "$@"; do [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true; done
  sleep 0.5
  for pidfile in "$@"; do [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true; done
}
