#!/bin/bash
# teardown.sh - power off a harness booted by boot.sh, kill stragglers, remove
# its cgroup and state dir. Idempotent: a second run, or a run for a harness
# that never booted, just says so and exits 0. Exits 1 only when something of
# the harness is still left behind.
#   HARNESS_NAME, HARNESS_STATE: as given to boot.sh
#   HARNESS_STOP_TIMEOUT: seconds to wait for a clean poweroff (default 20)
set -uo pipefail
HARNESS_NAME=${HARNESS_NAME:-ptrain-harness}
STATE=${HARNESS_STATE:-${TMPDIR:-/tmp}/$HARNESS_NAME}
STOP_TIMEOUT=${HARNESS_STOP_TIMEOUT:-20}

if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    CGMNT=/sys/fs/cgroup
else
    CGMNT=/sys/fs/cgroup/unified
fi
UPID=$(cat "$STATE/unshare.pid" 2>/dev/null || true)
SPID=$(cat "$STATE/systemd.pid" 2>/dev/null || true)
CG=$(cat "$STATE/cgroup.path" 2>/dev/null || echo "$CGMNT/$HARNESS_NAME")
case "$CG" in "$CGMNT"/?*) ;; *) echo "teardown: odd cgroup path '$CG'"; exit 1;; esac

if [ ! -d "$STATE" ] && [ ! -d "$CG" ]; then
    echo "teardown: nothing to do for $HARNESS_NAME ($STATE)"
    exit 0
fi

# alive PID COMM: running (not zombie) and really ours (guards against PID reuse)
alive() {
    [ -n "$1" ] && [ -r "/proc/$1/status" ] || return 1
    grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null && return 1
    [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}
if alive "$SPID" systemd && [ "$(readlink "/proc/$SPID/ns/pid")" != "$(readlink /proc/self/ns/pid)" ]; then
    kill -s SIGRTMIN+4 "$SPID"            # systemd: start poweroff.target
    for _ in $(seq 1 $((STOP_TIMEOUT * 10))); do alive "$SPID" systemd || break; sleep 0.1; done
    # PID 1 of a pid namespace: SIGKILL takes every process of the namespace with it
    if alive "$SPID" systemd; then
        echo "teardown: poweroff timed out after ${STOP_TIMEOUT}s, SIGKILL"
        kill -KILL "$SPID"
    fi
fi
for _ in $(seq 1 50); do alive "$UPID" unshare || break; sleep 0.1; done
alive "$UPID" unshare && kill -KILL "$UPID"

# `nsenter --target $SPID ...` (enter.sh, Harness::command) runs outside the
# harness and waits for its child inside. At poweroff systemd SIGSTOPs every
# process of the namespace; nsenter then stops itself too (it mirrors its
# child's stops) and nothing ever continues it: it would stay stopped for
# good, holding its caller's stdout/stderr open (a CI log pipe never ends).
# Its child is gone with the namespace: SIGCONT lets it reap it and exit.
if [ -n "$SPID" ]; then
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = nsenter ] || continue
        if tr '\0' '\n' < "$p/cmdline" 2>/dev/null | grep -qx -- "--target=$SPID\|$SPID"; then
            kill -CONT "${p#/proc/}" 2>/dev/null
        fi
    done
fi

# remove the cgroup subtree (leaf first); anything still inside it was started
# in the harness, so cgroup.kill (Linux >= 5.14) may end it
if [ -d "$CG" ]; then
    for i in $(seq 1 50); do
        find "$CG" -depth -type d -exec rmdir {} \; 2>/dev/null
        [ -d "$CG" ] || break
        [ "$i" = 20 ] && [ -e "$CG/cgroup.kill" ] && echo 1 > "$CG/cgroup.kill"
        sleep 0.1
    done
    if [ -d "$CG" ]; then
        echo "teardown: cgroup $CG is not empty; processes:"
        find "$CG" -name cgroup.procs -exec cat {} + | while read -r p; do
            echo "  $p $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)"
        done
        exit 1
    fi
fi
if [ -e "$STATE/.ptrain-harness" ] && mountpoint -q "$STATE/run" 2>/dev/null; then
    umount -l "$STATE/run"
fi
if [ -d "$STATE" ]; then
    if [ -e "$STATE/.ptrain-harness" ] || [ -z "$(ls -A "$STATE")" ]; then
        rm -rf "$STATE"
    else
        echo "teardown: $STATE is not a harness state dir; left it alone"
        exit 1
    fi
fi
echo "teardown: $HARNESS_NAME done"
