#!/usr/bin/env bash
# oncekv against etcd on this machine, in one run: a local 3-node etcd
# (Debian's etcd-server) and a local 3-node oncekv (scripts/cluster.sh,
# release build) driven by the project's own closed-loop generator
# (loadgen/), interleaved per client count (etcd Put, then oncekv Execute,
# then oncekv ExecutePlain) so that the machine's noise hits all of them
# alike. Each client has one request in flight; 64-byte puts; 4 HTTP/2
# connections per run; every request goes to the current leader.
#
#   scripts/bench-vs-etcd.sh [CLIENT_COUNTS...]      (default: 1 16 64 256)
#   TLS=1 scripts/bench-vs-etcd.sh [CLIENT_COUNTS...]
#   CLAIMS=1 scripts/bench-vs-etcd.sh [CLIENT_COUNTS...]
#
# With TLS=1 a second oncekv cluster runs beside the first with TLS and
# authentication on (scripts/cluster.sh start --tls), and every client
# count also gets an oncekv Execute run against it (loadgen --ca --token,
# TLS to the leader, a bearer token on every call): the table gains the
# columns "Execute TLS" and "TLS / plain".
#
# With CLAIMS=1 every client count also gets the reserve -> record cycle
# (rule 20), one new key per cycle, two log writes per cycle on both sides:
# an etcd-claim run (a Txn putting "in progress" only if the key's
# create_revision is 0, then a Put of the 64-byte result) and an
# oncekv-claim run (a Claim that wins the key, then a CompleteClaim of its
# fence with the 64-byte result), interleaved with the others. One cycle is
# one operation of loadgen; the table gains the columns "etcd claim cycle/s
# (p99)", "oncekv claim cycle/s (p99)" and "claim / etcd".
#
# Prints one line per run and, last, a markdown table with the same-run
# ratios. Only the ratios mean much: absolute figures on a small shared
# machine move by ±20% from run to run.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/bench-vs-etcd.sh [CLIENT_COUNTS...]   (default: 1 16 64 256)

environment:
  DURATION           seconds of each measured run (default 8)
  ETCD_PORT_BASE     etcd member N listens on base+N (clients) and
                     base+100+N (peers) (default 23400)
  ONCEKV_PORT_BASE   oncekv node N on base+N, base+100+N, base+200+N
                     (default 9400; see scripts/cluster.sh)
  TLS                1: also measure oncekv Execute with TLS and a token,
                     on a second cluster at ONCEKV_TLS_PORT_BASE
                     (default ONCEKV_PORT_BASE + 1000)
  CLAIMS             1: also measure the claim cycle (etcd Txn put-if-absent
                     + Put against oncekv Claim + CompleteClaim), one new
                     key per cycle

needs etcd and etcdctl: apt-get install -y etcd-server etcd-client
EOF
}

readonly LEADER_WAIT_S=30

die() {
    echo "bench-vs-etcd.sh: $*" >&2
    exit 1
}

case ${1:-} in
    -h | --help | help) usage; exit 0 ;;
esac

DURATION=${DURATION:-8}
ETCD_PORT_BASE=${ETCD_PORT_BASE:-23400}
ONCEKV_PORT_BASE=${ONCEKV_PORT_BASE:-9400}
TLS=${TLS:-0}
[[ $TLS == 0 || $TLS == 1 ]] || { usage >&2; exit 2; }
CLAIMS=${CLAIMS:-0}
[[ $CLAIMS == 0 || $CLAIMS == 1 ]] || { usage >&2; exit 2; }
for number in "$DURATION" "$ETCD_PORT_BASE" "$ONCEKV_PORT_BASE" "$@"; do
    [[ $number =~ ^[1-9][0-9]*$ ]] || { usage >&2; exit 2; }
done
ONCEKV_TLS_PORT_BASE=${ONCEKV_TLS_PORT_BASE:-$((ONCEKV_PORT_BASE + 1000))}
[[ $ONCEKV_TLS_PORT_BASE =~ ^[1-9][0-9]*$ ]] || { usage >&2; exit 2; }
((ETCD_PORT_BASE + 103 <= 65535 && ONCEKV_PORT_BASE + 303 <= 65535 && ONCEKV_TLS_PORT_BASE + 303 <= 65535)) \
    || die "port bases too high"
