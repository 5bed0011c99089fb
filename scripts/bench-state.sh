#!/usr/bin/env bash
# What the registry's state costs a node as it grows (issue 26): starts its
# own local 3-node cluster (release build, scripts/cluster.sh on a temporary
# data directory and its own ports), raises the replicated limits that would
# refuse the load (idempotency_keys_max, idempotency_cached_bytes_max,
# memory_budget_bytes, through `oncekv admin config set`), loads KEYS new
# idempotency keys through the normal write path (loadgen oncekv-keyed: 64
# closed-loop clients, one new key per request, a put of a 64-byte value
# each, the puts cycling over 64,000 data keys), then measures and stops:
#
#   - the largest node RSS after the load (and the largest seen during it,
#     sampled every second);
#   - the largest node data directory (Raft log + snapshot files), per key;
#   - the load's throughput;
#   - a snapshot built on the leader (`oncekv admin snapshot`), wall time;
#   - a follower SIGKILLed and restarted: until `oncekv admin hash` finds
#     every node answering with one hash at one index;
#   - write p99 of keyed runs (the load's clients, new keys): quiet, while
#     the leader takes snapshot after snapshot, and while about EXPIRE_KEYS
#     of the oldest keys expire at once (the key TTL lowered in the middle
#     of the run so that they fall out of it; how many left is counted);
#   - a follower paused (SIGSTOP) until the leader's log is purged past it,
#     then resumed: the write p99 of each keyed run while the leader sends
#     it a snapshot and it catches up, against a run just before;
#   - a new node joining (`scripts/cluster.sh join 4`: added as a learner,
#     caught up by snapshot and log, promoted), wall time, no other load;
#     then another (node 5) while keyed runs go on: wall time, and the
#     write p99 of each run meanwhile (the first: while the snapshot is sent).
#
# Ends with one line:
#   keys=N rss_mb_max=M disk_bytes_per_key=B keyed_ops_s=R
# (N: live idempotency keys node 1 reports after the load; requests that
# failed — refused at a limit, or lost to an election — are counted in a
# `failed_requests=` line with the first failure's reason).
#
# WORKLOAD=claims loads KEYS finished claims instead (loadgen oncekv-claim:
# one claim → complete cycle per new key, the value as the result; rules
# version 3 keeps them in the record store) and measures the load only
# (MEASURE=load) or the load and then a snapshot, a restart and a join
# (MEASURE=restart, below), ending with
#   claims=N rss_mb_max=M disk_bytes_per_claim=B claim_cycles_s=R
# and each node's `oncekv_claim_records_in_memory`.
#
#   scripts/bench-state.sh KEYS
#
# environment:
#   WORKLOAD          "keys" (default) or "claims" (see above)
#   ONCEKV_PORT_BASE  node N on base+N, base+100+N, ... (default 9700)
#   CLIENTS           closed-loop clients (default 64)
#   VALUE_BYTES       bytes of each put's value (default 64)
#   MEASURE           "all" (default): snapshot, restart and join too;
#                     "restart": the load, then only a snapshot on the
#                     leader, a follower restarted until hashes agree and
#                     a new node joined with no other load (the one
#                     measurement beyond the load WORKLOAD=claims takes);
#                     "load": load, RSS and disk only; "catchup": load,
#                     then only the paused follower's catch-up
#   RAISE_LIMITS      1 (default): raise the limits to fit KEYS; 0: keep
#                     the cluster's defaults (and see where they refuse)
#   EXPIRE_KEYS       at least this many keys expire at once in the
#                     expiry measurement (default 1,000,000, at most a
#                     tenth of KEYS)
#   KEEP_DATA         1: keep the data directories and node logs (their
#                     path is printed at the end); default 0: delete them
#                     (the node logs are kept anyway when the load had
#                     refused requests)
#   REUSE             the data directory a KEEP_DATA=1 run printed: its
#                     cluster is started again (with this ONCEKV_BIN) and
#                     measured without a new load (MEASURE=catchup or
#                     restart; KEYS is then only the figure to report
#                     against; the directory is kept)
#   ONCEKV_BIN, LOADGEN  prebuilt binaries (default: build target/release)
#   ONCEKV_SCHED_GROUP "own" (default) or "shared": passed to
#                     scripts/cluster.sh. "own" runs each node in a session
#                     of its own, and Linux then shares the CPU equally
#                     between the nodes whatever priority a thread has in
#                     one; "shared" lets a catch-up's idle-priority threads
#                     yield to the other nodes, as on hosts of their own
#                     (docs/state-beyond-ram.md §4.9i). Printed first.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

