#!/bin/bash
# make gpu-e2e: ptrain end to end on a machine with an NVIDIA GPU (issue 20).
#
#   sudo packaging/gpu-e2e.sh        (or: sudo make gpu-e2e)
#
# 1. `make gpu-check` (NVML inventory and allocation), where it can run.
# 2. Boots the project's systemd harness (tests/harness/boot.sh, name
#    ptrain-gpu-e2e), with the host's /dev/nvidia* bound in; where the
#    machine has no systemd or dbus, they are unpacked from Debian's
#    packages (see "systemd and dbus" below) and mounted over /usr for this
#    script and the harness only.
# 3. Starts the shipped ptraind.service in it with `backend = "nvml"`.
# 4. As an unprivileged user (ptrain-e2e, created if missing) submits a
#    PyTorch job, `gpus: 1`: a small MLP trained for GPU_E2E_STEPS steps on
#    random data, which then holds its GPU until this script lets it go.
#    Checked: CUDA sees exactly one device, the one ptraind assigned, by
#    UUID; NVML (`ptrain gpus`, and nvidia-smi on the host) shows the job's
#    process on it; a second job asking for every GPU waits while the first
#    holds one, and runs after; the first job's result file carries its
#    final loss. Where the job's user cannot import torch, that is
#    reported as refused and a shell job stands in for the waiting check.
# 5. Prints a report (one line per check: PASS, FAIL or SKIP with what the
#    machine refused), tears the harness down, exits 1 if any check failed.
#
# Without an NVIDIA driver it says so and exits 0, as gpu-check does.
#
# GPU_E2E_FAKE=1 runs everything but PyTorch against the fake driver of the
# tests (tests/fake-nvml, one fake GPU; needs cc): the job is a shell
# script standing in for the training, and the "process on the GPU" is the
# job's own pid written into the fake driver's state. CI runs this mode
# (tests/integration/nvml.rs, gpu_e2e_script_*), so the script itself is
# tested where there is no GPU.
#
# Environment (all optional):
#   GPU_E2E_BIN      directory holding built ptraind and ptrain (default
#                    target/release; built with cargo when missing there)
#   GPU_E2E_PYTHON   python with torch, runnable by the job's user
#                    (default: python3 on PATH)
#   GPU_E2E_STEPS    training steps (default 300)
#   GPU_E2E_TIMEOUT  seconds for everything after the build (default 480:
#                    the issue's 8 minutes)
#   GPU_E2E_USER     the unprivileged user (default ptrain-e2e)
#   GPU_E2E_DIR      work dir: binaries, config, spool, job workdir,
#                    harness state (default /srv/ptrain-gpu-e2e; not under
#                    /tmp: job units get a private /tmp)
#   GPU_E2E_DEBS     directory of Debian packages to unpack when systemd or
#                    dbus is missing (default packaging/gpu-e2e-debs, filled
#                    by `packaging/gpu-e2e.sh --fetch-debs DIR` on a machine
#                    with apt; about 10 MiB, so it travels with the tree)
#   GPU_E2E_UNPACK=1 unpack GPU_E2E_DEBS even where systemd and dbus are
#                    installed (to try that path on a machine that has them)
#   GPU_E2E_KEEP=1   leave the harness running at the end
#   HARNESS_NAME     default ptrain-gpu-e2e
#
# systemd and dbus: the harness needs systemd, dbus-daemon, busctl,
# systemctl, journalctl (and util-linux's unshare/nsenter). When one is
# missing, every .deb in GPU_E2E_DEBS is unpacked (dpkg-deb, or ar and tar)
# into GPU_E2E_DIR/sysroot, and this script re-runs itself in a private
# mount namespace where that tree is overlaid on /usr and /etc (overlayfs),
# so the host's file systems are not changed; the harness inherits it.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
FAKE=${GPU_E2E_FAKE:-0}
STEPS=${GPU_E2E_STEPS:-300}
TIMEOUT=${GPU_E2E_TIMEOUT:-480}
E2E_USER=${GPU_E2E_USER:-ptrain-e2e}
W=${GPU_E2E_DIR:-/srv/ptrain-gpu-e2e}
DEBS=${GPU_E2E_DEBS:-$REPO/packaging/gpu-e2e-debs}
export HARNESS_NAME=${HARNESS_NAME:-ptrain-gpu-e2e}
export HARNESS_STATE=$W/harness
TRAIN=e2e-train
WAITER=e2e-wait