if (($# > 0)); then
    COUNTS=("$@")
else
    COUNTS=(1 16 64 256)
fi

for tool in etcd etcdctl; do
    if ! command -v "$tool" >/dev/null; then
        echo "bench-vs-etcd.sh: '$tool' is not installed; install Debian's etcd with:" >&2
        echo "    apt-get install -y etcd-server etcd-client" >&2
        exit 2
    fi
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT
cd "$ROOT"

echo "building release binaries (oncekv, loadgen)" >&2
cargo build --release --quiet -p oncekv -p loadgen || die "build failed"
# scripts/cluster.sh runs $ROOT/target/release/oncekv: the build must land there.
target_dir=$(cargo metadata --format-version 1 --no-deps \
    | grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)
[[ -n $target_dir ]] || die "cargo metadata named no target directory"
if [[ $(realpath "$target_dir") != $(realpath -m "$ROOT/target") ]]; then
    die "cargo builds into $target_dir, but scripts/cluster.sh runs $ROOT/target/release/oncekv; unset CARGO_TARGET_DIR"
fi
readonly LOADGEN=$target_dir/release/loadgen

WORK=$(mktemp -d -t oncekv-vs-etcd.XXXXXX)
readonly WORK
ETCD_SCRIPT=bench-vs-etcd.sh
# shellcheck source=scripts/lib/etcd.sh
source "$ROOT/scripts/lib/etcd.sh"
export ONCEKV_DATA=$WORK/oncekv ONCEKV_PORT_BASE
readonly TLS_DATA=$WORK/oncekv-tls

oncekv_client() { echo "127.0.0.1:$((ONCEKV_PORT_BASE + $1))"; }
oncekv_endpoints() { echo "$(oncekv_client 1),$(oncekv_client 2),$(oncekv_client 3)"; }
oncekv_tls_client() { echo "127.0.0.1:$((ONCEKV_TLS_PORT_BASE + $1))"; }
oncekv_tls_endpoints() { echo "$(oncekv_tls_client 1),$(oncekv_tls_client 2),$(oncekv_tls_client 3)"; }
# scripts/cluster.sh on the TLS cluster's data and ports.
tls_cluster() { ONCEKV_DATA=$TLS_DATA ONCEKV_PORT_BASE=$ONCEKV_TLS_PORT_BASE scripts/cluster.sh "$@"; }


cleanup() {
    stop_etcd
    if [[ -d $ONCEKV_DATA ]]; then
        scripts/cluster.sh stop >/dev/null 2>&1 \
            || echo "bench-vs-etcd.sh: scripts/cluster.sh stop failed (data: $ONCEKV_DATA)" >&2
    fi
    if [[ -d $TLS_DATA ]]; then
        tls_cluster stop >/dev/null 2>&1 \
            || echo "bench-vs-etcd.sh: scripts/cluster.sh stop failed (data: $TLS_DATA)" >&2
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM



# Fails if something already listens on one of the ports both clusters use
# (a node that cannot bind dies, and its log would say only that).
check_ports_free() {
    local n port
    for n in 1 2 3; do
        for port in $((ETCD_PORT_BASE + n)) $((ETCD_PORT_BASE + 100 + n)); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                die "127.0.0.1:$port is taken; pick another ETCD_PORT_BASE"
            fi
        done
        for port in $((ONCEKV_PORT_BASE + n)) $((ONCEKV_PORT_BASE + 100 + n)) $((ONCEKV_PORT_BASE + 200 + n)) $((ONCEKV_PORT_BASE + 300 + n)); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                die "127.0.0.1:$port is taken; pick another ONCEKV_PORT_BASE"
            fi
        done
        ((TLS == 1)) || continue
        for port in $((ONCEKV_TLS_PORT_BASE + n)) $((ONCEKV_TLS_PORT_BASE + 100 + n)) $((ONCEKV_TLS_PORT_BASE + 200 + n)) $((ONCEKV_TLS_PORT_BASE + 300 + n)); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                die "127.0.0.1:$port is taken; pick another ONCEKV_TLS_PORT_BASE"
            fi
        done
    done
}

check_ports_free
echo "starting a 3-node etcd ($(etcd_endpoints)) and a 3-node oncekv ($(oncekv_endpoints))" >&2
start_etcd oncekv-bench-vs-etcd
scripts/cluster.sh start >"$WORK/cluster-start.log" 2>&1 \
    || { cat "$WORK/cluster-start.log" >&2; die "the oncekv cluster did not start"; }
if ((TLS == 1)); then
    echo "starting a 3-node oncekv with TLS and authentication ($(oncekv_tls_endpoints))" >&2
    tls_cluster start --tls >"$WORK/cluster-tls-start.log" 2>&1 \
        || { cat "$WORK/cluster-tls-start.log" >&2; die "the TLS oncekv cluster did not start"; }
fi

etcd_leader() { "$LOADGEN" etcd-leader --endpoints "$(etcd_endpoints)" --wait-s "$LEADER_WAIT_S"; }
oncekv_leader() { "$LOADGEN" oncekv-leader --endpoints "$(oncekv_endpoints)" --wait-s "$LEADER_WAIT_S"; }
oncekv_tls_leader() {
    "$LOADGEN" oncekv-leader --endpoints "$(oncekv_tls_endpoints)" --wait-s "$LEADER_WAIT_S" \
        --ca "$TLS_DATA/pki/ca.pem"
}

etcd_version=$(etcd --version | sed -n 's/^etcd Version: //p')
oncekv_commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "etcd $etcd_version, oncekv $oncekv_commit, $(nproc) cores, ${DURATION} s per run," \
    "clients ${COUNTS[*]}"

# One run; prints its line (or a line saying it failed) and keeps it.
LINES=()
run() {
    local mode=$1 clients=$2 leader line
    local load=$mode credentials=()
    case $mode in
        etcd-*) leader=$(etcd_leader) ;;
        oncekv-exec-tls)
            leader=$(oncekv_tls_leader)
            load=oncekv-exec
            credentials=(--ca "$TLS_DATA/pki/ca.pem" --token "$(cat "$TLS_DATA/pki/client.token")")
            ;;
        *) leader=$(oncekv_leader) ;;
    esac || { LINES+=("mode=$mode clients=$clients failed: no leader"); echo "${LINES[-1]}"; return; }
    if line=$("$LOADGEN" "$load" --endpoint "$leader" --clients "$clients" --duration-s "$DURATION" \
        "${credentials[@]+"${credentials[@]}"}"); then
        LINES+=("${line/#mode=$load /mode=$mode } leader=$leader")
    else
        LINES+=("mode=$mode clients=$clients failed")
    fi
    echo "${LINES[-1]}"
}