case ${1:-} in
    -h | --help | help) usage; exit 0 ;;
esac
[[ $# == 1 && ${1:-} =~ ^[1-9][0-9]*$ ]] || { usage >&2; exit 2; }
readonly KEYS=$1
readonly CLIENTS=${CLIENTS:-64}
readonly VALUE_BYTES=${VALUE_BYTES:-64}
readonly WORKLOAD=${WORKLOAD:-keys}
[[ $WORKLOAD == keys || $WORKLOAD == claims ]] || { usage >&2; exit 2; }
if [[ $WORKLOAD == claims ]]; then
    # The other measurements drive keyed runs: with claims, the load alone,
    # or with the snapshot, restart and quiet join, which drive none.
    [[ ${MEASURE:-load} == load || $MEASURE == restart ]] || { echo "bench-state.sh: WORKLOAD=claims measures the load (MEASURE=load) or the load, a snapshot, a restart and a join (MEASURE=restart)" >&2; exit 2; }
    readonly MEASURE=${MEASURE:-load}
else
    readonly MEASURE=${MEASURE:-all}
fi
readonly RAISE_LIMITS=${RAISE_LIMITS:-1}
readonly REUSE=${REUSE:-}
KEEP_DATA=${KEEP_DATA:-0}
[[ -n $REUSE ]] && KEEP_DATA=1
[[ -z $REUSE || $MEASURE == catchup || $MEASURE == restart ]] \
    || { echo "bench-state.sh: REUSE measures MEASURE=catchup or MEASURE=restart" >&2; exit 2; }
readonly KEEP_DATA
EXPIRE_KEYS=${EXPIRE_KEYS:-1000000}
((EXPIRE_KEYS > $1 / 10)) && EXPIRE_KEYS=$(($1 / 10))
readonly EXPIRE_KEYS
# The width of a key group under the default 24 h key TTL (its 1,024th).
readonly KEY_GROUP_MS=84375
# Seconds of each keyed run that measures write latency.
readonly P99_RUN_S=15
export ONCEKV_PORT_BASE=${ONCEKV_PORT_BASE:-9700}
[[ $MEASURE == all || $MEASURE == load || $MEASURE == catchup || $MEASURE == restart ]] || { usage >&2; exit 2; }
((ONCEKV_PORT_BASE + 304 <= 65535)) || { echo "bench-state.sh: port base too high" >&2; exit 2; }

# Bounds of every wait (seconds).
readonly LEADER_WAIT_S=60
readonly APPLY_WAIT_S=600
readonly SNAPSHOT_WAIT_S=600
readonly RESTART_WAIT_S=900
readonly JOIN_WAIT_S=900
# The load itself: loadgen's longest run (at 3,000 keys/s, 10 M keys fit).
readonly LOAD_MAX_S=3600

die() {
    echo "bench-state.sh: $*" >&2
    exit 1
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT
cd "$ROOT"

if [[ -z ${ONCEKV_BIN:-} || -z ${LOADGEN:-} ]]; then
    echo "building release binaries (oncekv, loadgen)" >&2
    cargo build --release --quiet -p oncekv -p loadgen || die "build failed"
fi
export ONCEKV_BIN=${ONCEKV_BIN:-$ROOT/target/release/oncekv}
readonly LOADGEN=${LOADGEN:-$ROOT/target/release/loadgen}
[[ -x $ONCEKV_BIN && -x $LOADGEN ]] || die "missing $ONCEKV_BIN or $LOADGEN"

WORK=$(mktemp -d -t oncekv-bench-state.XXXXXX)
readonly WORK
if [[ -n $REUSE ]]; then
    [[ -d $REUSE/n1 ]] || die "REUSE=$REUSE holds no node directories"
    ONCEKV_DATA=$(cd "$REUSE" && pwd)
else
    ONCEKV_DATA=$WORK/data
fi
export ONCEKV_DATA
SAMPLER_PID=

cleanup() {
    [[ -n $SAMPLER_PID ]] && kill "$SAMPLER_PID" 2>/dev/null || true
    scripts/cluster.sh stop >/dev/null 2>&1 \
        || echo "bench-state.sh: scripts/cluster.sh stop failed (data: $ONCEKV_DATA)" >&2
    if ((KEEP_DATA == 1)); then
        echo "bench-state.sh: data and node logs kept in $ONCEKV_DATA" >&2
        if [[ -n $REUSE ]]; then rm -rf "$WORK"; fi
    else
        # Requests refused during the run: the node logs say why (an
        # election, a lease expiry); they are kept, the data is not.
        if [[ -s $WORK/refused ]]; then
            local logs
            logs=$(mktemp -d -t oncekv-bench-state-logs.XXXXXX)
            for log in "$ONCEKV_DATA"/n*/node.log; do
                [[ -f $log ]] && cp "$log" "$logs/$(basename "$(dirname "$log")").log"
            done
            echo "bench-state.sh: requests were refused; node logs kept in $logs" >&2
        fi
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

client_addr() { echo "127.0.0.1:$((ONCEKV_PORT_BASE + $1))"; }
endpoints() {
    local n list=()
    for n in "$@"; do list+=("$(client_addr "$n")"); done
    (IFS=,; echo "${list[*]}")
}
NODES=(1 2 3)
oncekv() { "$ONCEKV_BIN" "$@"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

node_pid() { cat "$ONCEKV_DATA/n$1/pid" 2>/dev/null; }
# Node N's RSS in MiB (0 when it is not running).
node_rss_mb() {
    local pid rss
    pid=$(node_pid "$1") || { echo 0; return; }
    rss=$(ps -o rss= -p "$pid" 2>/dev/null | tr -d ' ') || rss=0
    echo $(((${rss:-0} + 512) / 1024))
}
max_rss_mb() {
    local n max=0 rss
    for n in "${NODES[@]}"; do
        rss=$(node_rss_mb "$n")
        ((rss > max)) && max=$rss
    done
    echo "$max"
}
# The largest node data directory, in bytes (allocated).
max_disk_bytes() {
    local n max=0 bytes
    for n in "${NODES[@]}"; do
        bytes=$(du -sB1 "$ONCEKV_DATA/n$n/db" 2>/dev/null | cut -f1)
        ((${bytes:-0} > max)) && max=$bytes
    done
    echo "$max"
}

leader() {
    "$LOADGEN" oncekv-leader --endpoints "$(endpoints "${NODES[@]}")" --wait-s "$LEADER_WAIT_S"
}

# Node N's metrics gauge $2.
node_gauge() {
    curl -fsS --max-time 5 "http://127.0.0.1:$((ONCEKV_PORT_BASE + 200 + $1))/metrics" 2>/dev/null \
        | awk -v name="$2" '$1 == name { printf "%d", $2 }'
}
# Live records of the workload in node N's applied state: idempotency keys,
# or claims.
node_keys() {
    if [[ $WORKLOAD == claims ]]; then
        node_gauge "$1" oncekv_claims_live
    else
        node_gauge "$1" oncekv_idempotency_keys_live
    fi
}

# Waits until every node reports the same applied index (writes have
# stopped); prints the live idempotency keys node 1 reports then.
wait_applied() {
    local deadline=$((SECONDS + APPLY_WAIT_S)) lines indexes keys
    while true; do
        lines=$(oncekv status --json --endpoints "$(endpoints "${NODES[@]}")" 2>/dev/null || true)
        indexes=$(grep -o '"applied_index":[0-9]*' <<<"$lines" | sort -u | wc -l)
        if (($(grep -c '"applied_index"' <<<"$lines") == ${#NODES[@]} && indexes == 1)); then
            keys=$(node_keys 1)
            echo "${keys:-0}"
            return 0
        fi
        ((SECONDS < deadline)) || die "nodes not at one applied index within ${APPLY_WAIT_S}s"
        sleep 1
    done
}

echo "starting a 3-node cluster on $(endpoints "${NODES[@]}") (ONCEKV_SCHED_GROUP=${ONCEKV_SCHED_GROUP:-own})" >&2
scripts/cluster.sh start >"$WORK/cluster-start.log" 2>&1 \
    || { cat "$WORK/cluster-start.log" >&2; die "the cluster did not start"; }
LEADER=$(leader) || die "no leader"
# `cluster.sh start` returns once two nodes elect a leader; the third may
# still be opening a large state (a reused cluster's): wait until every
# node serves its metrics, which the limits and the measures read.
deadline=$((SECONDS + 300))
for n in "${NODES[@]}"; do
    until curl -fsS --max-time 5 -o /dev/null "http://127.0.0.1:$((ONCEKV_PORT_BASE + 200 + n))/metrics" 2>/dev/null; do
        ((SECONDS < deadline)) || die "node $n serves no metrics within 300s"
        sleep 0.5
    done
done

# The limits: records are charged 64 + principal + key + response (a put's
# response: 32) bytes; the keys here are ~34 bytes. Room for 2x that, and a
# budget above everything the state accounts.
if ((RAISE_LIMITS == 1)); then
    # Sized for KEYS, or for what a reused cluster already holds.
    sized=$KEYS
    if [[ -n $REUSE ]]; then
        live=$(node_keys 1)
        ((${live:-0} > sized)) && sized=$live
    fi
    # Room for the keyed runs of MEASURE=all too (up to ~2 M keys), and
    # for a catch-up's: up to 20 runs of ~200 k new keys each.
    keys_max=$((sized + sized / 10 + 1000))
    [[ $MEASURE != load ]] && keys_max=$((keys_max + 2000000))
    [[ $MEASURE == catchup ]] && keys_max=$((keys_max + 3000000))
    cached=$((keys_max * 256))
    ((cached < 268435456)) && cached=268435456
    # The rules' bound on it (16 GiB).
    ((cached > 17179869184)) && cached=17179869184
    budget=$((cached + cached / 4 + 536870912))
    ((budget < 1073741824)) && budget=1073741824
    # Key records lie outside the budget (rules version 2 on), so past a
    # few GB it only has to fit: a node refuses a budget it cannot hold
    # twice over plus 128 MiB, so at most what that leaves of this
    # machine's memory (a reused cluster of 32 M keys asked for more).
    # (A node also heeds its cgroup's memory.max; so does this.)
    mem_kib=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo 2>/dev/null || true)
    [[ $mem_kib =~ ^[0-9]+$ ]] || die "cannot read MemTotal from /proc/meminfo"
    mem=$((mem_kib * 1024))
    limit=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || true)
    [[ $limit =~ ^[0-9]+$ ]] && ((limit < mem)) && mem=$limit
    budget_max=$(((mem - 134217728) / 2))
    ((budget_max >= 1073741824)) \
        || die "this machine's $((mem >> 20)) MiB hold no memory budget of 1 GiB (a node needs twice the budget plus 128 MiB)"
    ((budget > budget_max)) && budget=$budget_max
    if [[ $WORKLOAD == claims ]]; then
        # Finished claims lie on disk (rules version 3): their count and
        # bytes limits, not the budget (held ones: at most CLIENTS); never
        # below version 3's defaults (50 M claims, 16 GiB).
        ((keys_max > 50000000)) || keys_max=50000000
        cached=17179869184
        limits=(--claims-max "$keys_max" --claim-cached-bytes-max "$cached")
    else
        limits=(--idempotency-keys-max "$keys_max" --idempotency-cached-bytes-max "$cached"
            --memory-budget-bytes "$budget")
    fi
    oncekv admin config set --endpoints "$(endpoints "${NODES[@]}")" "${limits[@]}" \
        >"$WORK/config.log" 2>&1 \
        || { cat "$WORK/config.log" >&2; die "raising the limits failed (with a budget: a node must have 2 x budget + 128 MiB of memory)"; }
    echo "limits: ${limits[*]}" >&2
fi

rss_before=$(max_rss_mb)
# The largest RSS during the load, sampled every second.
(
    peak=0
    while true; do
        rss=$(max_rss_mb)
        ((rss > peak)) && { peak=$rss; echo "$peak" >"$WORK/rss-peak"; }
        sleep 1
    done
) &
SAMPLER_PID=$!

# A keyed run of $1 seconds against the leader (new keys, the load's
# clients and values); prints loadgen's summary line.
keyed_run() {
    "$LOADGEN" oncekv-keyed --endpoint "$LEADER" --clients "$CLIENTS" \
        --value-bytes "$VALUE_BYTES" --duration-s "$1" --request-timeout-s 30 \
        2>>"$WORK/runs.err" || die "a keyed run failed ($(tail -n 1 "$WORK/runs.err"))"
}
field() { grep -o "$1=[0-9.]*" <<<"$2" | cut -d= -f2; }

# Node N's snapshot index, as it reports it.
node_snapshot_index() {
    oncekv status --json --endpoints "$(client_addr "$1")" 2>/dev/null \
        | grep -o '"snapshot_index":[0-9]*' | cut -d: -f2
}

# Write p99 while a snapshot is sent to a follower that fell behind, with
# no other change to the cluster: a keyed run with every node up (the
# baseline); a follower paused (SIGSTOP) through a keyed run and a
# snapshot on the leader, so that the leader's log is purged past it
# (`--logs-kept-after-snapshot` entries are kept, 1,000 by default); then
# resumed (SIGCONT) while keyed runs follow each other until every node
# answers one hash. Each run's p99 is printed, and whether the follower
# caught up by a snapshot (its snapshot index moved past the one it had).
catch_up_by_snapshot() {
    local follower="" n pid baseline before_index p99s="" errors="" runs=0 started after_index line
    for n in "${NODES[@]}"; do
        [[ $(client_addr "$n") == "$LEADER" ]] || { follower=$n; break; }
    done
    pid=$(cat "$ONCEKV_DATA/n$follower/pid")
    baseline=$(keyed_run "$P99_RUN_S")
    before_index=$(node_snapshot_index "$follower")
    kill -STOP "$pid"
    keyed_run "$P99_RUN_S" >/dev/null
    oncekv admin snapshot --node "$LEADER" --timeout-ms $((SNAPSHOT_WAIT_S * 1000)) \
        --endpoints "$LEADER" >"$WORK/snapshot.log" 2>&1 \
        || { kill -CONT "$pid"; cat "$WORK/snapshot.log" >&2; die "the snapshot before the catch-up failed"; }
    started=$(now)
    kill -CONT "$pid"
    # At most 20 runs (5 minutes): each ends with a check for agreement.
    while ((runs < 20)); do
        line=$(keyed_run "$P99_RUN_S")
        p99s+=" $(field p99_ms "$line")"
        errors+=" $(field errors "$line")"
        runs=$((runs + 1))
        oncekv admin hash --endpoints "$(endpoints "${NODES[@]}")" --timeout-ms 2000 \
            >"$WORK/hash.log" 2>&1 && break
    done
    after_index=$(node_snapshot_index "$follower")
    echo "write_p99_ms_before_follower_catch_up=$(field p99_ms "$baseline") ($baseline)"
    echo "follower_catch_up_s=$(since "$started") (node $follower paused through a ${P99_RUN_S}s run and a leader snapshot; its snapshot index ${before_index:-?} -> ${after_index:-?}; write p99 ms of each ${P99_RUN_S}s run from its resume:$p99s; requests failed in each:$errors)"
    if [[ -s $WORK/runs.err ]]; then
        echo "the runs' last error: $(tail -n 1 "$WORK/runs.err")"
    fi
}

load_started=$(now)
if [[ -n $REUSE ]]; then
    echo "reusing $ONCEKV_DATA: no load, leader $LEADER; one ${P99_RUN_S}s keyed run to warm the nodes' caches" >&2
    keyed_run "$P99_RUN_S" >/dev/null
    load_s=0
    ops=0
else
    if [[ $WORKLOAD == claims ]]; then
        echo "loading $KEYS claim -> complete cycles: $CLIENTS clients, $VALUE_BYTES-byte results, leader $LEADER" >&2
        load_mode=oncekv-claim
    else
        echo "loading $KEYS new keys: $CLIENTS clients, $VALUE_BYTES-byte values, leader $LEADER" >&2
        load_mode=oncekv-keyed
    fi
    started=$load_started
    load=$("$LOADGEN" "$load_mode" --endpoint "$LEADER" --clients "$CLIENTS" \
        --value-bytes "$VALUE_BYTES" --total-ops "$KEYS" --duration-s "$LOAD_MAX_S" \
        --request-timeout-s 30 2>"$WORK/load.err") || { cat "$WORK/load.err" >&2; die "the load failed"; }
    load_s=$(since "$started")
    echo "$load" >&2
    errors=$(grep -o 'errors=[0-9]*' <<<"$load" | cut -d= -f2)
    ops=$(grep -o 'ops/s=[0-9]*' <<<"$load" | cut -d= -f2)
    if ((${errors:-0} > 0)); then
        echo "failed_requests=$errors $(grep -o 'first: .*' "$WORK/load.err" | head -n 1)"
        echo "$errors" >"$WORK/refused"
    fi
fi
keys=$(wait_applied)
kill "$SAMPLER_PID" 2>/dev/null || true
wait "$SAMPLER_PID" 2>/dev/null || true
SAMPLER_PID=
rss_peak=$(cat "$WORK/rss-peak" 2>/dev/null || echo 0)
rss_after=$(max_rss_mb)
disk=$(max_disk_bytes)
disk_per_key=$((keys > 0 ? disk / keys : 0))
echo "load: keys=$keys seconds=$load_s ops/s=$ops rss_mb_before=$rss_before rss_mb_peak=$rss_peak rss_mb_after=$rss_after disk_bytes_max_node=$disk"
echo "rss_mb per node after load: $(for n in "${NODES[@]}"; do printf 'n%s=%s ' "$n" "$(node_rss_mb "$n")"; done)"

# A snapshot on the leader, then a follower killed and restarted: until
# every node answers one hash at one index.
snapshot_and_restart() {
    # A snapshot on the leader, the whole state encoded into a file.
    started=$(now)
    oncekv admin snapshot --node "$LEADER" --timeout-ms $((SNAPSHOT_WAIT_S * 1000)) \
        --endpoints "$(endpoints "${NODES[@]}")" >"$WORK/snapshot.log" 2>&1 \
        || { cat "$WORK/snapshot.log" >&2; die "the snapshot failed"; }
    echo "snapshot_on_leader_s=$(since "$started") ($(cat "$WORK/snapshot.log"))"

    # A follower killed and restarted: until every node answers one hash at
    # one index.
    follower=
    for n in "${NODES[@]}"; do
        [[ $(client_addr "$n") == "$LEADER" ]] || { follower=$n; break; }
    done
    started=$(now)
    scripts/cluster.sh restart "$follower" >"$WORK/restart.log" 2>&1 \
        || { cat "$WORK/restart.log" >&2; die "restarting node $follower failed"; }
    deadline=$((SECONDS + RESTART_WAIT_S))
    until oncekv admin hash --endpoints "$(endpoints "${NODES[@]}")" --timeout-ms 2000 \
        >"$WORK/hash.log" 2>&1; do
        ((SECONDS < deadline)) || { cat "$WORK/hash.log" >&2; die "no agreement within ${RESTART_WAIT_S}s"; }
        sleep 0.2
    done
    echo "follower_restart_until_hashes_agree_s=$(since "$started") (node $follower; $(tail -n 1 "$WORK/hash.log"))"
    echo "rss_mb of the restarted node: $(node_rss_mb "$follower")"
}

# A new node: learner, caught up (snapshot + log), promoted, with no other
# load (under the keyed runs' load a learner at 10 M keys did not catch up
# within `admin add-learner`'s 60 s).
join_quiet() {
    started=$(now)
    timeout "$JOIN_WAIT_S" scripts/cluster.sh join 4 >"$WORK/join.log" 2>&1 \
        || { cat "$WORK/join.log" >&2; die "node 4 did not join within ${JOIN_WAIT_S}s"; }
    echo "new_node_join_s=$(since "$started")"
}

if [[ $MEASURE == restart ]]; then
    snapshot_and_restart
    join_quiet
fi

if [[ $MEASURE == all ]]; then
    snapshot_and_restart

    # Write p99 without anything else going on, then while the leader
    # takes snapshot after snapshot.
    quiet=$(keyed_run "$P99_RUN_S")
    echo "write_p99_ms_quiet=$(field p99_ms "$quiet") ($quiet)"
    keyed_run "$P99_RUN_S" >"$WORK/during-snapshots.out" &
    run=$!
    snapshots=0
    while kill -0 "$run" 2>/dev/null; do
        oncekv admin snapshot --node "$LEADER" --timeout-ms $((SNAPSHOT_WAIT_S * 1000)) \
            --endpoints "$(endpoints "${NODES[@]}")" >"$WORK/snapshot.log" 2>&1 \
            || { cat "$WORK/snapshot.log" >&2; die "a snapshot during the run failed"; }
        snapshots=$((snapshots + 1))
    done
    wait "$run" || die "the run during snapshots failed"
    during=$(cat "$WORK/during-snapshots.out")
    echo "write_p99_ms_during_snapshots=$(field p99_ms "$during") ($snapshots snapshots taken; $during)"

    # At least EXPIRE_KEYS of the oldest keys expire at once: the key TTL
    # is lowered, in the middle of a run, to the age the EXPIRE_KEYS-th key
    # has now (keys came in at about the load's average rate) less one key
    # group. Keys expire by creation-time group, a 1,024th of the TTL they
    # were created under wide (KEY_GROUP_MS at the default 24 h): so the
    # group holding that key goes too, and up to a group's worth more than
    # EXPIRE_KEYS expire (the count is printed).
    if ((EXPIRE_KEYS > 0)); then
        age_ms=$(awk -v a="$load_started" -v b="$(now)" -v s="$load_s" -v e="$EXPIRE_KEYS" \
            -v k="$KEYS" -v w="$KEY_GROUP_MS" \
            'BEGIN { t = ((b - a) - s * e / k) * 1000 - w; printf "%d", t < 1000 ? 1000 : t }')
        before=$(node_keys 1)
        keyed_run "$P99_RUN_S" >"$WORK/during-expiry.out" &
        run=$!
        sleep $((P99_RUN_S / 2))
        oncekv admin config set --endpoints "$(endpoints "${NODES[@]}")" \
            --idempotency-key-ttl-ms "$age_ms" >"$WORK/ttl.log" 2>&1 \
            || { cat "$WORK/ttl.log" >&2; die "lowering the key TTL failed"; }
        wait "$run" || die "the run during expiry failed"
        during=$(cat "$WORK/during-expiry.out")
        after=$(wait_applied)
        expired=$((before + $(field ok "$during") - after))
        echo "write_p99_ms_during_expiry=$(field p99_ms "$during") ($expired keys expired at \
a TTL of ${age_ms} ms; $during)"
    fi

    catch_up_by_snapshot
fi

if [[ $MEASURE == catchup ]]; then
    catch_up_by_snapshot
fi

if [[ $MEASURE == all ]]; then
    join_quiet

    # Another new node while the keyed load goes on: the leader streams it
    # a snapshot, then the log written meanwhile. Keyed runs of P99_RUN_S
    # follow each other until node 5 is a voter; each run's p99 is printed
    # (the first one is while the snapshot is sent).
    started=$(now)
    timeout "$JOIN_WAIT_S" scripts/cluster.sh join 5 >"$WORK/join5.log" 2>&1 &
    joining=$!
    p99s=""
    while kill -0 "$joining" 2>/dev/null; do
        p99s+=" $(field p99_ms "$(keyed_run "$P99_RUN_S")")"
    done
    if wait "$joining"; then
        echo "new_node_join_under_load_s=$(since "$started") (write p99 ms of each ${P99_RUN_S}s run meanwhile:$p99s)"
    else
        echo "new_node_join_under_load_s=failed after $(since "$started") s ($(tail -n 1 "$WORK/join5.log"); write p99 ms of each ${P99_RUN_S}s run meanwhile:$p99s)"
    fi
fi

if [[ $WORKLOAD == claims ]]; then
    echo "claim records in memory per node: $(for n in "${NODES[@]}"; do printf 'n%s=%s ' "$n" "$(node_gauge "$n" oncekv_claim_records_in_memory)"; done)"
    echo "claims=$keys rss_mb_max=$rss_after disk_bytes_per_claim=$disk_per_key claim_cycles_s=$ops"
else
    echo "keys=$keys rss_mb_max=$rss_after disk_bytes_per_key=$disk_per_key keyed_ops_s=$ops"
fi
