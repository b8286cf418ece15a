#!/bin/bash
# demo.sh - set ptrain up on this machine and run one example job.
#
#   sudo packaging/demo.sh          (or: sudo make demo)
#
# 1. Builds the release binaries (cargo build --release).
# 2. Where PID 1 is systemd: installs them (make install), creates the
#    directories, reloads D-Bus and starts ptraind.service.
#    Elsewhere (containers, CI machines): boots the project's systemd harness
#    (tests/harness/boot.sh; name ptrain-demo, two fake GPUs) and starts the
#    shipped ptraind.service in it, pointed by a drop-in at target/release
#    and at a demo config whose directories live in the harness state dir.
# 3. Drops spool-examples/hello.json into the spool as an unprivileged user
#    (ptrain-demo, created if missing), waits until the job has ended and
#    shows its status, unit and output.
# The harness is left running; the end of the output says how to enter it
# and how to remove it. Exit status: 0 if the job succeeded.
#
# Environment: PTRAIN_DEMO_USER (default ptrain-demo), PTRAIN_DEMO_TIMEOUT
# (seconds for the job to end, default 120), PTRAIN_DEMO_STATE (harness state
# dir, default /var/lib/ptrain-demo).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
DEMO_USER=${PTRAIN_DEMO_USER:-ptrain-demo}
TIMEOUT=${PTRAIN_DEMO_TIMEOUT:-120}
JOB_FILE=$REPO/spool-examples/hello.json
JOB=hello