say() { printf '==> %s\n' "$*"; }
die() { echo "gpu-e2e: $*" >&2; exit 1; }

# The packages the harness needs, beyond a minimal Debian 12 (bookworm):
# systemd and its shared library, dbus's daemon, tools and policy, and the
# libraries they link that a minimal image may lack.
DEB_PKGS=(systemd libsystemd-shared libsystemd0 dbus dbus-bin dbus-daemon
    dbus-system-bus-common libdbus-1-3 libapparmor1 libseccomp2 libkmod2
    libcryptsetup12 libip4tc2 libexpat1 util-linux)

if [ "${1:-}" = --fetch-debs ]; then
    dir=${2:?usage: $0 --fetch-debs DIR}
    command -v apt-get >/dev/null || die "--fetch-debs needs apt-get (run it on a Debian 12 machine)"
    mkdir -p "$dir"
    (cd "$dir" && apt-get download "${DEB_PKGS[@]}")
    du -sh "$dir"
    exit 0
fi

have_driver() {
    [ -e /proc/driver/nvidia/version ] && return 0
    ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1' && return 0
    return 1
}

if [ "$FAKE" != 1 ] && ! have_driver; then
    echo "gpu-e2e: no NVIDIA driver on this machine (no /proc/driver/nvidia/version," \
        "no libnvidia-ml.so.1 in the loader cache); nothing to run." \
        "(GPU_E2E_FAKE=1 runs it against the tests' fake driver.)"
    exit 0
