#!/bin/bash
# check.sh - self-check of the Slurm harness: boots a cluster with boot.sh,
# submits jobs with `sbatch` as unprivileged users from the submit host (the
# root namespace), checks where, as whom and on which GPUs they ran and what
# their completion records say, prints timings, then tears the cluster down
# (twice: teardown.sh must be idempotent). Exits non-zero with a message
# naming the failed check.
#
#   sudo tests/harness/slurm/check.sh
#
# Environment (all optional): SLURM_HARNESS_* as for boot.sh (default name
# ptrain-slurm-check, 2 nodes, 2 GPUs each); SLURM_CHECK_USERS, two users
# that submit (default "ptrain-alice ptrain-bob", the integration tests'
# users; created as they are, with useradd --system, when missing);
# SLURM_CHECK_KEEP=1 leaves the cluster up at the end.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SLURM_HARNESS_NAME=${SLURM_HARNESS_NAME:-ptrain-slurm-check}
export SLURM_HARNESS_STATE=${SLURM_HARNESS_STATE:-${TMPDIR:-/tmp}/$SLURM_HARNESS_NAME}
NAME=$SLURM_HARNESS_NAME
STATE=${SLURM_HARNESS_STATE%/}
NODES=${SLURM_HARNESS_NODES:-2}
GPUS=${SLURM_HARNESS_GPUS:-2}
GPU_TYPE=${SLURM_HARNESS_GPU_TYPE-tesla}
PREFIX=${SLURM_HARNESS_NODE_PREFIX:-node}
read -r -a USERS <<< "${SLURM_CHECK_USERS:-ptrain-alice ptrain-bob}"

say() { echo "slurm/check.sh: $*"; }
now() { date +%s.%N; }
secs() { awk "BEGIN{printf \"%.2f\", $2 - $1}"; }   # FROM TO

