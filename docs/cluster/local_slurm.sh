#!/usr/bin/env bash
# A real SLURM cluster on this one machine, for trying docs/cluster/slurm.sbatch and for the
# tests (tests/cluster/test_slurm.py): munge, slurmctld and two slurmd in SLURM's
# multiple-slurmd mode (`slurmd -N n1`, `-N n2`: nodes n1 and n2 on 127.0.0.1, a port each),
# one partition `local` of both, each node declaring one GPU as a count-only GRES (no device
# file: `--gpus-per-task=1` is granted and SLURM_GPUS_* set as on a GPU node; the work runs
# on the CPU).
#
#   docs/cluster/local_slurm.sh up      # writes the folder, starts the daemons, waits for idle
#   docs/cluster/local_slurm.sh env     # the line to source: export SLURM_CONF=...
#   docs/cluster/local_slurm.sh down    # stops every daemon it started, by its pid
#
# Everything lives in one folder, LOCAL_SLURM_DIR (default /tmp/mlperf-local-slurm): slurm.conf,
# gres.conf, the munge key and socket, the controller's state, spool folders, pid files, logs.
# Nothing else of the machine is changed but two lines of /etc/hosts (n1 and n2 as
# 127.0.0.1, tagged, removed by `down`): munged gets its own key, socket and pid file there,
# and the commands find the cluster through SLURM_CONF (slurm.conf's AuthInfo names the
# socket). Installs nothing: needs Debian's `slurm-wlm` and `munge` (apt-get install -y
# slurm-wlm munge) and root (slurmd runs jobs as their submitting user). Ports:
# LOCAL_SLURM_PORT (default 16817) for slurmctld, +1 and +2 for n1's and n2's slurmd.
# A bad argument: one line, exit 2; a cluster that does not come up: one line naming the log
# to read, exit 1, with what was started stopped again.
set -euo pipefail

DIR=${LOCAL_SLURM_DIR:-/tmp/mlperf-local-slurm}
PORT=${LOCAL_SLURM_PORT:-16817}
WAIT_S=${LOCAL_SLURM_WAIT_S:-60}
NODES=(n1 n2)
usage="usage: $0 up|down|env (LOCAL_SLURM_DIR, LOCAL_SLURM_PORT, LOCAL_SLURM_WAIT_S from the environment)"

die() { echo "local_slurm.sh: $1" >&2; exit "${2:-1}"; }

[ $# -eq 1 ] || die "expected one command, got ${#}; $usage" 2
case "$1" in up|down|env) ;; *) die "unknown command '$1'; allowed: up, down, env" 2 ;; esac
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1024 ] && [ "$PORT" -le 65533 ] \
  || die "LOCAL_SLURM_PORT='$PORT' is not a port; allowed: 1024..65533" 2
[[ "$WAIT_S" =~ ^[0-9]+$ ]] && [ "$WAIT_S" -ge 1 ] \
  || die "LOCAL_SLURM_WAIT_S='$WAIT_S' is not a number of seconds; allowed: an integer >= 1" 2