fi
[ "$(id -u)" = 0 ] || die "run as root: it boots a systemd harness and creates a user (sudo $0)"
[[ $STEPS =~ ^[1-9][0-9]{0,6}$ ]] || die "GPU_E2E_STEPS='$STEPS' must be a number of steps such as 300"
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "GPU_E2E_TIMEOUT='$TIMEOUT' must be a number of seconds such as 480"
case $W in /tmp/* | /var/tmp/*) die "GPU_E2E_DIR='$W' is under a /tmp that job units do not see; use a directory such as /srv/ptrain-gpu-e2e" ;; /?*) ;; *) die "GPU_E2E_DIR='$W' must be an absolute path" ;; esac

# --- systemd and dbus, from Debian's packages if the machine lacks them ---
missing_tools() {
    local t out=()
    for t in unshare nsenter busctl systemctl journalctl dbus-daemon; do
        command -v "$t" >/dev/null || out+=("$t")
    done
    [ -x "${SYSTEMD_BIN:-/lib/systemd/systemd}" ] || out+=(systemd)
    echo "${out[*]}"
}
if { [ -n "$(missing_tools)" ] || [ "${GPU_E2E_UNPACK:-0}" = 1 ]; } && [ -z "${GPU_E2E_IN_SYSROOT:-}" ]; then
    miss=$(missing_tools)
    say "missing for the harness: ${miss:-nothing (GPU_E2E_UNPACK=1)}; unpacking Debian packages from $DEBS"
    compgen -G "$DEBS/*.deb" >/dev/null ||
        die "no .deb files in $DEBS: on a Debian 12 machine with apt run '$0 --fetch-debs $DEBS' and bring that directory along, or install systemd, dbus and util-linux"
    command -v unshare >/dev/null || die "unshare (util-linux) is missing; it cannot come from a .deb here, as the overlay needs it"
    SYSROOT=$W/sysroot
    rm -rf "$SYSROOT" && mkdir -p "$SYSROOT"
    for deb in "$DEBS"/*.deb; do
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$deb" "$SYSROOT"
        else
            t=$(mktemp -d)
            (cd "$t" && ar x "$deb" && tar -xf data.tar.* -C "$SYSROOT")
            rm -rf "$t"
        fi
    done
    # Debian 12 packages still ship /lib, /bin and /sbin paths; on a
    # merged-/usr host those are links into /usr, so the tree goes there.
    for d in lib bin sbin lib64; do
        if [ -d "$SYSROOT/$d" ] && [ ! -L "$SYSROOT/$d" ]; then
            mkdir -p "$SYSROOT/usr/$d"
            cp -a "$SYSROOT/$d/." "$SYSROOT/usr/$d/"
            rm -rf "${SYSROOT:?}/$d"
        fi
    done
    getent passwd messagebus >/dev/null ||
        useradd --system --no-create-home --shell /usr/sbin/nologin messagebus
    say "re-running in a private mount namespace with $SYSROOT over /usr and /etc"
    # shellcheck disable=SC2016 # expanded by the inner shell
    exec unshare --mount --propagation private -- bash -c '
        set -e
        o=$1/overlay
        rm -rf "$o" && mkdir -p "$o/work/usr" "$o/work/etc" "$o/upper/usr" "$o/upper/etc" "$1/sysroot/etc"
        mount -t overlay overlay -o "lowerdir=$1/sysroot/usr:/usr,upperdir=$o/upper/usr,workdir=$o/work/usr" /usr
        mount -t overlay overlay -o "lowerdir=$1/sysroot/etc:/etc,upperdir=$o/upper/etc,workdir=$o/work/etc" /etc
        ldconfig
        shift; exec env GPU_E2E_IN_SYSROOT=1 "$@"' sh "$W" "$0" "$@"
fi
[ -z "$(missing_tools)" ] || die "still missing after unpacking $DEBS: $(missing_tools); add their packages there"

# --- the binaries ---------------------------------------------------------
BIN_SRC=${GPU_E2E_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/release}
if [ ! -x "$BIN_SRC/ptraind" ] || [ ! -x "$BIN_SRC/ptrain" ]; then
    [ -z "${GPU_E2E_BIN:-}" ] || die "GPU_E2E_BIN=$BIN_SRC holds no ptraind and ptrain; build them (cargo build --release) and point it at them"
    command -v "${CARGO:-cargo}" >/dev/null ||
        die "no built binaries in $BIN_SRC and no cargo to build them: build there (cargo build --release) and bring target/release/ptraind and ptrain, or set GPU_E2E_BIN"
    say "build: cargo build --release"
    "${CARGO:-cargo}" build --release --quiet
fi
# The 8 minutes start here: a fresh build alone can take longer.
DEADLINE=$((SECONDS + TIMEOUT))
left() { echo $((DEADLINE - SECONDS)); }

# --- the report -------------------------------------------------------------
REPORT=()
FAILED=0
pass() { REPORT+=("PASS  $*"); echo "gpu-e2e: PASS $*"; }
fail() { REPORT+=("FAIL  $*"); FAILED=1; echo "gpu-e2e: FAIL $*" >&2; }
skip() { REPORT+=("SKIP  $*"); echo "gpu-e2e: SKIP $*"; }
report() {
    echo
    echo "== gpu-e2e report ($([ "$FAKE" = 1 ] && echo "fake driver, tests/fake-nvml" || echo "NVIDIA driver $(sed -n 's/.*Kernel Module *\([0-9.]*\).*/\1/p;q' /proc/driver/nvidia/version 2>/dev/null)"), $(hostname), $((SECONDS - DEADLINE + TIMEOUT)) s of ${TIMEOUT} s)"
    printf '  %s\n' "${REPORT[@]}"
    if [ "$FAILED" = 0 ]; then echo "  result: ok"; else echo "  result: FAILED"; fi
}

# --- user, dirs, units --------------------------------------------------------
if ! id -u "$E2E_USER" >/dev/null 2>&1; then
    useradd --system --create-home --home-dir "/var/lib/$E2E_USER" --shell /usr/sbin/nologin "$E2E_USER"
fi
TEARDOWN="HARNESS_NAME=$HARNESS_NAME HARNESS_STATE=$HARNESS_STATE $REPO/tests/harness/teardown.sh"
if [ -e "$HARNESS_STATE" ]; then
    say "remove the previous harness"
    "$REPO/tests/harness/teardown.sh" || true