phase() { printf '\n==> %s\n' "$*"; }
die() { echo "demo.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: it installs ptrain or boots a systemd harness (sudo $0)"
command -v cargo >/dev/null || die "cargo not found; install a Rust toolchain (https://rustup.rs)"

phase "build: cargo build --release"
cargo build --release
BIN=$REPO/target/release

phase "demo user $DEMO_USER"
if id -u "$DEMO_USER" >/dev/null 2>&1; then
    echo "exists: $(id "$DEMO_USER")"
else
    useradd --system --no-create-home --shell /usr/sbin/nologin "$DEMO_USER"
    echo "created: $(id "$DEMO_USER")"
fi

if [ -d /run/systemd/system ] && [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then
    # ---- a real systemd host: install for real -------------------------------
    MODE=host
    IN=()                      # commands run right here
    PTRAIN=/usr/bin/ptrain

    phase "install: make install"
    make install
    phase "set up: directories, units, D-Bus policy"
    systemd-tmpfiles --create /usr/lib/tmpfiles.d/ptrain.conf
    systemctl daemon-reload
    # dbus-daemon reads org.ptrain.Daemon1.conf only on (re)load; without it
    # ptraind may not own its bus name
    systemctl reload dbus.service
    /usr/sbin/ptraind --check-config
    SPOOL=$(/usr/sbin/ptraind --check-config | sed -n 's/^ *spool_dir = //p')
    # a running ptraind from an earlier install must pick up the new binary
    if systemctl is-active --quiet ptraind.service; then
        systemctl restart ptraind.service
    fi
    systemctl enable --now ptraind.service
    # on a re-run "hello" is taken by the previous demo job
    if "$PTRAIN" status "$JOB" >/dev/null 2>&1; then
        JOB=hello-$(date +%Y%m%d-%H%M%S)
    fi
else
    # ---- no systemd as PID 1: boot the project's harness ---------------------
    MODE=harness
    export HARNESS_NAME=ptrain-demo
    export HARNESS_STATE=${PTRAIN_DEMO_STATE:-/var/lib/ptrain-demo}
    export HARNESS_FAKE_GPUS=2
    D=$HARNESS_STATE/demo              # config, spool, state, logs; teardown removes it
    SPOOL=$D/spool
    # Jobs run `ptraind exec-job` as their owner: the binaries must be where
    # every user can run them, which a checkout under /root is not.
    install -d -m 0755 /usr/local/lib/ptrain-demo
    install -m 0755 "$BIN/ptraind" "$BIN/ptrain" /usr/local/lib/ptrain-demo/
    BIN=/usr/local/lib/ptrain-demo
    PTRAIN=$BIN/ptrain
    TEARDOWN="HARNESS_NAME=$HARNESS_NAME HARNESS_STATE=$HARNESS_STATE $REPO/tests/harness/teardown.sh"

    if [ -e "$HARNESS_STATE" ]; then
        phase "remove the previous demo harness"
        "$REPO/tests/harness/teardown.sh"
    fi

    # The shipped unit, with a drop-in for the demo's binary, config and dirs.
    UNITS=$(mktemp -d)
    trap 'rm -rf "$UNITS"' EXIT
    cp units/ptraind.service units/ptrain.slice units/ptrain-exit@.service "$UNITS/"
    mkdir "$UNITS/ptraind.service.d"
    cat > "$UNITS/ptraind.service.d/demo.conf" <<EOF
# packaging/demo.sh: run target/release/ptraind with the demo config
[Service]
ExecStart=
ExecStart=$BIN/ptraind --config $D/ptrain.toml
StateDirectory=
LogsDirectory=
ReadWritePaths=
ReadWritePaths=$SPOOL $D/state $D/log
EOF
    # The exit recorder, run from the same binary with the same config.
    mkdir "$UNITS/ptrain-exit@.service.d"
    cat > "$UNITS/ptrain-exit@.service.d/demo.conf" <<EOF
[Service]
ExecStart=
ExecStart=$BIN/ptraind --config $D/ptrain.toml record-exit %i
EOF
    case "$BIN" in /tmp/*|/var/tmp/*)   # PrivateTmp=yes would hide the binary
        echo "PrivateTmp=no" >> "$UNITS/ptraind.service.d/demo.conf"
        echo "PrivateTmp=no" >> "$UNITS/ptrain-exit@.service.d/demo.conf";;
    esac

    phase "boot the systemd harness $HARNESS_NAME (2 fake GPUs)"
    HARNESS_UNITS_DIR=$UNITS "$REPO/tests/harness/boot.sh"
    IN=("$HARNESS_STATE/enter.sh")     # run inside the harness

    phase "demo config $D/ptrain.toml"
    install -d -m 0755 "$D"
    install -d -m 1733 "$SPOOL"
    install -d -m 0700 "$D/state" "$D/log"
    (umask 077; cat > "$D/ptrain.toml" <<EOF
# ptrain demo config (packaging/demo.sh): two fake GPUs in the harness
spool_dir = "$SPOOL"
state_dir = "$D/state"
log_dir = "$D/log"
slice = "ptrain.slice"

[gpus]
backend = "declared"

[[gpus.declared]]
index = 0
uuid = "GPU-00000000-0000-0000-0000-00000000d000"
name = "Demo GPU 0 (fake /dev node)"
memory_mib = 81920
device = "/dev/nvidia0"

[[gpus.declared]]
index = 1
uuid = "GPU-00000000-0000-0000-0000-00000000d001"
name = "Demo GPU 1 (fake /dev node)"
memory_mib = 81920
device = "/dev/nvidia1"
EOF
    )
    "${IN[@]}" "$BIN/ptraind" --config "$D/ptrain.toml" --check-config

    phase "start ptraind.service in the harness"
    if ! "${IN[@]}" systemctl start ptraind.service; then
        "${IN[@]}" systemctl --no-pager status ptraind.service || true
        "${IN[@]}" journalctl --no-pager -u ptraind.service -n 50 || true
        die "ptraind did not start; the harness is left for a look ($HARNESS_STATE/enter.sh); remove it with: $TEARDOWN"
    fi
fi

"${IN[@]}" systemctl --no-pager status ptraind.service | head -n 12 || true
phase "GPUs ptraind sees"
"${IN[@]}" "$PTRAIN" gpus
if ! "${IN[@]}" "$PTRAIN" gpus --json | grep -q '"index"'; then
    die "ptraind sees no GPU, and $JOB asks for one: declare GPUs in [gpus] of the config (see packaging/ptrain.toml)"
fi

phase "submit: $JOB_FILE as $JOB.json, written by $DEMO_USER"
# Written under a dot-name, then renamed: ptraind only ever sees the whole file.
# shellcheck disable=SC2016 # $1 and $2 are the inner shell's
"${IN[@]}" runuser -u "$DEMO_USER" -- sh -c 'cd / && cat > "$1/.$2.json.tmp" && mv "$1/.$2.json.tmp" "$1/$2.json"' \
    sh "$SPOOL" "$JOB" < "$JOB_FILE"
ls -l "$SPOOL/$JOB.json" 2>/dev/null || echo "(already claimed by ptraind)"

phase "wait for $JOB to end (at most ${TIMEOUT}s)"
deadline=$((SECONDS + TIMEOUT))
last=-
while :; do
    st=$("${IN[@]}" "$PTRAIN" status "$JOB" --json 2>/dev/null | sed -n 's/^  "status": "\([^"]*\)".*/\1/p') || st=
    if [ "$st" != "$last" ]; then
        printf '  %5ss  %s\n' "$((SECONDS - deadline + TIMEOUT))" "${st:-not known to ptraind yet}"
        last=$st
    fi
    if [ "$st" = running ] && [ -z "${shown_running:-}" ]; then
        shown_running=1
        phase "systemctl status ptrain-job@$JOB (while it runs)"
        "${IN[@]}" systemctl --no-pager status "ptrain-job@$JOB" || true
        printf '\n'
    fi
    case "$st" in
        "" | queued | launching | running) ;;
        *) break;;
    esac
    if [ -z "$st" ] && "${IN[@]}" "$PTRAIN" rejected 2>/dev/null | grep -F "$JOB.json"; then
        die "ptraind rejected $JOB.json (reason above)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        "${IN[@]}" "$PTRAIN" status "$JOB" || true
        die "$JOB did not end within ${TIMEOUT}s"
    fi
    sleep 0.2
