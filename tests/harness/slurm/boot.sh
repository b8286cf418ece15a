#!/bin/bash
# boot.sh - boot a throw-away *real* multi-node Slurm cluster on this one
# machine: one munged, one slurmctld and N slurmd "hosts", each in a network
# namespace of its own (own address, own hostname through a UTS namespace),
# each slurmd declaring fake GPUs through gres.conf. The submit host (where
# ptraind and `sbatch` run) is the root namespace: it reaches slurmctld over a
# veth the script makes. Used by tests of the Slurm backend (issue 24).
#
#   sudo tests/harness/slurm/boot.sh              # boots, waits until every node is idle
#   eval "$(sudo tests/harness/slurm/boot.sh)"    # ... and takes its exports (stdout has only those)
#   sudo tests/harness/slurm/teardown.sh          # stops it and removes every trace
#
# Environment (all optional):
#   SLURM_HARNESS_NAME       cluster name; prefixes the network namespaces
#                            (default ptrain-slurm; [a-z0-9-], at most 32 chars)
#   SLURM_HARNESS_STATE      state dir (default ${TMPDIR:-/tmp}/$SLURM_HARNESS_NAME):
#                            etc/slurm.conf, munge/, log/, jobcomp/, nodes/<node>/dev/
#   SLURM_HARNESS_NODES      number of slurmd nodes (default 2, at most 50), named
#                            ${SLURM_HARNESS_NODE_PREFIX:-node}1..N
#   SLURM_HARNESS_GPUS       GPUs per node (default 2, at most 16; 0: no gres)
#   SLURM_HARNESS_GPU_TYPE   gres type (model), as in --gres=gpu:TYPE:N (default tesla;
#                            empty: untyped gpu:N)
#   SLURM_HARNESS_CPUS       CPUs each node declares (default 4; need not exist)
#   SLURM_HARNESS_MEM_MB     RealMemory each node declares in MB (default 4096)
#   SLURM_HARNESS_PARTITION  the one partition, Default=YES (default gpu)
#   SLURM_HARNESS_SUBNET     first three octets of the cluster's /24 (default
#                            10.213.X, X derived from the name); .1 is the submit
#                            host's veth, .2 slurmctld, .11.. the nodes
#   SLURM_HARNESS_MIN_JOB_AGE  MinJobAge, seconds an ended job stays in squeue/scontrol
#                            (default 10)
#   SLURM_HARNESS_JOBCOMP_HOOK an executable run (as root, on the controller) after
#                            each job completion record is written, with that job's
#                            record in its environment (see README.md)
#   SLURM_HARNESS_EXTRA_CONF lines appended to slurm.conf (they override earlier keys)
#   SLURM_HARNESS_BOOT_TIMEOUT seconds to wait for the controller and nodes (default 60)
#   SLURM_HARNESS_KEEP_ON_FAILURE=1  leave a cluster that failed to boot for inspection
#
# Needs (Debian 12): slurm-wlm munge (apt-get install --no-install-recommends
# slurm-wlm munge), iproute2, util-linux. Root. Outside its state dir it
# creates only network namespaces named $NAME.* and one veth in the root
# namespace (teardown.sh removes both); no daemon listens on a host interface.
set -eEuo pipefail   # -E: the ERR trap below fires inside functions too

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=${SLURM_HARNESS_NAME:-ptrain-slurm}
STATE=${SLURM_HARNESS_STATE:-${TMPDIR:-/tmp}/$NAME}
NODES=${SLURM_HARNESS_NODES:-2}
GPUS=${SLURM_HARNESS_GPUS:-2}
GPU_TYPE=${SLURM_HARNESS_GPU_TYPE-tesla}
CPUS=${SLURM_HARNESS_CPUS:-4}
MEM_MB=${SLURM_HARNESS_MEM_MB:-4096}
PARTITION=${SLURM_HARNESS_PARTITION:-gpu}
NODE_PREFIX=${SLURM_HARNESS_NODE_PREFIX:-node}
MIN_JOB_AGE=${SLURM_HARNESS_MIN_JOB_AGE:-10}
JOBCOMP_HOOK=${SLURM_HARNESS_JOBCOMP_HOOK:-}
EXTRA_CONF=${SLURM_HARNESS_EXTRA_CONF:-}
BOOT_TIMEOUT=${SLURM_HARNESS_BOOT_TIMEOUT:-60}
T0=$(date +%s.%N)

