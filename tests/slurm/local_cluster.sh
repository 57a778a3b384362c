#!/usr/bin/env bash
# A one-node SLURM cluster on localhost for the opt-in SLURM test (Debian's slurm-wlm and
# munge; run as root). Usage: local_cluster.sh start|stop DIR. `start` writes DIR/slurm.conf,
# links it as /etc/slurm/slurm.conf (where jobs' own srun calls look for it; a config that was
# there is kept aside), starts munged (unless one runs), slurmctld and slurmd, and waits until
# the node is idle. `stop` undoes all of it: the daemons it started, the link, the old config.
set -euo pipefail
action=$1
dir=$(realpath -m "$2")
conf=${SLURM_CONF_LINK:-/etc/slurm/slurm.conf}  # (a test points it elsewhere)
if [ "$action" = stop ]; then
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  if [ "$(readlink "$conf" 2>/dev/null)" = "$dir/slurm.conf" ]; then rm -f "$conf"; fi
  if [ -e "$dir/slurm.conf.saved" ]; then mv "$dir/slurm.conf.saved" "$conf"; fi
  exit 0
fi
mkdir -p "$dir/state" "$dir/spool" "$dir/log"
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
cat > "$dir/slurm.conf" <<CONF
ClusterName=fedssl-local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
NodeName=localhost CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
mkdir -p /etc/slurm
if [ -e "$conf" ] && [ ! -L "$conf" ]; then mv "$conf" "$dir/slurm.conf.saved"; fi
ln -sfn "$dir/slurm.conf" "$conf"
if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  runuser -u munge -- munged 2>/dev/null || munged --force
  pgrep -nx munged > "$dir/munged.pid"  # ours to stop
fi
slurmctld -f "$dir/slurm.conf"
slurmd -f "$dir/slurm.conf"
for _ in $(seq 60); do
  if sinfo -h -o %t 2>/dev/null | grep -qE '^idle'; then exit 0; fi
  sleep 1
done
echo "the local SLURM node did not come up; see $dir/log" >&2
exit 1
