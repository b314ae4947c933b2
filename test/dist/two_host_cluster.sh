#!/usr/bin/env bash
# Brings up two simulated hosts on this machine and a two-node Slurm cluster on them, runs COMMAND
# on the first host with SLURM_CONF set, and removes everything again.
#   test/dist/two_host_cluster.sh WORKDIR COMMAND...
# Each host is a Linux network namespace with an address of its own (a veth pair joins them) and
# a host name of its own (a UTS namespace per process started in it; `ip netns exec` gives each
# namespace its own /etc/hosts from /etc/netns/NAME/hosts, naming both hosts). munged runs once
# (its socket is a path, reachable from both namespaces); slurmctld and one slurmd run on the first
# host, another slurmd on the second. COMMAND can reach the hosts through the functions below,
# exported to it as scripts in WORKDIR/bin: `on-host A|B CMD...` runs CMD on a host,
# `host-kill A|B PATTERN` kills that host's processes whose command line holds PATTERN, and
# `host-name A|B` / `host-addr A|B` print a host's name and address.
# Needs root and network namespaces; exits 77 (and says why) when they are not available.
set -euo pipefail
work="$1"; shift
mkdir -p "$work"/{state,munge,log,bin}
id="$(( $$ % 200 + 20 ))"                 # keeps parallel runs apart: namespaces, subnet, names
ns_a="trainer-a-$$" ns_b="trainer-b-$$"
name_a="trnhost-a$id" name_b="trnhost-b$id"
addr_a="10.231.$id.1" addr_b="10.231.$id.2"
cpus="$(getconf _NPROCESSORS_ONLN)"
base=$(( 45000 + RANDOM % 10000 ))

source "$(dirname "${BASH_SOURCE[0]}")/slurm_common.sh"

cleanup() {
  set +e
  stop_pidfiles "$work"/slurmd-*.pid "$work/slurmctld.pid" "$work/munge/munged.pid"
  # Whatever still runs in the namespaces (job steps of a killed job) goes with them.
  for ns in "$ns_a" "$ns_b"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
}
trap cleanup EXIT
trap "exit 124" INT TERM

if ! ip netns add "$ns_a" 2>"$work/log/netns.err"; then
  echo "two_host_cluster: network namespaces are not available here ($(head -c 200 "$work/log/netns.err")): skipped" >&2
  exit 77
fi
ip netns add "$ns_b"
ip link add "tva$id" type veth peer name "tvb$id"
ip link set "tva$id" netns "$ns_a"
ip link set "tvb$id" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "tva$id"
ip -n "$ns_b" addr add "$addr_b/24" dev "tvb$id"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$addr_a" "$name_a" "$addr_b" "$name_b" > "/etc/netns/$ns/hosts"
done
ip -n "$ns_a" link set "tva$id" up
ip -n "$ns_b" link set "tvb$id" up

# on-host A|B CMD...: CMD in that host's network namespace, under its host name, with an
# /etc/hosts naming both hosts (bind-mounted in a mount namespace of its own; not `ip netns exec`,
# which would also remount /sys and hide the cgroups slurmd needs).
cat > "$work/bin/on-host" <<SCRIPT
#!/usr/bin/env bash
case "\$1" in A) ns=$ns_a name=$name_a ;; B) ns=$ns_b name=$name_b ;; *) echo "on-host A|B CMD..." >&2; exit 2 ;; esac
shift
exec nsenter --net=/run/netns/\$ns unshare --uts --mount --propagation private /bin/sh -c \\
  'mount --bind "\$1" /etc/hosts && hostname "\$2" && shift 2 && exec "\$@"' sh /etc/netns/\$ns/hosts "\$name" "\$@"
SCRIPT
# host-kill A|B PATTERN: SIGKILL to that host's processes whose command line holds PATTERN.
cat > "$work/bin/host-kill" <<SCRIPT
#!/usr/bin/env bash
case "\$1" in A) ns=$ns_a ;; B) ns=$ns_b ;; *) echo "host-kill A|B PATTERN" >&2; exit 2 ;; esac
for pid in \$(ip netns pids "\$ns"); do
  tr '\\0' ' ' < /proc/\$pid/cmdline 2>/dev/null | grep -qF -- "\$2" && kill -9 "\$pid" && echo "killed \$pid on host \$1"
done
exit 0
SCRIPT
printf '#!/bin/sh\ncase "$1" in A) echo %s ;; B) echo %s ;; esac\n' "$name_a" "$name_b" > "$work/bin/host-name"
printf '#!/bin/sh\ncase "$1" in A) echo %s ;; B) echo %s ;; esac\n' "$addr_a" "$addr_b" > "$work/bin/host-addr"
chmod +x "$work/bin/on-host" "$work/bin/host-kill" "$work/bin/host-name" "$work/bin/host-addr"
export PATH="$work/bin:$PATH"
# The link works when host B reaches a port on host A (no ping on a minimal system: bash's /dev/tcp).
on-host A timeout 5 python3 -c 'import socket,sys; s=socket.socket(); s.bind((sys.argv[1],0)); s.listen(); print(s.getsockname()[1], flush=True); s.accept()' "$addr_a" > "$work/log/probe.port" &
for i in $(seq 1 50); do [ -s "$work/log/probe.port" ] && break; sleep 0.1; done
on-host B bash -c "exec 3<>/dev/tcp/$name_a/$(cat "$work/log/probe.port")" ||
  { echo "two_host_cluster: host B cannot reach host A" >&2; exit 1; }
wait

start_munge "$work"
{
  echo "ClusterName=trainertwo"
  echo "SlurmctldHost=$name_a($addr_a)"
  echo "SlurmdSpoolDir=$work/spool-%n"
  echo "SlurmdPidFile=$work/slurmd-%n.pid"
  echo "SlurmdLogFile=$work/log/slurmd-%n.log"
  slurm_conf_common "$work" "$base"
  echo "NodeName=$name_a NodeAddr=$addr_a CPUs=$cpus State=UNKNOWN"
  echo "NodeName=$name_b NodeAddr=$addr_b CPUs=$cpus State=UNKNOWN"
  echo "PartitionName=debug Nodes=$name_a,$name_b Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE"
} > "$work/slurm.conf"
export SLURM_CONF="$work/slurm.conf"
mkdir -p "$work/spool-$name_a" "$work/spool-$name_b"

on-host A slurmctld -f "$SLURM_CONF" -i
on-host A slurmd -f "$SLURM_CONF" -N "$name_a"
on-host B slurmd -f "$SLURM_CONF" -N "$name_b"
up=0
for i in $(seq 1 450); do  # up to 90 s: slow to start on a loaded 2-core machine
  up="$(on-host A sinfo -h -N -o '%N %T' 2>/dev/null | grep -cE ' (idle|mixed|allocated)' || true)"
  [ "$up" = 2 ] && break
  sleep 0.2
done
if [ "$up" != 2 ]; then
  echo "two_host_cluster: the nodes did not come up" >&2
  on-host A sinfo -N >&2 || true
  tail -n 20 "$work"/log/*.log >&2 || true
  exit 1
fi
on-host A "$@"
