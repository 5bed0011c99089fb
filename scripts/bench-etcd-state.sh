#!/usr/bin/env bash
# etcd's side of scripts/bench-state.sh (issue 26: "keyed throughput with
# 10 M live keys ≥ 1.5× etcd's Txn put-if-absent, etcd with as many records
# as it can hold"): starts a local 3-node etcd (Debian's etcd-server, its
# own ports and temporary data directories, the backend quota raised to
# QUOTA_BYTES), and with the project's generator (loadgen etcd-once: 64
# closed-loop clients, each request a Txn that puts a 64-byte value under a
# new key only if the key was never created — a consumer's deduplication
# record on etcd):
#
#   1. measures a run on the empty cluster (RUN_S seconds);
#   2. loads RECORDS new records (or until etcd refuses them: its quota);
#   3. measures the same run again, at that size;
#
# and prints the members' largest RSS, the data directories' bytes per
# record (WAL, snapshots and the bbolt database), etcd's own database size,
# and ends with one line:
#   records=N rss_mb_max=M disk_bytes_per_record=B once_ops_s_empty=E once_ops_s_full=F p99_ms_empty=P p99_ms_full=Q load_ops_s=L
#
#   scripts/bench-etcd-state.sh RECORDS
#
# environment:
#   ETCD_PORT_BASE  member N listens on base+N (clients), base+100+N (peers)
#                   (default 24400)
#   CLIENTS         closed-loop clients (default 64)
#   RUN_S           seconds of each measured run (default 15)
#   QUOTA_BYTES     etcd's --quota-backend-bytes (default 8 GiB, the most
#                   etcd's documentation suggests)
#   LOADGEN         a prebuilt loadgen (default: build target/release)
#
# needs etcd and etcdctl: apt-get install -y etcd-server etcd-client
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

case ${1:-} in
    -h | --help | help) usage; exit 0 ;;
esac
[[ $# == 1 && ${1:-} =~ ^[1-9][0-9]*$ ]] || { usage >&2; exit 2; }
RECORDS=$1
ETCD_PORT_BASE=${ETCD_PORT_BASE:-24400}
CLIENTS=${CLIENTS:-64}
RUN_S=${RUN_S:-15}
QUOTA_BYTES=${QUOTA_BYTES:-$((8 << 30))}
for number in "$ETCD_PORT_BASE" "$CLIENTS" "$RUN_S" "$QUOTA_BYTES"; do
    [[ $number =~ ^[1-9][0-9]*$ ]] || { usage >&2; exit 2; }
done
((ETCD_PORT_BASE + 103 <= 65535)) || { echo "ETCD_PORT_BASE too high" >&2; exit 2; }

die() {
    echo "bench-etcd-state.sh: $*" >&2
    exit 1
}

for tool in etcd etcdctl; do
    command -v "$tool" >/dev/null \
        || die "'$tool' is not installed: apt-get install -y etcd-server etcd-client"
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
if [[ -z ${LOADGEN:-} ]]; then
    cargo build --release --quiet -p loadgen || die "build failed"
    LOADGEN=$(cargo metadata --format-version 1 --no-deps \
        | grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)/release/loadgen
fi
[[ -x $LOADGEN ]] || die "no loadgen at $LOADGEN"

WORK=$(mktemp -d -t oncekv-etcd-state.XXXXXX)
readonly WORK
ETCD_SCRIPT=bench-etcd-state.sh
# shellcheck source=scripts/lib/etcd.sh
source "$ROOT/scripts/lib/etcd.sh"
etcdctl3() { ETCDCTL_API=3 etcdctl --endpoints "$(etcd_endpoints)" --command-timeout 30s "$@"; }

cleanup() {
    stop_etcd
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_etcd oncekv-bench-etcd-state --quota-backend-bytes "$QUOTA_BYTES"
leader=$("$LOADGEN" etcd-leader --endpoints "$(etcd_endpoints)" --wait-s "$ETCD_WAIT_S") \
    || die "no etcd leader"
echo "etcd leader $leader; quota $QUOTA_BYTES bytes; $CLIENTS clients"

field() { echo "$2" | grep -oE "$1=[0-9.]+" | head -1 | cut -d= -f2; }
once() {
    "$LOADGEN" etcd-once --endpoint "$leader" --clients "$CLIENTS" "$@" 2>&1 | tail -1
}
# The range's count (etcdctl 3.4 has no --count-only; one key is returned).
records() { etcdctl3 get "" --prefix --keys-only --limit 1 --write-out=json | grep -oE '"count":[0-9]+' | cut -d: -f2; }
max_rss_mb() {
    local pid rss max=0
    for pid in "${ETCD_PIDS[@]}"; do
        rss=$(ps -o rss= -p "$pid" 2>/dev/null | tr -d ' ') || rss=0
        rss=$(((${rss:-0} + 512) / 1024))
        ((rss > max)) && max=$rss
    done
    echo "$max"
}

empty=$(once --duration-s "$RUN_S")
echo "empty: $empty"
have=$(records)
load_started=$SECONDS
load_ok=0
# In rounds of at most 10 minutes, so that a run stops at etcd's quota
# (every request refused) rather than after all of RECORDS.
while ((have < RECORDS)); do
    round=$(once --duration-s 600 --total-ops $((RECORDS - have)))
    echo "load: $round (RSS max $(max_rss_mb) MB)"
    ok=$(field ok "$round")
    load_ok=$((load_ok + ${ok:-0}))
    have=$(records)
    if [[ $(field errors "$round") != 0 ]] && ((${ok:-0} == 0)); then
        echo "etcd refuses new records at $have: $(etcdctl3 alarm list 2>&1 | head -3)"
        break
    fi
done
load_s=$((SECONDS - load_started))
load_ops_s=$((load_ok / (load_s > 0 ? load_s : 1)))
echo "loaded $load_ok records in $load_s s ($load_ops_s/s); $have records in all"
echo "etcd endpoint status:"
etcdctl3 endpoint status --write-out=table || true
rss=$(max_rss_mb)
disk=0
for n in 1 2 3; do
    bytes=$(du -sb "$WORK/etcd-n$n" | cut -f1)
    ((bytes > disk)) && disk=$bytes
done
full=$(once --duration-s "$RUN_S")
echo "full: $full"
have=$(records)
echo "records=$have rss_mb_max=$rss disk_bytes_per_record=$((disk / (have > 0 ? have : 1))) once_ops_s_empty=$(field ops/s "$empty") once_ops_s_full=$(field ops/s "$full") p99_ms_empty=$(field p99_ms "$empty") p99_ms_full=$(field p99_ms "$full") load_ops_s=$load_ops_s"