fi
D=$W/d
rm -rf "$D" "${W:?}/bin" "$W/work" "$W/units" "$W/nvml"
install -d -m 0755 "$W" "$D" "$W/bin"
install -d -m 1733 "$D/spool"
install -d -m 0700 "$D/state" "$D/log"
install -d -m 0755 -o "$E2E_USER" "$W/work"
# Jobs run `ptraind exec-job` as their owner: the binaries must be where
# that user can run them.
install -m 0755 "$BIN_SRC/ptraind" "$BIN_SRC/ptrain" "$W/bin/"
BIN=$W/bin
PTRAIN=(ptrain_in "$BIN/ptrain" --config "$D/ptrain.toml")

UNITS=$W/units
mkdir -p "$UNITS/ptraind.service.d" "$UNITS/ptrain-exit@.service.d"
cp units/ptraind.service units/ptrain.slice units/ptrain-exit@.service "$UNITS/"
cat > "$UNITS/ptraind.service.d/e2e.conf" <<EOF
# packaging/gpu-e2e.sh: this run's binary, config and directories
[Service]
ExecStart=
ExecStart=$BIN/ptraind --config $D/ptrain.toml
StateDirectory=
LogsDirectory=
ReadWritePaths=
ReadWritePaths=$D/spool $D/state $D/log
EOF
cat > "$UNITS/ptrain-exit@.service.d/e2e.conf" <<EOF
[Service]
ExecStart=
ExecStart=$BIN/ptraind --config $D/ptrain.toml record-exit %i
EOF
(umask 077; cat > "$D/ptrain.toml" <<EOF
# packaging/gpu-e2e.sh
spool_dir = "$D/spool"
state_dir = "$D/state"
log_dir = "$D/log"
slice = "ptrain.slice"

[gpus]
backend = "nvml"
EOF
)

# --- the fake driver (GPU_E2E_FAKE=1) -----------------------------------------
FAKE_UUID=GPU-e2e00000-0000-4000-8000-000000000000
fake_state() { # [PID]: the state, with PID as a compute process on GPU 0
    printf 'driver 550.54.15\ncount 1\n0 name NVIDIA H200 (fake)\n0 uuid %s\n0 pci 00000000:17:00.0\n0 minor 0\n0 memory 143771 %s\n0 util 0 0\n0 temp 30\n0 numa 0\n0 ecc 0\n' \
        "$FAKE_UUID" "$([ -n "${1:-}" ] && echo 1024 || echo 0)"
    [ -z "${1:-}" ] || printf '0 proc %s 1024\n' "$1"
}
set_fake_state() { fake_state "$@" > "$W/nvml/state.tmp" && mv "$W/nvml/state.tmp" "$W/nvml/state"; }
if [ "$FAKE" = 1 ]; then
    command -v cc >/dev/null || die "GPU_E2E_FAKE=1 builds tests/fake-nvml with cc: install gcc"
    mkdir -p "$W/nvml"
    cc -shared -fPIC -O2 -Wall -Wextra -Werror -Wl,-soname,libnvidia-ml.so.1 \
        -o "$W/nvml/libnvidia-ml.so.1" tests/fake-nvml/fake_nvml.c
    set_fake_state
    # The loader cache that names it, first (tests/integration/daemon.rs,
    # install_fake_driver: ldconfig rewrites /var/cache/ldconfig even with
    # -C, hence the private tmpfs there).
    printf '%s\ninclude /etc/ld.so.conf\n' "$W/nvml" > "$W/nvml/ld.so.conf"
    unshare --mount --propagation private -- sh -c \
        "mount -t tmpfs tmpfs /var/cache && ldconfig -X -C '$W/nvml/ld.so.cache' -f '$W/nvml/ld.so.conf'"
    chmod 0644 "$W/nvml/ld.so.cache"
    export HARNESS_FAKE_GPUS=1
fi

# --- 1. gpu-check -------------------------------------------------------------
if [ "$FAKE" = 1 ]; then
    skip "gpu-check: not run against the fake driver (it needs CUDA)"
elif [ ! -e examples/gpu_check.rs ]; then
    skip "gpu-check: packaging/gpu-check.sh builds examples/gpu_check.rs, which this tree lacks"
elif ! command -v "${CARGO:-cargo}" >/dev/null; then
    skip "gpu-check: no cargo here to build its example"
