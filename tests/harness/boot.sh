#!/bin/bash
# boot.sh - boot a throw-away *real* systemd (PID 1) with journald and the
# system D-Bus inside new pid/mount/uts/ipc/cgroup namespaces over the host
# root filesystem. Used by the integration tests (tests/integration/harness.rs)
# and by packaging/demo.sh on machines whose PID 1 is not systemd.
#
#   sudo tests/harness/boot.sh        # boots, waits until ready, prints how to reach it
#   sudo tests/harness/teardown.sh    # powers it off and removes every trace
#
# Environment (all optional):
#   HARNESS_NAME             cgroup, hostname and default state dir name
#                            (default ptrain-harness; [A-Za-z0-9._-], at most 64 chars).
#                            Harnesses with different names run side by side.
#   HARNESS_STATE            state dir (default ${TMPDIR:-/tmp}/$HARNESS_NAME); its run/
#                            is the harness's /run, so the bus socket and journal are
#                            reachable from the host.
#   HARNESS_FAKE_GPUS=N      mknod /dev/nvidia0..N-1, nvidiactl, nvidia-modeset,
#                            nvidia-uvm(-tools) in the private /dev when the host has no
#                            /dev/nvidia* (else the real nodes are bound in). Opening a
#                            fake node gives ENXIO where the device cgroup allows it and
#                            EPERM where DevicePolicy= denies it.
#   HARNESS_DBUS_POLICY_DIR  every *.conf in it is added to the harness's
#                            /etc/dbus-1/system.d (default: <repo>/packaging/dbus; empty:
#                            none). The host's /etc is never modified.
#   HARNESS_UNITS_DIR        copied into the harness's /run/systemd/system before boot
#                            (units, drop-in dirs, ptrain-harness.target.wants/ links).
#   HARNESS_JOURNAL_MAX      journald's RuntimeMaxUse= in the harness (default 64M;
#                            the journal is volatile, under the state dir's run/).
#   HARNESS_BOOT_TIMEOUT     seconds to wait for systemd + D-Bus (default 60).
#   HARNESS_KEEP_ON_FAILURE=1  leave a harness that failed to boot for inspection.
#   SYSTEMD_BIN              default /lib/systemd/systemd.
#
# Nothing on the host is changed except one cgroup directory
# (<cgroup2 mount>/$HARNESS_NAME) and the state directory.
# Requirements (Debian 12): systemd, dbus, util-linux (unshare/nsenter). Root.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HARNESS_NAME=${HARNESS_NAME:-ptrain-harness}
STATE=${HARNESS_STATE:-${TMPDIR:-/tmp}/$HARNESS_NAME}
BOOT_TIMEOUT=${HARNESS_BOOT_TIMEOUT:-60}
SYSTEMD_BIN=${SYSTEMD_BIN:-/lib/systemd/systemd}
HARNESS_FAKE_GPUS=${HARNESS_FAKE_GPUS:-0}
# no colon: an explicitly empty HARNESS_DBUS_POLICY_DIR means "no extra policy"
POLICY_DIR=${HARNESS_DBUS_POLICY_DIR-$HERE/../../packaging/dbus}
UNITS_DIR=${HARNESS_UNITS_DIR:-}
JOURNAL_MAX=${HARNESS_JOURNAL_MAX:-64M}

die() { echo "boot.sh: $*" >&2; exit 1; }

# --- checks that need no cleanup ---------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root"
for b in unshare nsenter mount mknod busctl systemctl journalctl dbus-daemon setsid; do
    command -v "$b" >/dev/null || die "missing $b (apt-get install systemd dbus util-linux)"