[ "$(id -u)" = 0 ] || { echo "slurm/check.sh: must run as root" >&2; exit 1; }
[ ${#USERS[@]} = 2 ] || { echo "slurm/check.sh: SLURM_CHECK_USERS must name two users" >&2; exit 1; }
[ "$GPUS" -ge 2 ] || { echo "slurm/check.sh: needs SLURM_HARNESS_GPUS >= 2" >&2; exit 1; }
command -v setpriv >/dev/null || { echo "slurm/check.sh: missing setpriv (apt-get install util-linux)" >&2; exit 1; }

BOOTED=0
finish() {
    local rc=$?
    trap - EXIT
    if [ "$BOOTED" = 1 ] && [ "${SLURM_CHECK_KEEP:-0}" = 1 ]; then
        say "SLURM_CHECK_KEEP=1: left $NAME up; export SLURM_CONF=$STATE/etc/slurm.conf; $HERE/teardown.sh to stop it"
    elif [ "$BOOTED" = 1 ]; then
        "$HERE/teardown.sh" || rc=1
    fi
    exit $rc
}
trap finish EXIT
fail() {
    echo "slurm/check.sh: FAILED: $*" >&2
    if [ -d "$STATE" ]; then
        {
            echo "----- squeue -----"; timeout 10 squeue -a -o '%i %u %T %r %N' 2>&1
            echo "----- jobcomp/index (jobid array state exitcode uid nodes start end) -----"
            cat "$STATE/jobcomp/index" 2>/dev/null
            for f in "$STATE"/log/slurmctld.log "$STATE"/log/slurmd-*.log; do
                echo "----- $f (tail) -----"; grep -v pmix "$f" 2>/dev/null | tail -n 15
            done
        } >&2
    fi
    exit 1
}

# --- users: the integration tests' own (tests/integration/harness.rs ensure_user) ---
ensure_user() {
    id -u "$1" >/dev/null 2>&1 && return
    (
        flock 9
        id -u "$1" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$1"
    ) 9>>/tmp/ptrain-test-useradd.lock
    id -u "$1" >/dev/null 2>&1 || fail "could not create user $1"
}
for u in "${USERS[@]}"; do ensure_user "$u"; done
U1=${USERS[0]}; U2=${USERS[1]}
UID1=$(id -u "$U1"); UID2=$(id -u "$U2")
[ "$UID1" != 0 ] && [ "$UID2" != 0 ] && [ "$UID1" != "$UID2" ] || fail "users $U1 ($UID1) and $U2 ($UID2) must be two distinct non-root users"

# --- boot -------------------------------------------------------------------------
# listeners on anything but loopback, in the root network namespace
listeners() { ss -ltnuH | awk '{print $1, $5}' | grep -v -E ' (127\.[0-9.]+|\[::1\]|\[::ffff:127\.[0-9.]+\]):' | sort; }
LISTEN_BEFORE=$(listeners)
"$HERE/teardown.sh" >/dev/null   # a leftover from an interrupted run
T_BOOT0=$(now)
EXPORTS=$("$HERE/boot.sh") || fail "boot.sh failed"
T_BOOT1=$(now)
BOOTED=1
eval "$EXPORTS"
[ "$SLURM_CONF" = "$STATE/etc/slurm.conf" ] || fail "boot.sh printed SLURM_CONF=$SLURM_CONF"
LISTEN_AFTER=$(listeners)
NEW=$(comm -13 <(echo "$LISTEN_BEFORE") <(echo "$LISTEN_AFTER"))
[ -z "$NEW" ] || fail "the cluster listens in the root network namespace: $NEW"
nodes=(); for i in $(seq 1 "$NODES"); do nodes+=("$PREFIX$i"); done

# each user's own writable dir, and the probe job every check runs
for u in "$U1" "$U2"; do
    d=$STATE/users/$u
    mkdir -p "$d"
    cat > "$d/probe.sh" <<'EOF'
#!/bin/sh
# probe.sh [SLEEP [EXIT]]: where, as whom, on which GPUs
echo "start=$(date +%s.%N) host=$(hostname) uid=$(id -u) cvd=${CUDA_VISIBLE_DEVICES-unset} jobgpus=${SLURM_JOB_GPUS-unset} node=${SLURMD_NODENAME-unset} job=${SLURM_JOB_ID-unset}"
sleep "${1:-0}"
echo "end=$(date +%s.%N)"
exit "${2:-0}"
EOF
    chmod 755 "$d/probe.sh"
    chown -R "$u:" "$d"
    chmod 700 "$d"
done
chmod 755 "$STATE/users"

# as USER CMD...: CMD as USER (own uid, gid and groups), clean env, in USER's dir
as() {
    local u=$1
    shift
    (cd "$STATE/users/$u" && setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups \
        env -i PATH=/usr/bin:/bin HOME="$STATE/users/$u" USER="$u" LOGNAME="$u" LANG=C.UTF-8 \
        SLURM_CONF="$SLURM_CONF" "$@")
}
# submit USER LABEL SBATCH-ARGS... -- PROBE-ARGS...: prints the job id; output in USER's dir/LABEL.out
submit() {
    local u=$1 label=$2 id
    shift 2
    local args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    id=$(as "$u" sbatch --parsable -J "$label" -o "$STATE/users/$u/$label.out" "${args[@]}" \
        "$STATE/users/$u/probe.sh" "$@") || fail "sbatch as $u ($label: ${args[*]}) was refused"
    [[ $id =~ ^[0-9]+$ ]] || fail "sbatch as $u ($label) printed '$id', not a job id"
    echo "$id"
}
rec() { sed -n "s/^$2=//p" "$STATE/jobcomp/records/$1" 2>/dev/null; }   # JOBID KEY
out() { sed -n "s/.*\\b$3=\\([^ ]*\\).*/\\1/p" "$STATE/users/$1/$2.out" 2>/dev/null | head -n1; }   # USER LABEL KEY
wait_until() {   # SECONDS WHAT CMD...
    local secs=$1 what=$2 until=$(( $(date +%s) + $1 ))
    shift 2
    until "$@"; do
        [ "$(date +%s)" -lt "$until" ] || fail "timed out after ${secs}s waiting for $what"
        sleep 0.1
    done
}
have_records() { local j; for j in "$@"; do [ -e "$STATE/jobcomp/records/$j" ] || return 1; done; }
array_records() {   # ARRAYJOBID COUNT
    [ "$(grep -lx "ARRAYJOBID=$1" "$STATE"/jobcomp/records/* 2>/dev/null | wc -l)" -ge "$2" ]
}
expect() {   # JOBID KEY VALUE WHAT
    local got
    got=$(rec "$1" "$2")
    [ "$got" = "$3" ] || fail "$4: job $1 has $2=$got in its completion record, expected $3"
}

# --- the jobs ---------------------------------------------------------------------------
# the time limit job first: Slurm checks limits every 30 s, it takes longest
T_TIMEOUT_SUB=$(now)
J_TIMEOUT=$(submit "$U1" timeout --time=0:01 -- 300)

# two 1-GPU jobs pinned to each node, at once: each on its node, as its
# submitter, on two different GPUs of that node
declare -A J_GPU T_SUB
for n in "${nodes[@]}"; do
    for k in a b; do
        u=$U1; [ "$k" = b ] && u=$U2
        gres=gpu:1; [ "$k" = a ] && [ -n "$GPU_TYPE" ] && gres=gpu:$GPU_TYPE:1
        T_SUB[$n$k]=$(now)
        J_GPU[$n$k]=$(submit "$u" "gpu-$n-$k" -w "$n" --gres="$gres" --mem=100M --cpus-per-task=1 --time=5 -- 2)
    done
done
# a 2-task array, one task at a time, niced
J_ARRAY=$(as "$U1" sbatch --parsable -J array --array=0-1%1 --nice=10 -o "$STATE/users/$U1/array-%a.out" \
    "$STATE/users/$U1/probe.sh" 1) || fail "sbatch --array=0-1%1 was refused"
nice=$(scontrol show job "$J_ARRAY" 2>/dev/null | sed -n 's/.*Nice=\([-0-9]*\).*/\1/p' | head -n1)
[ "$nice" = 10 ] || fail "array job $J_ARRAY: Nice=$nice, expected 10"
# an afterok chain, and a failing parent whose dependent is cancelled (--kill-on-invalid-dep)
J_A=$(submit "$U1" chain-a -- 1)
J_B=$(submit "$U1" chain-b -d "afterok:$J_A" -- 0)
J_C=$(submit "$U1" chain-c -d "afterok:$J_B" -- 0)
J_F=$(submit "$U2" fail-f -- 0 3)
J_G=$(submit "$U2" fail-g -d "afterok:$J_F" --kill-on-invalid-dep=yes -- 0)

# a user stops their own job, and not another user's
J_STOP=$(submit "$U1" stop -- 300)
wait_until 30 "job $J_STOP running" sh -c "squeue -h -j $J_STOP -o %T | grep -qx RUNNING"
# (scancel's RPC is synchronous: had it been allowed, the job would no longer be RUNNING)
ERR_SCANCEL=$(as "$U2" scancel "$J_STOP" 2>&1) && RC_SCANCEL=0 || RC_SCANCEL=$?
[ "$(squeue -h -j "$J_STOP" -o %T)" = RUNNING ] || fail "$U2 stopped $U1's job $J_STOP (scancel: $ERR_SCANCEL)"
as "$U1" scancel "$J_STOP" || fail "$U1 could not scancel her own job $J_STOP"

# Slurm refuses what it cannot run, at submit time
if err=$(as "$U1" sbatch --parsable --gres=gpu:$((GPUS + 1)) --wrap true 2>&1); then
    fail "sbatch --gres=gpu:$((GPUS + 1)) was accepted ($err); no node has that many GPUs"
fi
ERR_GPUS=$err
if err=$(as "$U1" sbatch --parsable -p no-such-partition --wrap true 2>&1); then
    fail "sbatch -p no-such-partition was accepted ($err)"
fi
ERR_PART=$err

# --- checks ------------------------------------------------------------------------
all_gpu=(); for x in "${J_GPU[@]}"; do all_gpu+=("$x"); done
wait_until 60 "the GPU jobs' completion records" have_records "${all_gpu[@]}"
for n in "${nodes[@]}"; do
    cvds=()
    for k in a b; do
        u=$U1; uid=$UID1; [ "$k" = b ] && { u=$U2; uid=$UID2; }
        j=${J_GPU[$n$k]} l=gpu-$n-$k
        expect "$j" JOBSTATE COMPLETED "$l"
        expect "$j" EXITCODE 0:0 "$l"
        expect "$j" NODES "$n" "$l"
        expect "$j" UID "$uid" "$l (the submitter's uid)"
        expect "$j" USERNAME "$u" "$l"
        [ "$(out "$u" "$l" host)" = "$n" ] || fail "$l: hostname in the job was '$(out "$u" "$l" host)', expected $n"
        [ "$(out "$u" "$l" uid)" = "$uid" ] || fail "$l: id -u in the job was '$(out "$u" "$l" uid)', expected $uid ($u)"
        cvd=$(out "$u" "$l" cvd)
        [[ $cvd =~ ^[0-9]+$ ]] && [ "$cvd" -lt "$GPUS" ] || fail "$l: CUDA_VISIBLE_DEVICES='$cvd', expected one GPU index below $GPUS"
        [ "$(out "$u" "$l" jobgpus)" = "$cvd" ] || fail "$l: SLURM_JOB_GPUS='$(out "$u" "$l" jobgpus)' but CUDA_VISIBLE_DEVICES=$cvd"
        cvds+=("$cvd")
    done
    [ "${cvds[0]}" != "${cvds[1]}" ] || fail "the two 1-GPU jobs on $n ran at once on the same GPU ${cvds[0]}"
    # they did run at once (each slept 2 s)
    a_end=$(out "$U1" "gpu-$n-a" end); b_start=$(out "$U2" "gpu-$n-b" start)
    b_end=$(out "$U2" "gpu-$n-b" end); a_start=$(out "$U1" "gpu-$n-a" start)
    awk "BEGIN{exit !($b_start < $a_end && $a_start < $b_end)}" ||
        fail "the two 1-GPU jobs on $n did not overlap (a $a_start-$a_end, b $b_start-$b_end)"
    say "ok: $n ran gpu-$n-a as $U1 on GPU ${cvds[0]} and gpu-$n-b as $U2 on GPU ${cvds[1]}, at once"
done

wait_until 60 "the array's 2 completion records" array_records "$J_ARRAY" 2
for t in 0 1; do
    f=$(grep -lx "ARRAYJOBID=$J_ARRAY" "$STATE"/jobcomp/records/* | xargs grep -lx "ARRAYTASKID=$t" | head -n1)
    [ -n "$f" ] || fail "no completion record for array task ${J_ARRAY}_$t"
    expect "${f##*/}" JOBSTATE COMPLETED "array task $t"
    expect "${f##*/}" UID "$UID1" "array task $t"
done
t0_end=$(out "$U1" array-0 end); t1_start=$(out "$U1" array-1 start)
[ -n "$t0_end" ] && [ -n "$t1_start" ] || fail "array task output missing ($STATE/users/$U1/array-*.out)"
awk "BEGIN{exit !($t0_end <= $t1_start)}" || fail "array %1: task 1 started ($t1_start) before task 0 ended ($t0_end)"
say "ok: array ${J_ARRAY} ran its 2 tasks one after the other (gap $(secs "$t0_end" "$t1_start")s), Nice=10"

wait_until 60 "the dependency chain's completion records" have_records "$J_A" "$J_B" "$J_C" "$J_F" "$J_G"
for j in "$J_A" "$J_B" "$J_C"; do expect "$j" JOBSTATE COMPLETED "chain"; done
a_end=$(out "$U1" chain-a end); b_start=$(out "$U1" chain-b start)
b_end=$(out "$U1" chain-b end); c_start=$(out "$U1" chain-c start)
awk "BEGIN{exit !($a_end <= $b_start && $b_end <= $c_start)}" ||
    fail "afterok chain out of order: a ended $a_end, b started $b_start, b ended $b_end, c started $c_start"
expect "$J_F" JOBSTATE FAILED "failing parent"
expect "$J_F" EXITCODE 3:0 "failing parent"
expect "$J_G" JOBSTATE CANCELLED "dependent of a failed job"
case "$(rec "$J_G" DEPENDENCY)" in "afterok:$J_F"*) ;; *) fail "fail-g: DEPENDENCY=$(rec "$J_G" DEPENDENCY)";; esac
expect "$J_G" NODES "" "dependent of a failed job"
[ ! -e "$STATE/users/$U2/fail-g.out" ] || fail "fail-g ran although its afterok parent failed"
say "ok: afterok chain a -> b -> c in order (a->b $(secs "$a_end" "$b_start")s, b->c $(secs "$b_end" "$c_start")s); the dependent of a failed job was cancelled"
wait_until 30 "the cancelled job's record" have_records "$J_STOP"
expect "$J_STOP" JOBSTATE CANCELLED "scancel'ed job"
say "ok: $U2 could not scancel $U1's job (exit $RC_SCANCEL: '$(echo "$ERR_SCANCEL" | tail -n1)'); $U1 could: CANCELLED"
say "ok: refused at submit: gpu:$((GPUS + 1)): '$(echo "$ERR_GPUS" | tail -n1)'; bad partition: '$(echo "$ERR_PART" | tail -n1)'"

