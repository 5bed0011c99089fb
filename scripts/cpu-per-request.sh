#!/usr/bin/env bash
# Where a mode's CPU goes, node by node: starts a local 3-node cluster
# (scripts/cluster.sh, release build, its own data directory and ports),
# drives its leader with the project's generator (loadgen/) in each MODE
# given, one after another on the same cluster, and prints per run the
# throughput and every node's CPU (user + system, from /proc/PID/stat)
# per request in microseconds. Used to find why Execute trails
# ExecutePlain (docs/benchmarks.md, "Execute against ExecutePlain"):
# the same modes twice show the cost of a run that creates new keys
# against one that updates them.
#
#   scripts/cpu-per-request.sh CLIENTS SECONDS MODE...
#   scripts/cpu-per-request.sh 256 8 oncekv-exec oncekv-exec oncekv-plain oncekv-plain
#
# env: ONCEKV_PORT_BASE (default 9600); ONCEKV_BIN, the server binary
# (default: this tree's release build; another build's copy compares two
# builds on the same machine). Linux only (/proc).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

die() { echo "error: $*" >&2; exit 1; }
(($# >= 3)) || die "usage: scripts/cpu-per-request.sh CLIENTS SECONDS MODE..."
clients=$1
seconds=$2
shift 2

cargo build --release --quiet -p oncekv -p loadgen || die "build failed"
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
loadgen=$target_dir/release/loadgen
ticks_per_second=$(getconf CLK_TCK)

ONCEKV_DATA=$(mktemp -d -t oncekv-cpu.XXXXXX)
export ONCEKV_DATA ONCEKV_PORT_BASE=${ONCEKV_PORT_BASE:-9600}
export ONCEKV_BIN=${ONCEKV_BIN:-$ROOT/target/release/oncekv}
trap 'scripts/cluster.sh stop >/dev/null 2>&1 || true; rm -rf "$ONCEKV_DATA"' EXIT
scripts/cluster.sh start >/dev/null || die "the cluster did not start"
endpoints="127.0.0.1:$((ONCEKV_PORT_BASE + 1)),127.0.0.1:$((ONCEKV_PORT_BASE + 2)),127.0.0.1:$((ONCEKV_PORT_BASE + 3))"
leader=$("$loadgen" oncekv-leader --endpoints "$endpoints" --wait-s 30) || die "no leader"
pids=()
for n in 1 2 3; do
    pids+=("$(cat "$ONCEKV_DATA/n$n/pid")")
done

# user + system ticks of each pid, one per line.
ticks() {
    local pid
    for pid in "$@"; do
        awk '{print $14 + $15}' "/proc/$pid/stat"
    done
}

for mode in "$@"; do
    mapfile -t before < <(ticks "${pids[@]}")
    line=$("$loadgen" "$mode" --endpoint "$leader" --clients "$clients" --duration-s "$seconds") \
        || die "loadgen $mode failed"
    mapfile -t after < <(ticks "${pids[@]}")
    ok=$(grep -oE 'ok=[0-9]+' <<<"$line" | cut -d= -f2)
    ((ok > 0)) || die "no request succeeded: $line"
    per_node=""
    for i in 0 1 2; do
        us=$(awk -v t=$((after[i] - before[i])) -v hz="$ticks_per_second" -v ok="$ok" \
            'BEGIN { printf "%.1f", t * 1000000 / hz / ok }')
        per_node+=" n$((i + 1))=${us}us"
    done
    echo "$mode $(grep -oE 'ops/s=[0-9]+' <<<"$line") leader=$leader cpu_per_request:$per_node"
done