done
[ -x "$SYSTEMD_BIN" ] || die "missing $SYSTEMD_BIN"
[[ $HARNESS_NAME =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "bad HARNESS_NAME '$HARNESS_NAME' (use [A-Za-z0-9._-])"
[[ $JOURNAL_MAX =~ ^[0-9]+[KMG]?$ ]] || die "HARNESS_JOURNAL_MAX '$JOURNAL_MAX' must be a size such as 64M"
[ ${#HARNESS_NAME} -le 64 ] || die "HARNESS_NAME '$HARNESS_NAME' is longer than 64 chars (hostname limit)"
[[ $STATE = /?* ]] || die "HARNESS_STATE '$STATE' must be an absolute path other than /"
BUS_PATH=$STATE/run/dbus/system_bus_socket
[ ${#BUS_PATH} -lt 108 ] || die "state dir path too long: $BUS_PATH exceeds the 107-byte unix socket limit"
if ! [[ $HARNESS_FAKE_GPUS =~ ^[0-9]+$ ]] || [ "$HARNESS_FAKE_GPUS" -gt 64 ]; then
    die "HARNESS_FAKE_GPUS='$HARNESS_FAKE_GPUS' must be a number from 0 to 64"
fi
if [ -n "$POLICY_DIR" ]; then
    [ -d "$POLICY_DIR" ] || die "HARNESS_DBUS_POLICY_DIR '$POLICY_DIR' is not a directory"
    POLICY_DIR=$(cd "$POLICY_DIR" && pwd)
fi
if [ -n "$UNITS_DIR" ]; then
    [ -d "$UNITS_DIR" ] || die "HARNESS_UNITS_DIR '$UNITS_DIR' is not a directory"
fi
[ -S /run/systemd/private ] && [ -d /run/systemd/system ] && \
    echo "boot.sh: note: host already runs systemd; harness is still isolated" >&2

if [ -f "$STATE/systemd.pid" ] && [ -d "/proc/$(cat "$STATE/systemd.pid")" ] && \
   [ "$(cat "/proc/$(cat "$STATE/systemd.pid")/comm" 2>/dev/null)" = systemd ]; then
    die "already running (systemd pid $(cat "$STATE/systemd.pid")); run HARNESS_NAME=$HARNESS_NAME $HERE/teardown.sh first"
fi
# never rm -rf a directory this script did not create
if [ -e "$STATE" ] && [ ! -e "$STATE/.ptrain-harness" ] && [ -n "$(ls -A "$STATE" 2>/dev/null)" ]; then
    die "$STATE exists and is not a harness state dir; refusing to remove it"
fi

# --- cgroup: a dedicated cgroup2 directory becomes the container's cgroup root
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    CGMNT=/sys/fs/cgroup                       # pure v2 host
elif [ "$(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null)" = cgroup2fs ]; then
    CGMNT=/sys/fs/cgroup/unified               # hybrid v1+v2 host
else
    die "no cgroup2 hierarchy mounted"
fi
CG=$CGMNT/$HARNESS_NAME
ORIG_CG=$CGMNT$(sed -n 's/^0:://p' /proc/self/cgroup)
if [ -d "$CG" ]; then   # leftover from a crashed run: must be empty
    find "$CG" -depth -type d -exec rmdir {} \; 2>/dev/null || \
        die "$CG is busy; run HARNESS_NAME=$HARNESS_NAME $HERE/teardown.sh"
fi
# a crashed run may have left its /run mounted (teardown.sh unmounts it)
if mountpoint -q "$STATE/run" 2>/dev/null; then umount -l "$STATE/run"; fi
rm -rf "$STATE"
mkdir -p "$STATE/run"
: > "$STATE/.ptrain-harness"    # teardown.sh removes only dirs carrying this marker
# /run is a tmpfs on every systemd host: systemd's transient unit files, the
# units' runtime directories and the volatile journal churn no disk inodes,
# as in production (on a disk, each new inode elsewhere pays for them).
mount -t tmpfs -o mode=755,nosuid,nodev,size=1G tmpfs "$STATE/run"
mkdir "$CG"

# From here on a failure prints diagnostics and tears the half-booted harness down.
diagnostics() {
    echo "----- $STATE/boot.log (unshare + inner.sh) -----"
    cat "$STATE/boot.log" 2>/dev/null
    echo "----- $STATE/console.log (tail) -----"
    tail -n 40 "$STATE/console.log" 2>/dev/null
    if [ -n "${SPID:-}" ] && [ -d "/proc/$SPID" ]; then
        echo "----- systemctl --failed / list-jobs (inside) -----"
        timeout 10 "$STATE/enter.sh" systemctl --no-pager --failed --no-legend 2>&1
        timeout 10 "$STATE/enter.sh" systemctl --no-pager list-jobs 2>&1
    fi
    if [ -d "$STATE/run/log/journal" ]; then
        echo "----- journal (last 60 lines) -----"
        timeout 10 journalctl --no-pager -D "$STATE/run/log/journal" -n 60 2>&1
    fi
    echo "-----"
}
fail() {
    trap - ERR
    echo "boot.sh: $*" >&2
    diagnostics >&2 || true
    if [ "${HARNESS_KEEP_ON_FAILURE:-0}" = 1 ]; then
        echo "boot.sh: HARNESS_KEEP_ON_FAILURE=1: left $STATE; run HARNESS_NAME=$HARNESS_NAME HARNESS_STATE=$STATE $HERE/teardown.sh" >&2
    else
        HARNESS_NAME=$HARNESS_NAME HARNESS_STATE=$STATE "$HERE/teardown.sh" >&2 || true
    fi
    exit 1
}
trap 'fail "unexpected error at line $LINENO"' ERR

# --- state dir; $STATE/run becomes the container's /run (visible from host)
mkdir -p "$STATE"/run/systemd/system "$STATE"/run/systemd/system-generators \
         "$STATE"/run/systemd/journald.conf.d "$STATE"/run/systemd/system.conf.d \
         "$STATE"/run/lock "$STATE"/run/user "$STATE"/devstage "$STATE"/dbus-system.d
chmod 755 "$STATE" "$STATE/run"; chmod 1777 "$STATE/run/lock"
echo "$CG" > "$STATE/cgroup.path"
: > "$STATE/console.log"

U=$STATE/run/systemd/system
cat > "$U/ptrain-harness.target" <<'EOF'
[Unit]
Description=ptrain systemd test harness (journald + system D-Bus)
Requires=basic.target dbus.socket systemd-journald.socket
Wants=dbus.service systemd-journald.service
After=basic.target dbus.service systemd-journald.service
AllowIsolate=yes
EOF

# Runtime masks (/run/systemd/system/X -> /dev/null): everything that would touch
# the shared host root fs, kernel tunables, clock, modules, users or devices.
MASK="systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service
 systemd-tmpfiles-clean.timer systemd-tmpfiles-clean.service systemd-sysusers.service
 systemd-sysctl.service systemd-modules-load.service kmod-static-nodes.service
 systemd-random-seed.service systemd-update-utmp.service systemd-update-utmp-runlevel.service
 systemd-remount-fs.service systemd-fsck-root.service systemd-firstboot.service
 systemd-machine-id-commit.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount
 proc-sys-fs-binfmt_misc.mount systemd-repart.service systemd-pcrphase.service
 systemd-pcrphase-sysinit.service systemd-pstore.service systemd-timesyncd.service
 systemd-journald-audit.socket systemd-initctl.socket systemd-ask-password-console.path
 systemd-ask-password-wall.path sys-kernel-config.mount sys-kernel-debug.mount
 sys-kernel-tracing.mount sys-fs-fuse-connections.mount dev-hugepages.mount
 systemd-udevd.service systemd-udev-trigger.service systemd-udev-settle.service
 systemd-hwdb-update.service systemd-journal-catalog-update.service
 systemd-update-done.service ldconfig.service getty.target console-getty.service
 systemd-logind.service e2scrub_reap.service"
# ...plus every unit any timers/sysinit/paths target pulls in on this host (apt-daily etc.)
for d in /etc/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
    for w in timers sysinit paths; do
        [ -d "$d/$w.target.wants" ] && MASK="$MASK $(ls "$d/$w.target.wants")"
    done
done
KEEP=" systemd-journald.service systemd-journal-flush.service dev-mqueue.mount "
for u in $MASK; do
    case "$KEEP" in *" $u "*) continue;; esac
    ln -sf /dev/null "$U/$u"
done
# Disable all generators (fstab, getty, sysv, gpt-auto, ...)
for d in /etc/systemd/system-generators /lib/systemd/system-generators \
         /usr/lib/systemd/system-generators /usr/local/lib/systemd/system-generators; do
    [ -d "$d" ] || continue
    for g in "$d"/*; do [ -e "$g" ] && ln -sf /dev/null "$STATE/run/systemd/system-generators/${g##*/}"; done
done
cat > "$STATE/run/systemd/journald.conf.d/harness.conf" <<EOF
[Journal]
Storage=volatile
RuntimeMaxUse=$JOURNAL_MAX
ForwardToConsole=no
ForwardToWall=no
EOF
cat > "$STATE/run/systemd/system.conf.d/harness.conf" <<'EOF'
[Manager]
ShowStatus=no
EOF

# Test-supplied units last, so they may override anything above.
if [ -n "$UNITS_DIR" ]; then
    cp -R "$UNITS_DIR"/. "$U"/
fi

# --- D-Bus policy: host's system.d + the project's confs, bound over the
# harness's view of the directory (private mount namespace; host /etc untouched)
if [ -d /etc/dbus-1/system.d ]; then
    HARNESS_DBUS_TARGET=/etc/dbus-1/system.d
else   # system.conf also includes /usr/share/dbus-1/system.d
    HARNESS_DBUS_TARGET=/usr/share/dbus-1/system.d
fi
cp -R "$HARNESS_DBUS_TARGET"/. "$STATE/dbus-system.d"/
if [ -n "$POLICY_DIR" ]; then
    for f in "$POLICY_DIR"/*.conf; do
        [ -e "$f" ] && cp "$f" "$STATE/dbus-system.d/"
    done
fi

# --- fake GPU nodes only where the host has no real ones
if [ "$HARNESS_FAKE_GPUS" -gt 0 ] && compgen -G '/dev/nvidia*' >/dev/null; then
    echo "boot.sh: note: host has /dev/nvidia*: binding the real nodes, HARNESS_FAKE_GPUS ignored" >&2
    HARNESS_FAKE_GPUS=0
fi
# nvidia-uvm's major is dynamic on real hosts: take one no driver has registered
HARNESS_UVM_MAJOR=511
while [ "$HARNESS_FAKE_GPUS" -gt 0 ] && grep -qE "^ *$HARNESS_UVM_MAJOR " /proc/devices; do
    HARNESS_UVM_MAJOR=$((HARNESS_UVM_MAJOR - 1))
done

# --- the script that runs as PID 1 of the new namespaces, then execs systemd
cat > "$STATE/inner.sh" <<'EOF'
#!/bin/sh
# runs as PID 1 in new pid/mount/uts/ipc/cgroup ns; propagation already private
set -eu
S=$1
# /run: host-visible directory
mount --bind "$S/run" /run
# D-Bus policy (read before dbus-daemon starts, so before systemd)
mount --bind "$S/dbus-system.d" "$HARNESS_DBUS_TARGET"
mount -o remount,bind,ro "$HARNESS_DBUS_TARGET"
# /proc/sys read-only: systemd (PID1) would otherwise bump global fs.file-max/nr_open
mount --bind /proc/sys /proc/sys; mount -o remount,bind,ro /proc/sys
if [ -e /proc/sysrq-trigger ]; then
    mount --bind /proc/sysrq-trigger /proc/sysrq-trigger; mount -o remount,bind,ro /proc/sysrq-trigger
fi
# /sys read-only, with a private cgroup2 view rooted at our cgroup (cgroupns)
umount -R /sys/fs/cgroup
mount -o remount,bind,ro /sys
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
# private /dev: tmpfs + bind-mounted host nodes (no /dev/kmsg, no block devices)
D=$S/devstage
mount -t tmpfs -o mode=755,nosuid,strictatime,size=4m tmpfs "$D"
for n in null zero full random urandom tty fuse net/tun $(cd /dev && ls -d nvidia* dri 2>/dev/null || true); do
    [ -e "/dev/$n" ] || continue
    if [ -d "/dev/$n" ]; then mkdir -p "$D/$n"; mount --rbind "/dev/$n" "$D/$n"
    else mkdir -p "$(dirname "$D/$n")"; : > "$D/$n"; mount --bind "/dev/$n" "$D/$n"; fi
done
# fake NVIDIA nodes: no driver behind them, so open() gives ENXIO once the
# device cgroup lets it through, EPERM when it does not
i=0
while [ "$i" -lt "${HARNESS_FAKE_GPUS:-0}" ]; do
    mknod -m 0666 "$D/nvidia$i" c 195 "$i"; i=$((i + 1))
done
if [ "${HARNESS_FAKE_GPUS:-0}" -gt 0 ]; then
    mknod -m 0666 "$D/nvidiactl" c 195 255
    mknod -m 0666 "$D/nvidia-modeset" c 195 254
    mknod -m 0666 "$D/nvidia-uvm" c "$HARNESS_UVM_MAJOR" 0
    mknod -m 0666 "$D/nvidia-uvm-tools" c "$HARNESS_UVM_MAJOR" 1
fi
: > "$D/console"; mount --bind "$S/console.log" "$D/console"
mkdir -p "$D/pts" "$D/shm" "$D/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5,nosuid,noexec devpts "$D/pts"
ln -s pts/ptmx "$D/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$D/shm"
ln -s /proc/self/fd "$D/fd"; ln -s /proc/self/fd/0 "$D/stdin"
ln -s /proc/self/fd/1 "$D/stdout"; ln -s /proc/self/fd/2 "$D/stderr"
mount --move "$D" /dev
# systemd sets the hostname from /etc/hostname at boot: show it the harness name
echo "$HARNESS_NAME" > "$S/hostname"
[ -e /etc/hostname ] && mount --bind "$S/hostname" /etc/hostname
hostname "$HARNESS_NAME"
exec env -i container=ptrain-harness PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "$SYSTEMD_BIN" --unit=ptrain-harness.target --log-target=journal-or-kmsg --show-status=no
EOF
chmod +x "$STATE/inner.sh"

# --- enter.sh helper: run a command inside all namespaces of the harness
cat > "$STATE/enter.sh" <<EOF
#!/bin/sh
# usage: enter.sh [cmd args...]  (default: a shell) - runs inside the harness
# namespaces, in the current directory (/ when that is under /run or /dev,
# which differ inside).
P=\$(cat "$STATE/systemd.pid") || exit 1
[ -d "/proc/\$P" ] || { echo "enter.sh: harness $HARNESS_NAME is not running" >&2; exit 1; }
W=\$PWD
case "\$W" in /run|/run/*|/dev|/dev/*) W=/;; esac
[ \$# -gt 0 ] || set -- /bin/bash
exec nsenter --target "\$P" --mount --pid --uts --ipc --cgroup --wdns="\$W" -- "\$@"
EOF
chmod +x "$STATE/enter.sh"

# --- launch: join the cgroup, then unshare; systemd becomes PID 1 of the new pid ns
T0=$(date +%s.%N)
export HARNESS_NAME SYSTEMD_BIN HARNESS_FAKE_GPUS HARNESS_UVM_MAJOR HARNESS_DBUS_TARGET
export LIBMOUNT_UTAB=$STATE/utab   # keep util-linux from creating the host's /run/mount
# shellcheck disable=SC2016 # $1/$2 expand in the inner bash
setsid bash -c 'echo $$ > "$1/cgroup.procs"; exec unshare --pid --fork --kill-child=SIGKILL \
    --mount --uts --ipc --cgroup --propagation private --mount-proc -- "$2/inner.sh" "$2"' \
    _ "$CG" "$STATE" </dev/null >"$STATE/boot.log" 2>&1 &
UPID=$!
echo "$UPID" > "$STATE/unshare.pid"
SPID=
for _ in $(seq 1 200); do
    SPID=$(awk '{print $1}' "/proc/$UPID/task/$UPID/children" 2>/dev/null || true)
    [ -n "$SPID" ] && break
    kill -0 "$UPID" 2>/dev/null || fail "unshare exited early"
    sleep 0.05
done
[ -n "$SPID" ] || fail "unshare started no child within 10s"
echo "$SPID" > "$STATE/systemd.pid"
# move the (outer) unshare process back out of the container's cgroup root
echo "$UPID" > "$ORIG_CG/cgroup.procs" || true

# --- wait until systemd finished booting and dbus answers on the shared socket
BUS=unix:path=$BUS_PATH
state=
for _ in $(seq 1 $((BOOT_TIMEOUT * 10))); do
    kill -0 "$SPID" 2>/dev/null || fail "systemd (pid $SPID) died during boot"
    if [ -S "$BUS_PATH" ]; then
        state=$(busctl --address="$BUS" get-property org.freedesktop.systemd1 /org/freedesktop/systemd1 \
                org.freedesktop.systemd1.Manager SystemState 2>/dev/null | awk '{print $2}' | tr -d '"') || true
        case "$state" in running|degraded) break;; esac
    fi
    sleep 0.1
done
case "$state" in
    running) ;;
    degraded) echo "boot.sh: warning: system state is degraded; failed units:" >&2
              "$STATE/enter.sh" systemctl --no-pager --failed --no-legend >&2 || true;;
    *) fail "not ready after ${BOOT_TIMEOUT}s (system state='$state')";;
esac
T1=$(date +%s.%N)
# dbus-daemon skips a policy file it cannot parse and starts anyway: say so
# here rather than let a test fail later on AccessDenied.
if [ -n "$POLICY_DIR" ]; then
    dbus_log=$(journalctl --no-pager -D "$STATE/run/log/journal" -o cat _SYSTEMD_UNIT=dbus.service 2>/dev/null || true)
    for f in "$POLICY_DIR"/*.conf; do
        [ -e "$f" ] || continue
        if grep -qF "$HARNESS_DBUS_TARGET/${f##*/}" <<<"$dbus_log"; then
            fail "dbus-daemon rejected the policy file $f:
$(grep -F -B1 -A1 "$HARNESS_DBUS_TARGET/${f##*/}" <<<"$dbus_log")"
        fi
    done
fi
trap - ERR

cat > "$STATE/env" <<EOF
export HARNESS_NAME=$HARNESS_NAME
export HARNESS_STATE=$STATE
export HARNESS_SYSTEMD_PID=$SPID
export DBUS_SYSTEM_BUS_ADDRESS=$BUS
export PTRAIN_JOURNAL_DIR=$STATE/run/log/journal
EOF
printf 'systemd harness %s ready in %.2fs: system state=%s, systemd pid (host)=%s, fake GPUs=%s\n' \
    "$HARNESS_NAME" "$(awk "BEGIN{print $T1 - $T0}")" "$state" "$SPID" "$HARNESS_FAKE_GPUS"
cat <<EOF
  inside (default paths; systemctl, systemd-run, journalctl, ptrain):
      $STATE/enter.sh systemctl status
  from the host over the bus (busctl, zbus; NOT host systemctl/systemd-run):
      . $STATE/env      # DBUS_SYSTEM_BUS_ADDRESS=$BUS
      busctl --system list
  journal from the host:  journalctl -D $STATE/run/log/journal -u <unit>
  teardown:               HARNESS_NAME=$HARNESS_NAME HARNESS_STATE=$STATE $HERE/teardown.sh
EOF