done

phase "ptrain status $JOB"
"${IN[@]}" "$PTRAIN" status "$JOB" || true

phase "systemctl status ptrain-job@$JOB (after it ended)"
"${IN[@]}" systemctl --no-pager status "ptrain-job@$JOB" ||
    echo "(no such unit any more: systemd drops a job's unit once ptraind has recorded its result)"

phase "journalctl -u ptrain-job@$JOB"
# the journal can trail the job's end by a few milliseconds
deadline=$((SECONDS + 5))
until "${IN[@]}" journalctl --no-pager -o cat -u "ptrain-job@$JOB" | grep -q 'hello from ptrain' ||
      [ "$SECONDS" -ge "$deadline" ]; do
    sleep 0.1
done
"${IN[@]}" journalctl --no-pager -u "ptrain-job@$JOB"

phase "done: $JOB $st"
if [ "$MODE" = harness ]; then
    cat <<EOF
The systemd harness "$HARNESS_NAME" is still running, with ptraind in it.
  enter it (root shell):  $HARNESS_STATE/enter.sh
  run something in it:    $HARNESS_STATE/enter.sh $PTRAIN list
                          $HARNESS_STATE/enter.sh journalctl -u ptraind
  submit another job:     cp JOB.json $SPOOL/ as a non-root user, or
                          $HARNESS_STATE/enter.sh runuser -u $DEMO_USER -- $PTRAIN --config $D/ptrain.toml submit /path/JOB.json
  tear it down:           $TEARDOWN
EOF
else
    cat <<EOF
ptraind is installed, enabled and running (systemctl status ptraind).
  submit a job:  ptrain submit JOB.json        (as the user who should run it)
  follow it:     ptrain list; ptrain status ID; ptrain logs -f ID
  config:        /etc/ptrain/ptrain.toml, then systemctl restart ptraind
EOF
fi
[ "$st" = succeeded ]