[[ "$DIR" = /* ]] || die "LOCAL_SLURM_DIR='$DIR' is not an absolute path; allowed: /a/folder" 2

export SLURM_CONF="$DIR/slurm.conf"
PIDS=(munged slurmctld "${NODES[@]/#/slurmd-}")

HOSTS_TAG="# local_slurm.sh $DIR"

unname() {         # the /etc/hosts lines `up` added, and only those
  local kept
  if grep -qF "$HOSTS_TAG" /etc/hosts 2>/dev/null; then
    kept=$(grep -vF "$HOSTS_TAG" /etc/hosts)
    printf '%s\n' "$kept" > /etc/hosts       # in place: /etc/hosts may be a bind mount
  fi
}

stop() {
  local name pid
  for name in "${NODES[@]/#/slurmd-}" slurmctld munged; do
    [ -f "$DIR/run/$name.pid" ] || continue
    pid=$(cat "$DIR/run/$name.pid")
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/run/$name.pid"
  done
  unname
}

if [ "$1" = env ]; then
  echo "export SLURM_CONF=$SLURM_CONF"
  exit 0
fi
if [ "$1" = down ]; then
  [ -d "$DIR" ] || exit 0
  # the jobs first: their slurmstepd and tasks would outlive slurmd
  if [ -f "$DIR/run/slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null; then
    scancel --partition=local 2>/dev/null || true
    for _ in $(seq 60); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  stop
  echo "local_slurm.sh: down (logs kept in $DIR/log)"
  exit 0
fi

for cmd in munged slurmctld slurmd sinfo sbatch srun scontrol; do
  command -v "$cmd" >/dev/null \
    || die "$cmd not found; install the packages slurm-wlm and munge (apt-get install -y slurm-wlm munge)"
done
[ "$(id -u)" -eq 0 ] || die "needs root (slurmd starts jobs as their submitting user); run it with sudo"
for name in "${PIDS[@]}"; do
  if [ -f "$DIR/run/$name.pid" ] && kill -0 "$(cat "$DIR/run/$name.pid")" 2>/dev/null; then
    die "already up ($name, pid $(cat "$DIR/run/$name.pid")); $0 down first"
  fi
done

mkdir -p "$DIR"/{run,log,state,spool,dev} "${NODES[@]/#/$DIR/spool/}"
chmod 0755 "$DIR" "$DIR/run"
if [ ! -s "$DIR/munge.key" ]; then
  (umask 077; dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 status=none)
fi
chmod 0400 "$DIR/munge.key"
CPUS=$(nproc)
cat > "$DIR/slurm.conf" <<EOF
# written by docs/cluster/local_slurm.sh: two nodes on 127.0.0.1 (multiple-slurmd)
ClusterName=local
# job ids (JAX's and TF's SLURM ports: 61440 + id mod 4096) from a random start
FirstJobId=$((RANDOM % 4000 + 1))
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/run/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
GresTypes=gpu
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT + 1)) CPUs=$CPUS Gres=gpu:1 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT + 2)) CPUs=$CPUS Gres=gpu:1 State=UNKNOWN
PartitionName=local Nodes=n1,n2 Default=YES MaxTime=INFINITE OverSubscribe=FORCE:2 State=UP
EOF
# SLURM drops a file-less GPU and wants a device file: /dev/null's numbers, in our folder
[ -c "$DIR/dev/gpu0" ] || mknod "$DIR/dev/gpu0" c 1 3 || die "mknod $DIR/dev/gpu0 failed"
cat > "$DIR/gres.conf" <<EOF
# one notional GPU a node: the scheduler grants it (CUDA_VISIBLE_DEVICES=0), the work runs on the CPU
NodeName=n[1-2] Name=gpu File=$DIR/dev/gpu0
EOF

fail() {
  stop
  die "$1"
}

# JAX's SLURM detection and TF's SlurmClusterResolver address the tasks by their node names:
# n1 and n2 resolve to 127.0.0.1 through /etc/hosts lines tagged with this folder (`down`
# removes them; a name that already resolves is left as it is).
for node in "${NODES[@]}"; do
  getent hosts "$node" >/dev/null || echo "127.0.0.1 $node $HOSTS_TAG" >> /etc/hosts \
    || fail "cannot add $node to /etc/hosts"
done

munged --key-file="$DIR/munge.key" --socket="$DIR/run/munge.socket" \
  --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
  --seed-file="$DIR/state/munged.seed" --force 2>>"$DIR/log/munged.log" \
  || fail "munged did not start; see $DIR/log/munged.log"
slurmctld -c 2>>"$DIR/log/slurmctld.log" || fail "slurmctld did not start; see $DIR/log/slurmctld.log"
for node in "${NODES[@]}"; do
  slurmd -N "$node" 2>>"$DIR/log/slurmd-$node.log" \
    || fail "slurmd -N $node did not start; see $DIR/log/slurmd-$node.log"
done

deadline=$((SECONDS + WAIT_S))
while :; do
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | tr '\n' ' ' || true)
  [ "$states" = "n1 idle n2 idle " ] && break
  if [ $SECONDS -ge $deadline ]; then
    fail "n1 and n2 not idle after ${WAIT_S} s (sinfo: '${states:-no answer}'); see $DIR/log/"
  fi
  sleep 0.5
done
echo "local_slurm.sh: up: nodes n1 n2 idle (SLURM_CONF=$SLURM_CONF; logs in $DIR/log)"
