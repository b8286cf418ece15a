#!/bin/bash
# teardown.sh - stop a Slurm cluster booted by boot.sh (munged, slurmctld,
# every slurmd and every job still running on a node), delete its network
# namespaces and veth and remove its state dir. Idempotent: a second run, or
# a run for a cluster that never booted, says so and exits 0. Exits 1 only
# when something of the cluster is still left behind.
#   SLURM_HARNESS_NAME, SLURM_HARNESS_STATE: as given to boot.sh
#   SLURM_HARNESS_STOP_TIMEOUT: seconds from SIGTERM to SIGKILL (default 5)
set -uo pipefail
NAME=${SLURM_HARNESS_NAME:-ptrain-slurm}
STATE=${SLURM_HARNESS_STATE:-${TMPDIR:-/tmp}/$NAME}
STATE=${STATE%/}
STOP_TIMEOUT=${SLURM_HARNESS_STOP_TIMEOUT:-5}
[ "$(id -u)" = 0 ] || { echo "slurm/teardown.sh: must run as root" >&2; exit 1; }
[[ $NAME =~ ^[a-z0-9][a-z0-9-]*$ ]] || { echo "slurm/teardown.sh: bad SLURM_HARNESS_NAME '$NAME'" >&2; exit 1; }
# as in boot.sh
HOST_IF=psl$(printf %s "$NAME" | cksum | cut -d' ' -f1 | xargs printf %08x | cut -c1-8)

alive() {   # PID COMM: running (not zombie) and really that program (guards against PID reuse)
    [ -n "$1" ] && [ -r "/proc/$1/status" ] || return 1
    grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null && return 1
    [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}
# the cluster's network namespaces: "$NAME." prefixes no other cluster's
namespaces() { ip netns list 2>/dev/null | awk -v p="$NAME." 'index($1, p) == 1 {print $1}'; }
# every process in them: slurmctld, slurmd, slurmstepd, jobs, on.sh commands
ns_pids() { local ns; for ns in $(namespaces); do ip netns pids "$ns" 2>/dev/null; done; }
# munged: boot.sh's pid file, else munged's own (boot.sh killed before writing its own)
MUNGED=""
for f in "$STATE/run/munged.pid" "$STATE/munge/munged.pid"; do
    p=$(cat "$f" 2>/dev/null || true)
    if alive "$p" munged; then MUNGED=$p; break; fi
done

if [ -z "$(namespaces)" ] && ! ip link show "$HOST_IF" >/dev/null 2>&1 && [ -z "$MUNGED" ] && [ ! -e "$STATE" ]; then
    echo "slurm/teardown.sh: nothing to do for $NAME ($STATE)"
    exit 0
fi

# every pid signalled is waited for until it is gone (or a zombie): a process
# leaves its netns early in its exit, so an empty `ip netns pids` is not enough
SIGNALLED=""
signal_all() {   # SIGNAL
    local p sig
    for p in $(ns_pids) $MUNGED; do
        sig=$1
        # slurmstepd ignores SIGTERM (it would wait for its job): no job here is worth that
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmstepd ] && sig=KILL
        kill "-$sig" "$p" 2>/dev/null && SIGNALLED="$SIGNALLED $p"
    done
}
running() {   # PID: exists and is no zombie
    [ -r "/proc/$1/status" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null
}
gone() {
    local p
    [ -z "$(ns_pids)" ] || return 1
    for p in $SIGNALLED; do ! running "$p" || return 1; done
}
wait_gone() {   # SECONDS
    local deadline=$(( $(date +%s) + $1 ))
    while ! gone && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
    gone
}
signal_all TERM
if ! wait_gone "$STOP_TIMEOUT"; then
    echo "slurm/teardown.sh: still running after ${STOP_TIMEOUT}s, SIGKILL: $(ns_pids | tr '\n' ' ')$SIGNALLED"
    signal_all KILL
    for p in $SIGNALLED; do ! running "$p" || kill -KILL "$p" 2>/dev/null; done
    wait_gone 5
fi
left=""
if ! gone; then
    left="processes"
    for p in $(ns_pids) $SIGNALLED; do ! running "$p" || left="$left $p"; done
    left="$left;"
fi
for ns in $(namespaces); do ip netns delete "$ns" || left="$left netns $ns;"; done
# deleting the switch namespace took the veth pair with it; this is for a half-made one
if ip link show "$HOST_IF" >/dev/null 2>&1; then
    ip link delete "$HOST_IF" || left="$left link $HOST_IF;"
fi
if [ -d "$STATE" ]; then
    if [ -e "$STATE/.ptrain-slurm-harness" ] || [ -z "$(ls -A "$STATE")" ]; then
        rm -rf "$STATE" || left="$left $STATE;"
    else
        echo "slurm/teardown.sh: $STATE is not a Slurm harness state dir; left it alone"
        exit 1
    fi
fi
if [ -n "$left" ]; then
    echo "slurm/teardown.sh: left behind: $left"
    exit 1
fi
echo "slurm/teardown.sh: $NAME done"
