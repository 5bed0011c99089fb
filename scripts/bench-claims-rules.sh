#!/usr/bin/env bash
# Claim -> complete cycles at rules version 2 against version 3 on the same
# binary (docs/benchmarks.md, "Rules version 3"): ROUNDS alternating pairs
# of fresh local 3-node clusters (scripts/cluster.sh, its own ports and a
# temporary data directory each), one started at version 2 through the
# test fault `--fault bootstrap-at-rules-2`, one at version 3 (the default),
# each driven by `loadgen oncekv-claim` for SECONDS at every client count.
# Prints one line per run: round, version, clients, loadgen's summary.
#
#   scripts/bench-claims-rules.sh [CLIENT_COUNTS...]    (default: 1 64)
#
# environment:
#   ROUNDS            pairs of runs (default 3)
#   SECONDS_PER_RUN   seconds of each loadgen run (default 8)
#   ONCEKV_PORT_BASE  the clusters' ports (default 9500)
#   ONCEKV_BIN, LOADGEN  prebuilt binaries (default: build target/release
#                     with the fault-injection feature, and loadgen)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
export ONCEKV_PORT_BASE=${ONCEKV_PORT_BASE:-9500}
CLIENT_COUNTS=("$@")
((${#CLIENT_COUNTS[@]} > 0)) || CLIENT_COUNTS=(1 64)
if [[ -z ${ONCEKV_BIN:-} || -z ${LOADGEN:-} ]]; then
    echo "building release binaries (oncekv with fault-injection, loadgen)" >&2
    cargo build --release --quiet --features fault-injection -p oncekv -p loadgen
fi
export ONCEKV_BIN=${ONCEKV_BIN:-$PWD/target/release/oncekv}
LOADGEN=${LOADGEN:-$PWD/target/release/loadgen}
endpoints=$(for n in 1 2 3; do printf '127.0.0.1:%s,' $((ONCEKV_PORT_BASE + n)); done)
endpoints=${endpoints%,}

ONCEKV_DATA=
cleanup() {
    if [[ -n $ONCEKV_DATA ]]; then
        scripts/cluster.sh stop >/dev/null 2>&1 || true
        rm -rf "$ONCEKV_DATA"
    fi
}
trap cleanup EXIT

for round in $(seq 1 "$ROUNDS"); do
    for version in 2 3; do
        ONCEKV_DATA=$(mktemp -d -t oncekv-claims-rules.XXXXXX)
        export ONCEKV_DATA
        if ((version == 2)); then
            export ONCEKV_NODE_ARGS="--fault bootstrap-at-rules-2"
        else
            export ONCEKV_NODE_ARGS=""
        fi
        scripts/cluster.sh start >"$ONCEKV_DATA/start.log" 2>&1 \
            || { cat "$ONCEKV_DATA/start.log" >&2; exit 1; }
        leader=$("$LOADGEN" oncekv-leader --endpoints "$endpoints" --wait-s 60)
        for clients in "${CLIENT_COUNTS[@]}"; do
            summary=$("$LOADGEN" oncekv-claim --endpoint "$leader" --clients "$clients" \
                --duration-s "$SECONDS_PER_RUN" --request-timeout-s 10)
            echo "round=$round rules_version=$version $summary"
        done
        cleanup
        ONCEKV_DATA=
    done
done