MODES=(etcd-put oncekv-exec oncekv-plain)
((TLS == 1)) && MODES+=(oncekv-exec-tls)
((CLAIMS == 1)) && MODES+=(etcd-claim oncekv-claim)
for clients in "${COUNTS[@]}"; do
    for mode in "${MODES[@]}"; do
        run "$mode" "$clients"
    done
done

echo
header="| clients | etcd Put ops/s (p50/p99 ms) | oncekv Execute ops/s (p50/p99 ms) | ExecutePlain ops/s (p50/p99 ms) |"
((TLS == 1)) && header+=" Execute TLS ops/s (p50/p99 ms) |"
header+=" exec/etcd | p99 exec/etcd | exec/plain |"
((TLS == 1)) && header+=" TLS/plain exec |"
((CLAIMS == 1)) && header+=" etcd claim cycle/s (p99 ms) | oncekv claim cycle/s (p99 ms) | claim / etcd |"
echo "$header"
# One right-aligned rule per column of the header.
echo "$header" | sed -e 's/[^|]\{1,\}/ ---: /g'
printf '%s\n' "${LINES[@]}" | awk -v tls="$TLS" -v claims="$CLAIMS" '
    function field(name,    i, kv) {
        for (i = 1; i <= NF; i++) {
            split($i, kv, "=")
            if (kv[1] == name) return kv[2]
        }
        return ""
    }
    function cell(m, c) {
        if (!((m, c) in ops)) return "failed"
        return sprintf("%d (%.2f/%.2f)", ops[m, c], p50[m, c], p99[m, c])
    }
    function cycles(m, c) {
        if (!((m, c) in ops)) return "failed"
        return sprintf("%d (%.2f)", ops[m, c], p99[m, c])
    }
    function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "-" : sprintf("%.2f", a / b) }
    {
        m = field("mode"); c = field("clients")
        if (!(c in seen)) { seen[c] = 1; order[++n] = c }
        if ($0 ~ /failed/) next
        ops[m, c] = field("ops/s"); p50[m, c] = field("p50_ms"); p99[m, c] = field("p99_ms")
    }
    END {
        for (i = 1; i <= n; i++) {
            c = order[i]
            printf "| %s | %s | %s | %s |", c,
                cell("etcd-put", c), cell("oncekv-exec", c), cell("oncekv-plain", c)
            if (tls == 1) printf " %s |", cell("oncekv-exec-tls", c)
            printf " %s | %s | %s |",
                ratio(ops["oncekv-exec", c], ops["etcd-put", c]),
                ratio(p99["oncekv-exec", c], p99["etcd-put", c]),
                ratio(ops["oncekv-exec", c], ops["oncekv-plain", c])
            if (tls == 1) printf " %s |", ratio(ops["oncekv-exec-tls", c], ops["oncekv-exec", c])
            if (claims == 1) printf " %s | %s | %s |", cycles("etcd-claim", c), cycles("oncekv-claim", c),
                ratio(ops["oncekv-claim", c], ops["etcd-claim", c])
            printf "\n"
        }
    }'