# --- timings ------------------------------------------------------------------------
lat=()
for n in "${nodes[@]}"; do lat+=("$(secs "${T_SUB[${n}a]}" "$(out "$U1" "gpu-$n-a" start)")"); done
seq_lat=()
for i in 1 2 3 4 5; do
    t=$(now)
    j=$(submit "$U1" "latency-$i" -- 0)
    wait_until 30 "latency job $j" have_records "$j"
    seq_lat+=("$(secs "$t" "$(out "$U1" "latency-$i" start)")")
done
T20=$(now)
ids=()
for i in $(seq 1 20); do
    ids+=("$(as "$U1" sbatch --parsable -J trivial -o /dev/null --wrap true)") || fail "sbatch of trivial job $i refused"
done
T20_SUB=$(now)
wait_until 120 "20 trivial jobs" have_records "${ids[@]}"
T20_END=$(now)
for j in "${ids[@]}"; do expect "$j" JOBSTATE COMPLETED "trivial job"; done

wait_until 150 "the time limit job $J_TIMEOUT" have_records "$J_TIMEOUT"
T_TIMEOUT_SEEN=$(now)
expect "$J_TIMEOUT" JOBSTATE TIMEOUT "--time=0:01 job"
expect "$J_TIMEOUT" LIMIT 00:01:00 "--time=0:01 job"
killed_after=$(( $(rec "$J_TIMEOUT" END) - $(rec "$J_TIMEOUT" START) ))
say "ok: the --time=0:01 job ended TIMEOUT, ${killed_after}s after it started (limit 60 s; Slurm checks limits every 30 s)"

say "timings: boot $(secs "$T_BOOT0" "$T_BOOT1")s;" \
    "sbatch -> start ${lat[*]}s (parallel, pinned), ${seq_lat[*]}s (one at a time);" \
    "20 trivial jobs: submitted in $(secs "$T20" "$T20_SUB")s, all ended $(secs "$T20" "$T20_END")s after the first sbatch;" \
    "time limit job: record $(secs "$T_TIMEOUT_SUB" "$T_TIMEOUT_SEEN")s after sbatch"

# --- teardown, twice ---------------------------------------------------------------------
BOOTED=0
"$HERE/teardown.sh" || fail "teardown.sh failed"
second=$("$HERE/teardown.sh") || fail "second teardown.sh failed: $second"
case "$second" in *"nothing to do"*) ;; *) fail "second teardown.sh did something: $second";; esac
[ -z "$(ip netns list | awk -v p="$NAME." 'index($1, p) == 1')" ] || fail "network namespaces left: $(ip netns list)"
[ ! -e "$STATE" ] || fail "$STATE left"
say "PASSED"