elif timeout "$(left)" packaging/gpu-check.sh; then
    pass "gpu-check: inventory and allocation"
else
    fail "gpu-check exited $?"
fi

# --- 2, 3. the harness and ptraind ----------------------------------------------
say "boot the systemd harness $HARNESS_NAME"
HARNESS_UNITS_DIR=$UNITS HARNESS_BOOT_TIMEOUT=$(($(left) < 60 ? $(left) : 60)) "$REPO/tests/harness/boot.sh"
IN=("$HARNESS_STATE/enter.sh")
ptrain_in() { "${IN[@]}" "$@"; }
finish() {
    local rc=$?
    report
    if [ "${GPU_E2E_KEEP:-0}" = 1 ]; then
        echo "the harness is left running: $HARNESS_STATE/enter.sh; remove it with: $TEARDOWN"
    else
        HARNESS_NAME=$HARNESS_NAME HARNESS_STATE=$HARNESS_STATE "$REPO/tests/harness/teardown.sh" >/dev/null 2>&1 ||
            echo "gpu-e2e: teardown failed; run: $TEARDOWN" >&2
    fi
    if [ "$FAILED" = 1 ] || [ "$rc" != 0 ]; then exit 1; fi
}
trap finish EXIT
if [ "$FAKE" = 1 ]; then
    "${IN[@]}" sh -c "mount --bind '$W/nvml/ld.so.cache' /etc/ld.so.cache && mount -o remount,bind,ro /etc/ld.so.cache"
fi
"${IN[@]}" "$BIN/ptraind" --config "$D/ptrain.toml" --check-config >/dev/null
if ! "${IN[@]}" systemctl start ptraind.service; then
    "${IN[@]}" journalctl --no-pager -u ptraind.service -n 40 >&2 || true
    fail "ptraind did not start with backend = \"nvml\" (its journal is above)"
    exit 1
fi
pass "ptraind started with backend = \"nvml\" in the systemd harness"

# JSON fields by python3 (every Debian has it; the CLI has --json only).
json() { python3 -c 'import json,sys; v=json.load(sys.stdin)
for k in sys.argv[1].split("."): v = v[int(k)] if isinstance(v, list) else (v or {}).get(k)
print("" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v))' "$1"; }
status_of() { "${PTRAIN[@]}" status "$1" --json 2>/dev/null | json "$2" || true; }
# wait_until SECONDS WHAT COMMAND...: COMMAND until it succeeds, or fail.
wait_until() {
    local limit=$1 what=$2 end
    shift 2
    end=$((SECONDS + (limit < $(left) ? limit : $(left))))
    until "$@"; do
        if [ "$SECONDS" -ge "$end" ]; then
            fail "$what: not within $((limit < $(left) ? limit : $(left))) s"
            return 1
        fi
        sleep 0.5
    done
}

GPUS_JSON=$("${PTRAIN[@]}" gpus --json)
NGPUS=$(json gpus <<<"$GPUS_JSON" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
BACKEND=$(json backend <<<"$GPUS_JSON")
if [ "$BACKEND" != nvml ] || [ "$NGPUS" -lt 1 ]; then
    fail "ptrain gpus: backend '$BACKEND', $NGPUS GPU(s)"
    exit 1
fi
UUIDS=$(python3 -c 'import json,sys; print(" ".join(sorted(g["uuid"] for g in json.load(sys.stdin)["gpus"])))' <<<"$GPUS_JSON")
if [ "$FAKE" = 1 ]; then
    want=$FAKE_UUID
else
    want=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | sort | tr '\n' ' ' | sed 's/ $//') || want=
fi
if [ -z "$want" ]; then
    skip "inventory: ptrain gpus lists $NGPUS GPU(s) ($UUIDS); no nvidia-smi to compare with"
elif [ "$UUIDS" = "$want" ]; then
    pass "inventory: ptrain gpus lists the driver's $NGPUS GPU(s) by UUID ($UUIDS)"
else
    fail "inventory: ptrain gpus lists '$UUIDS', the driver '$want'"
fi