die() { echo "slurm/boot.sh: $*" >&2; exit 1; }
# until there is something to clean up (below), an unexpected error just says where
trap 'echo "slurm/boot.sh: unexpected error at line $LINENO: $BASH_COMMAND" >&2; exit 1' ERR
say() { echo "slurm/boot.sh: $*" >&2; }
num() { [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] && [ "$2" -le "$4" ] || die "$1='$2' must be a number from $3 to $4"; }

# --- checks that need no cleanup ---------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root"
for b in slurmctld slurmd sinfo scontrol sbatch; do
    command -v "$b" >/dev/null || die "missing $b: apt-get install -y --no-install-recommends slurm-wlm munge"
done
for b in munged mungekey; do
    command -v "$b" >/dev/null || die "missing $b: apt-get install -y --no-install-recommends munge"
done
for b in ip unshare nsenter mknod setsid; do
    command -v "$b" >/dev/null || die "missing $b: apt-get install iproute2 util-linux coreutils"
done
for p in auth_munge cred_munge select_cons_tres proctrack_linuxproc task_none jobcomp_script gres_gpu sched_backfill; do
    compgen -G "/usr/lib/*/slurm-wlm/$p.so" >/dev/null || compgen -G "/usr/lib*/slurm/$p.so" >/dev/null ||
        die "Slurm plugin $p.so not found: apt-get install -y --no-install-recommends slurm-wlm-basic-plugins"
