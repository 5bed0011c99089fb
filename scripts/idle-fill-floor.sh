#!/usr/bin/env bash
# What work that only fills idle CPU time costs the write path on this
# machine (docs/state-beyond-ram.md §4.9k): the floor under any catch-up.
#
# Starts the cluster a `KEEP_DATA=1 scripts/bench-state.sh KEYS` run kept
# (REUSE=<its data directory>, as bench-state.sh takes it) and runs the
# load's 15 s keyed runs (64 clients, one new key per request) in ROUNDS
# rounds of three: quiet; beside CPU spinners (two, or SPINNERS), each in
# a session of its own whose autogroup is at nice 19 (what a node catching
# up does to itself, §4.9j) and which run at the idle policy (SCHED_IDLE)
# inside it; beside the same spinners at normal policy. Each line gives the
# run's completed requests and write p99. The spinners do no IO and touch
# no memory to speak of: what they cost is the scheduler's, not the
# disk's or the caches'.
#
#   REUSE=<dir> scripts/idle-fill-floor.sh
#
# environment:
#   REUSE             the data directory of a KEEP_DATA=1 bench-state.sh run
#   ROUNDS            rounds of three runs (default 3)
#   SPINNERS          how many spinners (default 2)
#   PIN               a CPU to pin every spinner to (taskset -c; default:
#                     none, the scheduler places them)
#   ONCEKV_PORT_BASE  node N on base+N, ... (default 9700, as bench-state.sh)
#   ONCEKV_BIN, LOADGEN  prebuilt binaries (default: target/release)
#
# Linux only (autogroup, chrt). Every spinner is killed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
die() { echo "idle-fill-floor.sh: $*" >&2; exit 1; }

[[ -n ${REUSE:-} && -d ${REUSE:-}/n1 ]] || die "REUSE=<the data directory of a KEEP_DATA=1 scripts/bench-state.sh run>"
ROUNDS=${ROUNDS:-3}
export ONCEKV_DATA=$(cd "$REUSE" && pwd)
export ONCEKV_PORT_BASE=${ONCEKV_PORT_BASE:-9700}
export ONCEKV_BIN=${ONCEKV_BIN:-$ROOT/target/release/oncekv}
LOADGEN=${LOADGEN:-$ROOT/target/release/loadgen}
[[ -x $ONCEKV_BIN && -x $LOADGEN ]] || die "missing $ONCEKV_BIN or $LOADGEN (cargo build --release -p oncekv -p loadgen)"
command -v chrt >/dev/null || die "needs chrt (util-linux)"
[[ -z ${PIN:-} ]] || command -v taskset >/dev/null || die "PIN needs taskset (util-linux)"
[[ -w /proc/self/autogroup ]] || die "needs autogroup (/proc/self/autogroup)"

SPINNERS=()
cleanup() {
    stop_spinners
    scripts/cluster.sh stop >/dev/null 2>&1 || echo "idle-fill-floor.sh: scripts/cluster.sh stop failed" >&2
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# SPINNERS spinners, each leading a new session (a new autogroup) set to
# nice 19, pinned to PIN if set; $1 "idle" also puts each at SCHED_IDLE.
start_spinners() {
    local policy=() pin=() i
    [[ $1 == idle ]] && policy=(chrt -i 0)
    [[ -n ${PIN:-} ]] && pin=(taskset -c "$PIN")
    for i in $(seq 1 "${SPINNERS:-2}"); do
        setsid "${pin[@]}" "${policy[@]}" bash -c 'echo 19 > /proc/self/autogroup; while :; do :; done' &
        SPINNERS+=($!)
    done
}
stop_spinners() {
    local pid
    for pid in "${SPINNERS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${SPINNERS[@]}"; do wait "$pid" 2>/dev/null || true; done
    SPINNERS=()
}

scripts/cluster.sh start >/dev/null
leader=""
for _ in $(seq 1 120); do
    for n in 1 2 3; do
        addr=127.0.0.1:$((ONCEKV_PORT_BASE + n))
        if "$ONCEKV_BIN" status --json --endpoints "$addr" 2>/dev/null | grep -q '"role":"leader"'; then
            leader=$addr
        fi
    done
    [[ -n $leader ]] && break
    sleep 0.5
done
[[ -n $leader ]] || die "no leader within 60 s"

keyed_run() {
    "$LOADGEN" oncekv-keyed --endpoint "$leader" --clients 64 --value-bytes 64 \
        --duration-s 15 --request-timeout-s 30 2>/dev/null \
        | grep -o 'ok=[0-9]*\|errors=[0-9]*\|p99_ms=[0-9.]*' | tr '\n' ' '
}

echo "leader $leader; one 15 s run to warm the caches"
keyed_run >/dev/null
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round quiet:                        $(keyed_run)"
    start_spinners idle
    echo "round $round spinners, group nice 19, idle: $(keyed_run)"
    stop_spinners
    start_spinners normal
    echo "round $round spinners, group nice 19:       $(keyed_run)"
    stop_spinners
done