# --- 4. the jobs ----------------------------------------------------------------
PY=${GPU_E2E_PYTHON:-$(command -v python3 || true)}
WORK=$W/work
NO_TORCH=0
if [ "$FAKE" != 1 ] && { [ -z "$PY" ] || ! runuser -u "$E2E_USER" -- "$PY" -c 'import torch' 2>/dev/null; }; then
    # The waiting second job can still be checked, with a stand-in.
    NO_TORCH=1
    skip "refused: PyTorch: ${PY:-python3} as $E2E_USER cannot import torch (set GPU_E2E_PYTHON to a python with torch that $E2E_USER can run); a shell job stands in, so the CUDA, NVML-process and loss checks are not run"
fi
if [ "$FAKE" = 1 ] || [ "$NO_TORCH" = 1 ]; then
    # Stands in for train.py: what it would record, with no CUDA to ask.
    cat > "$WORK/train.sh" <<'EOF'
#!/bin/sh
set -e
n=$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
printf '{"final_loss": 0.125, "steps": %s, "cuda_device_count": %s, "cuda_uuid": "%s", "fake": true}\n' \
    "$1" "$n" "$CUDA_VISIBLE_DEVICES" > "$PTRAIN_RESULT_FILE"
: > e2e-train.holding
end=$(($(date +%s) + $2))
while [ ! -e e2e-train.go ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done
EOF
    chmod 0755 "$WORK/train.sh"
    TRAIN_CMD=("$WORK/train.sh" "$STEPS" "$(left)")
else
    cat > "$WORK/train.py" <<'EOF'
# packaging/gpu-e2e.sh: a few hundred steps of a small MLP on random data,
# then hold the GPU (CUDA context alive) until e2e-train.go appears, so
# that NVML can be seen listing this process and a second job waits.
import json, os, sys, time
import torch

steps, hold = int(sys.argv[1]), float(sys.argv[2])
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
count = torch.cuda.device_count()
props = torch.cuda.get_device_properties(0)
uuid = getattr(props, "uuid", None)  # torch >= 2.0
uuid = None if uuid is None else "GPU-" + str(uuid)
torch.manual_seed(0)
dev = torch.device("cuda:0")
model = torch.nn.Sequential(
    torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(4096, 256, device=dev)
y = torch.randint(0, 10, (4096,), device=dev)
t0 = time.time()
for step in range(steps):
    idx = torch.randint(0, 4096, (256,), device=dev)
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
result = {
    "final_loss": round(loss.item(), 6),
    "steps": steps,
    "train_seconds": round(time.time() - t0, 3),
    "cuda_device_count": count,
    "cuda_uuid": uuid,
    "cuda_name": props.name,
    "torch": torch.__version__,
    "visible": visible,
}
with open(os.environ["PTRAIN_RESULT_FILE"], "w") as f:
    json.dump(result, f)
open("e2e-train.holding", "w").close()
end = time.time() + hold
while not os.path.exists("e2e-train.go") and time.time() < end:
    time.sleep(0.2)
EOF
    TRAIN_CMD=("$PY" "$WORK/train.py" "$STEPS" "$(left)")
fi
chown -R "$E2E_USER" "$WORK"

# submit ID JSON: as the user, the way `cp` into the spool would.
submit() {
    # shellcheck disable=SC2016 # $1 and $2 are the inner shell's
    "${IN[@]}" runuser -u "$E2E_USER" -- sh -c 'cd / && cat > "$1/.$2.json.tmp" && mv "$1/.$2.json.tmp" "$1/$2.json"' \
        sh "$D/spool" "$1" <<<"$2"
}
job_json() { # ID GPUS COMMAND...
    python3 -c 'import json,sys; print(json.dumps({"version": 1, "id": sys.argv[1], "gpus": int(sys.argv[2]),
        "workdir": sys.argv[3], "command": sys.argv[4:]}))' "$1" "$2" "$WORK" "${@:3}"
}