done
[[ $NAME =~ ^[a-z0-9][a-z0-9-]*$ ]] && [ ${#NAME} -le 32 ] ||
    die "bad SLURM_HARNESS_NAME '$NAME' (use [a-z0-9-], at most 32 chars: it is the cluster name and a hostname prefix)"
[[ $NODE_PREFIX =~ ^[a-z][a-z0-9-]*[a-z-]$|^[a-z]$ ]] && [ ${#NODE_PREFIX} -le 20 ] ||
    die "bad SLURM_HARNESS_NODE_PREFIX '$NODE_PREFIX' ([a-z][a-z0-9-]*, not ending in a digit)"
[[ $PARTITION =~ ^[A-Za-z0-9_-]+$ ]] || die "bad SLURM_HARNESS_PARTITION '$PARTITION'"
[ -z "$GPU_TYPE" ] || [[ $GPU_TYPE =~ ^[a-z][a-z0-9_]*$ ]] || die "bad SLURM_HARNESS_GPU_TYPE '$GPU_TYPE' ([a-z][a-z0-9_]*)"
num SLURM_HARNESS_NODES "$NODES" 1 50
num SLURM_HARNESS_GPUS "$GPUS" 0 16
num SLURM_HARNESS_CPUS "$CPUS" 1 1024
num SLURM_HARNESS_MEM_MB "$MEM_MB" 256 16777216
num SLURM_HARNESS_MIN_JOB_AGE "$MIN_JOB_AGE" 0 86400
num SLURM_HARNESS_BOOT_TIMEOUT "$BOOT_TIMEOUT" 1 3600
[[ $STATE = /?* ]] || die "SLURM_HARNESS_STATE '$STATE' must be an absolute path other than /"
STATE=${STATE%/}
MUNGE_SOCKET=$STATE/munge/munge.socket.2
[ ${#MUNGE_SOCKET} -lt 100 ] || die "state dir path too long: $MUNGE_SOCKET exceeds the unix socket path limit"
if [ -n "$JOBCOMP_HOOK" ]; then
    [ -x "$JOBCOMP_HOOK" ] || die "SLURM_HARNESS_JOBCOMP_HOOK '$JOBCOMP_HOOK' is not executable"
    JOBCOMP_HOOK=$(readlink -f "$JOBCOMP_HOOK")
fi

# the /24: default 10.213.X with X from the name, so clusters with different
# names usually run side by side; it must not be routed anywhere yet
if [ -n "${SLURM_HARNESS_SUBNET:-}" ]; then
    SUBNET=$SLURM_HARNESS_SUBNET
else
    SUBNET=10.213.$(( $(printf %s "$NAME" | cksum | cut -d' ' -f1) % 250 + 1 ))
fi
[[ $SUBNET =~ ^(10|172|192)\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
    die "SLURM_HARNESS_SUBNET '$SUBNET' must be three octets of a private range, e.g. 10.213.7"
HOST_ADDR=$SUBNET.1
CTL_ADDR=$SUBNET.2
CTL_HOST=$NAME-ctl
# netns names; the root-namespace end of the submit host's veth (<= 15 chars)
NS_SW=$NAME.sw      # "$NAME." cannot prefix another cluster's names ('.' is not in a name)
NS_CTL=$NAME.ctl
HOST_IF=psl$(printf %s "$NAME" | cksum | cut -d' ' -f1 | xargs printf %08x | cut -c1-8)
node_name() { echo "$NODE_PREFIX$1"; }
node_addr() { echo "$SUBNET.$((10 + $1))"; }
ns_node() { echo "$NAME.$(node_name "$1")"; }

# --- leftovers -----------------------------------------------------------------
alive() {   # PID COMM: running (not zombie) and really that program
    [ -n "$1" ] && [ -r "/proc/$1/status" ] || return 1
    grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null && return 1
    [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}
ours_ns=$(ip netns list 2>/dev/null | awk -v p="$NAME." 'index($1, p) == 1 {print $1}')
if [ -n "$ours_ns" ] || ip link show "$HOST_IF" >/dev/null 2>&1 ||
   alive "$(cat "$STATE/run/munged.pid" 2>/dev/null)" munged; then
    die "a cluster named $NAME is already up (or left over: ${ours_ns//$'\n'/ } $HOST_IF); run SLURM_HARNESS_NAME=$NAME SLURM_HARNESS_STATE=$STATE $HERE/teardown.sh first"
fi
if ip -4 route show table all | awk '{print $1, $2}' | grep -q "$SUBNET\." || ip -4 addr show | grep -q "inet $SUBNET\."; then
    die "subnet $SUBNET.0/24 is already in use here ($(ip -4 route show table all | grep -m1 "$SUBNET\.")); set SLURM_HARNESS_SUBNET to a free one"
fi
# never rm -rf a directory this script did not create
if [ -e "$STATE" ] && [ ! -e "$STATE/.ptrain-slurm-harness" ] && [ -n "$(ls -A "$STATE" 2>/dev/null)" ]; then
    die "$STATE exists and is not a Slurm harness state dir; refusing to remove it"
fi
rm -rf "$STATE"
mkdir -p "$STATE"
chmod 755 "$STATE"
: > "$STATE/.ptrain-slurm-harness"   # teardown.sh removes only dirs carrying this marker

diagnostics() {
    for f in "$STATE"/log/slurmctld.log "$STATE"/log/slurmd-*.log "$STATE"/log/*.out; do
        [ -s "$f" ] || continue
        echo "----- $f (tail) -----"
        tail -n 25 "$f"
    done
    if [ -S "$MUNGE_SOCKET" ]; then
        echo "----- sinfo -----"
        SLURM_CONF=$STATE/etc/slurm.conf timeout 10 sinfo -N -o '%N %T %G %E' 2>&1
    fi
    echo "-----"
}
fail() {
    trap - ERR
    echo "slurm/boot.sh: $*" >&2
    diagnostics >&2 || true
    if [ "${SLURM_HARNESS_KEEP_ON_FAILURE:-0}" = 1 ]; then
        echo "slurm/boot.sh: SLURM_HARNESS_KEEP_ON_FAILURE=1: left it up; run SLURM_HARNESS_NAME=$NAME SLURM_HARNESS_STATE=$STATE $HERE/teardown.sh" >&2
    else
        SLURM_HARNESS_NAME=$NAME SLURM_HARNESS_STATE=$STATE "$HERE/teardown.sh" >&2 || true
    fi
    exit 1
}
trap 'fail "unexpected error at line $LINENO: $BASH_COMMAND"' ERR

# --- state dir -------------------------------------------------------------------
mkdir -p "$STATE"/etc "$STATE"/munge "$STATE"/run "$STATE"/log "$STATE"/ctld \
         "$STATE"/spool "$STATE"/jobcomp/records "$STATE"/nodes
chmod 755 "$STATE"/etc "$STATE"/run "$STATE"/log "$STATE"/jobcomp "$STATE"/jobcomp/records "$STATE"/nodes
chmod 700 "$STATE"/ctld
chmod 755 "$STATE"/spool       # slurmd makes each job a dir there that the job's user enters
chmod 755 "$STATE"/munge        # munged refuses a socket dir writable by others

# fake GPUs: character devices (NVIDIA's major 195), one set per node. slurmd
# only stat()s them: it waits ("Waiting for gres.conf file") while a File= path
# is missing and rejects a regular file ("not a valid character or block
# device"); with task/none nothing opens them, so their numbers need not be real.
for i in $(seq 1 "$NODES"); do
    d=$STATE/nodes/$(node_name "$i")/dev
    mkdir -p "$d"
    for g in $(seq 0 $((GPUS - 1))); do
        mknod -m 666 "$d/nvidia$g" c 195 "$g"
    done
done

# --- munge: its own key, its own daemon and socket (in the foreground it logs to
# stderr: log/munged.out) ---------------------------------------------------------
mungekey --create --keyfile="$STATE/munge/munge.key" >/dev/null 2>"$STATE/log/mungekey.log" ||
    fail "mungekey failed: $(cat "$STATE/log/mungekey.log")"
chmod 400 "$STATE/munge/munge.key"
# PIDFILE COMM LOG: fail at once if that daemon is gone. Only whether the pid
# lives: until the exec chain below reaches the daemon, its comm is nsenter,
# unshare, sh, setsid or env.
need_alive() {
    local pid
    pid=$(cat "$1")
    [ -n "$pid" ] || fail "$1 is empty"
    [ -r "/proc/$pid/status" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null ||
        fail "$2 exited (see $3)"
}
# setsid in a background job: the job is no process group leader, so setsid
# does not fork and $! is the daemon's own pid. munged's own pid file is
# another one: it truncates and rewrites it while starting.
setsid munged --foreground --socket="$MUNGE_SOCKET" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/munge/munged.pid" \
    --seed-file="$STATE/munge/munged.seed" --num-threads=4 \
    </dev/null >>"$STATE/log/munged.out" 2>&1 &
echo $! > "$STATE/run/munged.pid"

wait_for() {   # WHAT SECONDS CMD...: run CMD every 0.1-0.5 s until it succeeds (CMD silences itself)
    local what=$1 until=$(( $(date +%s) + $2 )) delay=0.1
    shift 2
    until "$@"; do
        [ "$(date +%s)" -lt "$until" ] || fail "timed out waiting for $what"
        sleep "$delay"
        delay=$( [ "$delay" = 0.1 ] && echo 0.2 || echo 0.5 )
    done
}
munge_ok() {
    need_alive "$STATE/run/munged.pid" munged "$STATE/log/munged.out"
    munge -S "$MUNGE_SOCKET" -n </dev/null 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1
}
wait_for "munged on $MUNGE_SOCKET (log: $STATE/log/munged.out)" 15 munge_ok

# --- network: a switch namespace with a bridge; every host has a veth into it ----
ip netns add "$NS_SW"
ip -n "$NS_SW" link set lo up
ip -n "$NS_SW" link add br0 type bridge
ip -n "$NS_SW" link set br0 up
# the submit host (root namespace)
ip link add "$HOST_IF" type veth peer name host netns "$NS_SW"
[ -w "/proc/sys/net/ipv6/conf/$HOST_IF/disable_ipv6" ] && echo 1 > "/proc/sys/net/ipv6/conf/$HOST_IF/disable_ipv6"
ip addr add "$HOST_ADDR/24" dev "$HOST_IF"
ip link set "$HOST_IF" up
ip -n "$NS_SW" link set host master br0 up
add_host() {   # NETNS PORTNAME ADDR
    ip netns add "$1"
    ip -n "$1" link set lo up
    ip -n "$NS_SW" link add "$2" type veth peer name eth0 netns "$1"
    ip -n "$NS_SW" link set "$2" master br0 up
    ip netns exec "$1" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6' 2>/dev/null || true
    ip -n "$1" addr add "$3/24" dev eth0
    ip -n "$1" link set eth0 up
}
add_host "$NS_CTL" ctl "$CTL_ADDR"
for i in $(seq 1 "$NODES"); do add_host "$(ns_node "$i")" "n$i" "$(node_addr "$i")"; done
# never let cluster traffic leave through the host's default route
ip route get "$CTL_ADDR" | grep -q " dev $HOST_IF " ||
    fail "route to $CTL_ADDR does not go through $HOST_IF: $(ip route get "$CTL_ADDR")"

# --- slurm.conf, gres.conf, the completion script --------------------------------
CONF=$STATE/etc/slurm.conf
GRES_NODE=""
if [ "$GPUS" -gt 0 ]; then GRES_NODE=" Gres=gpu:${GPU_TYPE:+$GPU_TYPE:}$GPUS"; fi
{
cat <<EOF
# generated by $HERE/boot.sh for cluster $NAME
ClusterName=$NAME
SlurmctldHost=$CTL_HOST($CTL_ADDR)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# every client and daemon talks to this cluster's own munged
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$STATE/etc/plugstack.conf
MailProg=/bin/true
# PID 1 is not systemd here: no cgroup plugins
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# no slurmdbd: no sacct; a completion record per job through jobcomp/script
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/script
JobCompLoc=$STATE/etc/jobcomp.sh
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2,batch_sched_delay=0,sched_min_interval=0
PriorityType=priority/basic
EnforcePartLimits=ALL
MaxArraySize=100001
MaxJobCount=100000
MinJobAge=$MIN_JOB_AGE
KillWait=2
OverTimeLimit=0
InactiveLimit=0
Waittime=0
MessageTimeout=10
SlurmdTimeout=30
SlurmctldTimeout=30
ReturnToService=2
# nodes declare more CPUs/memory than this machine has
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
GresTypes=gpu
EOF
for i in $(seq 1 "$NODES"); do
    echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$CPUS RealMemory=$MEM_MB$GRES_NODE State=UNKNOWN"
done
echo "PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
if [ -n "$EXTRA_CONF" ]; then echo "# SLURM_HARNESS_EXTRA_CONF"; printf '%s\n' "$EXTRA_CONF"; fi
} > "$CONF"
: > "$STATE/etc/plugstack.conf"   # no SPANK plugins (not the host's /etc/slurm one)
{
    echo "# generated by $HERE/boot.sh: each node's own fake device files"
    if [ "$GPUS" -gt 0 ]; then
        for i in $(seq 1 "$NODES"); do
            echo "NodeName=$(node_name "$i") Name=gpu${GPU_TYPE:+ Type=$GPU_TYPE} File=$STATE/nodes/$(node_name "$i")/dev/nvidia[0-$((GPUS - 1))]"
        done
    fi
} > "$STATE/etc/gres.conf"

# jobcomp/script: slurmctld runs this (as root, on the controller) after each
# job ends, with the job in its environment (JOBID, JOBSTATE, EXITCODE, ...).
# It writes jobcomp/records/<JOBID> (the environment, sorted, KEY=VALUE lines)
# atomically, and appends one summary line to jobcomp/index.
cat > "$STATE/etc/jobcomp.sh" <<EOF
#!/bin/sh
# generated by $HERE/boot.sh: slurmctld's JobCompLoc
dir=$STATE/jobcomp
hook=$JOBCOMP_HOOK
EOF
cat >> "$STATE/etc/jobcomp.sh" <<'EOF'
umask 022
id=${JOBID:?no JOBID}
env | LC_ALL=C sort > "$dir/records/.$id.tmp" && mv -f "$dir/records/.$id.tmp" "$dir/records/$id"
printf '%s %s %s %s %s %s %s %s\n' "$id" "${ARRAYJOBID:-0}_${ARRAYTASKID:-}" "$JOBSTATE" \
    "${EXITCODE:-}" "${UID:-}" "${NODES:-}" "${START:-}" "${END:-}" >> "$dir/index"
[ -z "$hook" ] || "$hook" </dev/null >>"$dir/hook.log" 2>&1
exit 0
EOF
chmod 755 "$STATE/etc/jobcomp.sh"
: > "$STATE/jobcomp/index"; chmod 644 "$STATE/jobcomp/index"

cat > "$STATE/env.sh" <<EOF
export SLURM_CONF=$CONF
EOF
# on.sh HOST CMD...: run CMD "on" a host of the cluster (its netns and hostname)
cat > "$STATE/on.sh" <<EOF
#!/bin/bash
# generated by $HERE/boot.sh: run a command on a host of cluster $NAME
# usage: on.sh ctl|NODE CMD...   (root)
set -euo pipefail
h=\${1:?usage: on.sh ctl|NODE CMD...}; shift
if [ "\$h" = ctl ]; then pidf=$STATE/run/slurmctld.daemon.pid; else pidf=$STATE/run/slurmd-\$h.daemon.pid; fi
pid=\$(cat "\$pidf" 2>/dev/null) || { echo "on.sh: no such host \$h (or it is down)" >&2; exit 1; }
exec nsenter --target "\$pid" --net --uts -- env SLURM_CONF=$CONF "\$@"
EOF
chmod 755 "$STATE/on.sh"

# --- daemons -----------------------------------------------------------------------
DAEMON_ENV=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 SLURM_CONF="$CONF")
# NETNS HOSTNAME LOG CMD...: start CMD in NETNS with a UTS namespace of its own
# named HOSTNAME. nsenter --net, not `ip netns exec`: that one also makes a
# mount namespace with a sysfs of its own, without /sys/fs/cgroup, and slurmd
# 22.05 dies without a cgroup mount even with proctrack/linuxproc and task/none.
# Every step execs the next (setsid forks only in a process group leader, and
# a background job of a script is none), so $! is the daemon's pid.
start_on() {
    local ns=$1 hn=$2 log=$3
    shift 3
    nsenter --net="/run/netns/$ns" -- unshare --uts -- \
        /bin/sh -c 'hostname "$0" && exec "$@"' "$hn" setsid "${DAEMON_ENV[@]}" "$@" \
        </dev/null >>"$log" 2>&1 &
    LAST_PID=$!
}
start_on "$NS_CTL" "$CTL_HOST" "$STATE/log/slurmctld.out" slurmctld -D -f "$CONF"
echo "$LAST_PID" > "$STATE/run/slurmctld.daemon.pid"
ctl_ok() {
    need_alive "$STATE/run/slurmctld.daemon.pid" slurmctld "$STATE/log/slurmctld.out, slurmctld.log"
    SLURM_CONF=$CONF timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'
}
wait_for "slurmctld at $CTL_ADDR:6817 (log: $STATE/log/slurmctld.log)" "$BOOT_TIMEOUT" ctl_ok
for i in $(seq 1 "$NODES"); do
    n=$(node_name "$i")
    mkdir -p "$STATE/spool/$n"
    start_on "$(ns_node "$i")" "$n" "$STATE/log/slurmd-$n.out" slurmd -D -N "$n" -f "$CONF"
    echo "$LAST_PID" > "$STATE/run/slurmd-$n.daemon.pid"
done
nodes_idle() {
    local s i
    for i in $(seq 1 "$NODES"); do
        need_alive "$STATE/run/slurmd-$(node_name "$i").daemon.pid" "slurmd $(node_name "$i")" "$STATE/log/slurmd-$(node_name "$i").out, .log"
    done
    s=$(SLURM_CONF=$CONF timeout 5 sinfo -h -N -p "$PARTITION" -o '%N %T' 2>/dev/null) || return 1
    [ "$(echo "$s" | grep -c ' idle$')" = "$NODES" ]
}
wait_for "all $NODES nodes idle in sinfo" "$BOOT_TIMEOUT" nodes_idle
if [ "$GPUS" -gt 0 ]; then
    want="gpu:${GPU_TYPE:+$GPU_TYPE:}$GPUS"
    got=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %G' | grep -vc "$want" || true)
    [ "$got" = 0 ] || fail "not every node has $want: $(SLURM_CONF=$CONF sinfo -h -N -o '%N %G' | tr '\n' ' ')"
fi
# the pid files now name the daemons themselves (teardown.sh and on.sh use them)
alive "$(cat "$STATE/run/slurmctld.daemon.pid")" slurmctld || fail "$STATE/run/slurmctld.daemon.pid is not slurmctld"
for i in $(seq 1 "$NODES"); do
    alive "$(cat "$STATE/run/slurmd-$(node_name "$i").daemon.pid")" slurmd || fail "$STATE/run/slurmd-$(node_name "$i").daemon.pid is not slurmd"
done
trap - ERR

T1=$(date +%s.%N)
say "cluster $NAME up in $(awk "BEGIN{printf \"%.1f\", $T1 - $T0}")s: slurmctld $CTL_HOST at $CTL_ADDR:6817," \
    "nodes $(for i in $(seq 1 "$NODES"); do printf '%s(%s) ' "$(node_name "$i")" "$(node_addr "$i")"; done)" \
    "partition $PARTITION, ${GPUS} GPU(s)/node; completion records in $STATE/jobcomp/records/"
cat "$STATE/env.sh"