if [ ${#TRAIN_CMD[@]} -gt 0 ]; then
    say "submit $TRAIN (gpus: 1) as $E2E_USER: ${TRAIN_CMD[*]}"
    submit "$TRAIN" "$(job_json "$TRAIN" 1 "${TRAIN_CMD[@]}")"
    is_holding() {
        [ -e "$WORK/e2e-train.holding" ] && return 0
        case $(status_of "$TRAIN" status) in succeeded | failed | timeout | stopped | idle-timeout) return 0 ;; esac
        return 1
    }
    wait_until 300 "$TRAIN to train and hold its GPU" is_holding || true
    st=$(status_of "$TRAIN" status)
    gpu=$(status_of "$TRAIN" gpus.0)
    uuid=$(status_of "$TRAIN" gpu_uuids.0)
    result=$(status_of "$TRAIN" result)
    if [ "$st" != running ] || [ -z "$uuid" ]; then
        fail "$TRAIN is '$st' (not running, holding its GPU): $(status_of "$TRAIN" detail)"
        "${IN[@]}" journalctl --no-pager -o cat -u "ptrain-job@$TRAIN.service" -n 30 >&2 || true
    else
        pass "$TRAIN runs as $E2E_USER on GPU $gpu ($uuid)"
    fi

    if [ "$st" = running ] && [ "$NO_TORCH" != 1 ]; then
        # NVML lists the job's process on its GPU.
        if [ "$FAKE" = 1 ]; then
            pid=$("${IN[@]}" systemctl show -p MainPID --value "ptrain-job@$TRAIN.service")
            set_fake_state "$pid"
        fi
        proc_on_gpu() {
            "${PTRAIN[@]}" gpus --json | python3 -c 'import json,sys
g = [g for g in json.load(sys.stdin)["gpus"] if g["index"] == int(sys.argv[1])][0]
ok = g.get("held_by") == sys.argv[2] and g.get("processes")
print(" ".join("%s:%s" % (p["pid"], p.get("used_memory_mib")) for p in g.get("processes") or []))
sys.exit(0 if ok else 1)' "$gpu" "$TRAIN" >/dev/null
        }
        gpu_view() { # what ptrain gpus says of the job's GPU: held_by, processes, MiB used
            "${PTRAIN[@]}" gpus --json | python3 -c 'import json,sys
g = [g for g in json.load(sys.stdin)["gpus"] if g["index"] == int(sys.argv[1])][0]
print("held by %s; processes: %s; %s MiB used" % (g.get("held_by"),
    ", ".join("pid %s (%s MiB)" % (p["pid"], p.get("used_memory_mib")) for p in g.get("processes") or []) or "none",
    g.get("memory_used_mib")))' "$gpu"
        }
        end=$((SECONDS + 30))
        until proc_on_gpu || [ "$SECONDS" -ge "$end" ]; do sleep 0.5; done
        seen=$(gpu_view)
        if proc_on_gpu; then
            pass "NVML (ptrain gpus) shows the job's process on GPU $gpu: $seen"
        elif [[ $seen = *"processes: none"* ]] && [ "$FAKE" != 1 ] &&
            [ "$(sed -n 's/.*; \([0-9]*\) MiB used$/\1/p' <<<"$seen")" -ge 100 ] 2>/dev/null; then
            # Memory in use but no process: NVML here does not report
            # processes, which is the machine's refusal, not ptrain's bug.
            skip "refused: NVML lists no compute process on GPU $gpu while the job runs ($seen): this machine's NVML does not report processes (a container outside the host's PID namespace, or a driver that hides them)"
        else
            fail "NVML (ptrain gpus) does not show a process of $TRAIN on GPU $gpu within 30 s: $seen"
        fi
        if [ "$FAKE" != 1 ]; then
            # The host's view: nvidia-smi's pids (host pid namespace) against
            # the job unit's cgroup as the host sees it.
            cg=$(find "$(cat "$HARNESS_STATE/cgroup.path")" -type d -name "ptrain-job@$TRAIN.service" 2>/dev/null | head -n 1)
            apps=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>/dev/null | tr -d ' ') || apps=
            mine=
            if [ -n "$cg" ]; then
                while read -r p; do
                    grep -q "^$p,$uuid\$" <<<"$apps" && mine="$mine $p"
                done < <(cat "$cg"/cgroup.procs "$cg"/*/cgroup.procs 2>/dev/null)
            fi
            if [ -n "$mine" ]; then
                pass "nvidia-smi shows the job's process(es)$mine on $uuid"
            elif [ -z "$apps" ]; then
                skip "refused: nvidia-smi lists no compute process at all while the job runs (see the NVML line above)"
            else
                fail "nvidia-smi does not show a process of ptrain-job@$TRAIN on $uuid (compute apps: ${apps:-none}; unit cgroup: ${cg:-not found})"
            fi
        fi
    fi
    if [ "$st" = running ]; then
        # A second job asking for every GPU waits while the first holds one.
        say "submit $WAITER (gpus: $NGPUS) while $TRAIN holds GPU $gpu"
        # shellcheck disable=SC2016 # expanded by the job's shell, not here
        submit "$WAITER" "$(job_json "$WAITER" "$NGPUS" /bin/sh -c 'printf "%s" "$CUDA_VISIBLE_DEVICES" > e2e-wait.gpus')"
        planned() { [ "$(status_of "$WAITER" status)" = queued ] && [ -n "$(status_of "$WAITER" detail)" ]; }
        if wait_until 30 "$WAITER to be planned and left queued" planned; then
            sleep_end=$((SECONDS + 3))
            # Still queued a moment later: it really waits (no fixed
            # sleep for correctness; this only looks again).
            until [ "$SECONDS" -ge "$sleep_end" ]; do
                [ "$(status_of "$WAITER" status)" = queued ] || break
                sleep 0.5
            done
            if [ "$(status_of "$WAITER" status)" = queued ]; then
                pass "$WAITER waits for the GPU: $(status_of "$WAITER" detail)"
            else
                fail "$WAITER did not wait while $TRAIN held GPU $gpu: $(status_of "$WAITER" status)"
            fi
        fi
        [ "$FAKE" != 1 ] || set_fake_state
        : > "$WORK/e2e-train.go"
    fi

    ended() { case $(status_of "$1" status) in succeeded | failed | timeout | stopped | idle-timeout | dependency-failed) return 0 ;; esac; return 1; }
    wait_until 60 "$TRAIN to end" ended "$TRAIN" || true
    st=$(status_of "$TRAIN" status)
    result=$(status_of "$TRAIN" result)
    loss=$(json final_loss <<<"${result:-null}" 2>/dev/null || true)
    if [ "$NO_TORCH" = 1 ]; then
        [ "$st" = succeeded ] || fail "the stand-in for $TRAIN is '$st': $(status_of "$TRAIN" detail)"
        result=
    elif [ "$st" = succeeded ] && [ -n "$loss" ]; then
        how=
        [ "$FAKE" = 1 ] || how=" ($(json train_seconds <<<"$result") s on $(json cuda_name <<<"$result"), torch $(json torch <<<"$result"))"
        pass "$TRAIN succeeded; its result file: final loss $loss after $(json steps <<<"$result") steps$how"
    else
        fail "$TRAIN is '$st', result '${result:-none}': $(status_of "$TRAIN" detail)"
    fi
    if [ -n "$result" ]; then
        n=$(json cuda_device_count <<<"$result")
        seen=$(json cuda_uuid <<<"$result")
        if [ "$n" = 1 ] && [ "$seen" = "$uuid" ]; then
            pass "CUDA saw exactly 1 device, the assigned one ($seen)$([ "$FAKE" = 1 ] && echo " (fake: from CUDA_VISIBLE_DEVICES)")"
        elif [ "$n" = 1 ] && [ -z "$seen" ]; then
            skip "CUDA saw 1 device; this torch does not report its UUID (assigned $uuid)"
        else
            fail "CUDA saw $n device(s), UUID '$seen'; ptraind assigned $uuid"
        fi
    fi
    if [ "$(status_of "$WAITER" status)" != "" ]; then
        wait_until 60 "$WAITER to run once $TRAIN let its GPU go" ended "$WAITER" || true
        wst=$(status_of "$WAITER" status)
        got=$(cat "$WORK/e2e-wait.gpus" 2>/dev/null || true)
        if [ "$wst" = succeeded ] && [[ ",$got," = *",$uuid,"* ]]; then
            pass "$WAITER ran after $TRAIN, on $got"
        else
            fail "$WAITER is '$wst' with CUDA_VISIBLE_DEVICES '$got': $(status_of "$WAITER" detail)"
        fi
    fi
fi
