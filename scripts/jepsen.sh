#!/usr/bin/env bash
# The jepsen-like harness (jepsen-like/, docs/testing.md, "jepsen-like"):
#
#   scripts/jepsen.sh smoke [--tls]                    one 45 s run, seed 1, 3 leader kills, release build
#   scripts/jepsen.sh ci-smoke [--tls]                 the same run on the debug build (what .ci/run runs)
#   scripts/jepsen.sh long [SEEDS] [DURATION] [--tls]  SEEDS runs (default 20) of DURATION s (default 60), seeds 1..SEEDS
#   scripts/jepsen.sh broken                           the four deliberately broken servers; each must be found invalid
#   scripts/jepsen.sh containers [SECONDS]             a run (default 60 s) against three containers with real kills,
#                                                      pauses and partitions, then the same against the image of the
#                                                      server that skips dedup: valid, then INVALID (needs Docker, root)
#   scripts/jepsen.sh failover [KILLS] [LOAD] [FLAGS]  the failover benchmark (failover-bench): KILLS leader kills
#                                                      (default 20) under LOAD closed-loop writers (default 32) on the
#                                                      release build; more failover-bench flags may follow
#
# --tls (smoke, ci-smoke, long): the cluster runs with TLS on the client and
# peer ports and authentication on the client port (jepsen-like --tls:
# certificates and tokens made with `oncekv certs`); the runs are named
# with a -tls suffix.
#
# Every run writes history.jsonl, results.json and report.html under
# target/jepsen/. Exit status: 0 when every run came out as required
# (smoke and long: valid; broken: invalid), 1 otherwise (failover: 0 when
# every kill was measured and the counter is consistent).
set -euo pipefail
cd "$(dirname "$0")/.."

# --tls anywhere among the arguments: every run of smoke, ci-smoke and long
# against a TLS cluster.
args=()
tls=()
suffix=
for arg in "$@"; do
    if [ "$arg" = --tls ]; then
        tls=(--tls)
        suffix=-tls
    else
        args+=("$arg")
    fi
done
set -- "${args[@]+"${args[@]}"}"

harness=target/release/jepsen-like

build_server() { # [FEATURES] [TARGET_DIR]
    local features=${1:-fault-injection} target_dir=${2:-target}
    cargo build --release --features "$features" --target-dir "$target_dir"
}

build_harness() {
    cargo build --release -p oncekv-jepsen
}

# build_image BINARY NAME: packages BINARY as the image NAME:<hash of the
# binary> (scripts/image.sh) unless it exists; prints the tag.
build_image() {
    local binary=$1 name=$2 tag
    tag=$name:$(sha256sum "$binary" | cut -c1-12)
    if ! docker image inspect "$tag" >/dev/null 2>&1; then
        scripts/image.sh --binary "$binary" --tag "$tag" >&2
    fi
    echo "$tag"
}

# The broken servers build in their own target directory, never over
# target/release; seeded from target/release when there is one, so that
# only the oncekv crate itself compiles.
build_broken() { # FEATURE
    if [ ! -d target/broken/release ] && [ -d target/release ]; then
        mkdir -p target/broken
        cp -a target/release target/broken/
    fi
    build_server "fault-injection,$1" target/broken
    cp target/broken/release/oncekv "target/broken/oncekv-$1"
}

# run NAME EXPECTED_EXIT SERVER_BIN [HARNESS FLAGS...]: one run, its
# figures printed, a line added to the summary.
summary=()
failures=0
run() {
    local name=$1 expected=$2 server=$3
    shift 3
    local out=target/jepsen/$name
    echo "=== $name: $* (server $server)"
    set +e
    "$harness" --server-bin "$server" --out "$out" "$@" | tee "$out.txt"
    local code=${PIPESTATUS[0]}
    set -e
    local verdict
    case $code in
        0) verdict=valid ;;
        1) verdict=INVALID ;;
        *) verdict=unknown ;;
    esac
    local ops reads dups kills faults keyed claims unknowns
    ops=$(grep -m1 '^operations (writes):' "$out.txt" | sed 's/^operations (writes): //' || true)
    reads=$(grep -m1 '^reads:' "$out.txt" | sed 's/^reads: //' || true)
    dups=$(grep -m1 '^leader changes seen:' "$out.txt" | sed 's/^leader changes seen: //' || true)
    kills=$(grep -m1 '^leader kill' "$out.txt" | sed 's/^leader kill -> first acknowledgement: //' || true)
    faults=$(grep -m1 '^faults:' "$out.txt" || true)
    keyed=$(grep -m1 '^keyed:' "$out.txt" | sed -E 's/^keyed: ([0-9]+) keys .*; ([0-9]+) duplicates .*; ([0-9]+) conflicts sent, ([0-9]+) refused KEY_CONFLICT; keyed violations ([0-9]+)$/keyed \1 keys, \2 dups, \4 conflicts refused, \5 violations/' || true)
    claims=$(grep -m1 '^claims:' "$out.txt" | sed -E 's/^claims: ([0-9]+) jobs \(([0-9]+) completed\), [0-9]+ claims: ([0-9]+) won \(([0-9]+) takeovers, ([0-9]+) own wins .*, ([0-9]+) replays, ([0-9]+) unknown;.*; FENCED ([0-9]+); claim violations ([0-9]+)$/claims \2\/\1 jobs, \3 won, \4 takeovers, \8 FENCED, \6 replays, \5 won again, \7 unknown, \9 violations/' || true)
    unknowns=$(grep -m1 '^unknown outcomes:' "$out.txt" | sed -E 's/^unknown outcomes: ([0-9]+) session writes \(([0-9]+) appends applied, ([0-9]+) never applied, .*\) and ([0-9]+) keyed calls \(keys then answered as duplicates ([0-9]+), executed ([0-9]+), unresolved ([0-9]+)\).*$/unknown: \1 writes (\2 applied, \3 fenced), \4 keyed (\5 dup, \6 executed, \7 open)/; s/^unknown outcomes: none.*/unknown: NONE/' || true)
    local status=as-required
    if [ "$code" != "$expected" ]; then
        status=NOT-AS-REQUIRED
        failures=$((failures + 1))
    fi
    summary+=("$(printf '%-34s exit %s %-8s %-16s | %s | reads %s | %s | %s | %s | %s | %s | %s' "$name" "$code" "$verdict" "$status" "$ops" "$reads" "$keyed" "${claims:-no claims}" "${unknowns:-unknown: ?}" "$kills" "$dups" "$faults")")
}

print_summary() {
    echo
    echo "=== summary"
    printf '%s\n' "${summary[@]}"
    if [ "$failures" -gt 0 ]; then
        echo "$failures run(s) did not come out as required"
        exit 1
    fi
    echo "every run came out as required"
}

mkdir -p target/jepsen
case ${1:-} in
    smoke)
        build_server
        build_harness
        run "smoke$suffix" 0 target/release/oncekv --seed 1 --duration 45 --leader-kills 3 --quiet "${tls[@]+"${tls[@]}"}"
        print_summary
        ;;
    ci-smoke)
        # The debug build `cargo test --workspace --features fault-injection`
        # has just made and tested: a release build of the same tree would
        # double the time of CI on two cores. Slower nodes (tens of times
        # fewer operations), the same faults, checks and exit codes.
        # One build of both binaries with the test command's package and
        # feature selection, so that little recompiles. `--tests` too: the
        # test command unifies features with the dev-dependencies (tokio's
        # test-util, say), and a build without them would compile tokio,
        # tonic, openraft and the workspace again (over a minute on 2 cores).
        cargo build --workspace --features fault-injection --bins --tests
        harness=target/debug/jepsen-like
        run "ci-smoke$suffix" 0 target/debug/oncekv --seed 1 --duration 45 --leader-kills 3 --quiet "${tls[@]+"${tls[@]}"}"
        print_summary
        ;;
    long)
        seeds=${2:-20}
        duration=${3:-60}
        build_server
        build_harness
        for seed in $(seq 1 "$seeds"); do
            run "long$suffix-seed-$seed" 0 target/release/oncekv --seed "$seed" --duration "$duration" --quiet "${tls[@]+"${tls[@]}"}"
        done
        print_summary
        ;;
    broken)
        [ -z "$suffix" ] || { echo "jepsen.sh: --tls is for smoke, ci-smoke and long" >&2; exit 2; }
        build_harness
        for feature in broken-skip-dedup broken-snapshot-drops-sessions broken-stale-reads broken-no-fence-check; do
            build_broken "$feature"
            run "$feature" 1 "target/broken/oncekv-$feature" --seed 1 --duration 45 --leader-kills 3 --quiet
        done
        # The stale-reads server breaks reads only: its run must be found
        # invalid by the read checks, not by anything else.
        read_violations=$(grep -m1 -o 'read violations [0-9]*' target/jepsen/broken-stale-reads.txt | grep -o '[0-9]*$' || echo 0)
        if [ "${read_violations:-0}" -eq 0 ]; then
            summary+=("broken-stale-reads                 NOT-AS-REQUIRED: no read violation reported")
            failures=$((failures + 1))
        fi
        # The server that skips dedup skips it for idempotency keys too:
        # the keyed checks must find duplicates of their own.
        keyed_duplicated=$(grep -m1 -o 'keyed duplicated [0-9]*' target/jepsen/broken-skip-dedup.txt | grep -o '[0-9]*$' || echo 0)
        if [ "${keyed_duplicated:-0}" -eq 0 ]; then
            summary+=("broken-skip-dedup                  NOT-AS-REQUIRED: no keyed duplicate reported")
            failures=$((failures + 1))
        fi
        # The server without the fence check breaks claims only: the
        # claims checks must find a stale holder's complete acknowledged.
        not_enforced=$(grep -m1 -o 'claim fences not enforced [0-9]*' target/jepsen/broken-no-fence-check.txt | grep -o '[0-9]*$' || echo 0)
        if [ "${not_enforced:-0}" -eq 0 ]; then
            summary+=("broken-no-fence-check              NOT-AS-REQUIRED: no stale complete acknowledged reported")
            failures=$((failures + 1))
        fi
        print_summary
        ;;
    containers)
        [ -z "$suffix" ] || { echo "jepsen.sh: --tls is for smoke, ci-smoke and long" >&2; exit 2; }
        # The same harness and checker; the nodes are containers of an image
        # of the release build (scripts/image.sh, FROM scratch) on a private
        # network, killed with `docker kill`, paused with `docker pause`,
        # partitioned by iptables rules in their network namespaces.
        duration=${2:-60}
        kills=$((duration / 12 > 0 ? duration / 12 : 1))
        command -v docker >/dev/null || { echo "jepsen.sh: docker not found" >&2; exit 2; }
        docker info >/dev/null 2>&1 || { echo "jepsen.sh: no Docker engine answers" >&2; exit 2; }
        build_server
        build_harness
        image=$(build_image target/release/oncekv oncekv-jepsen)
        run containers 0 target/release/oncekv --containers --image "$image" \
            --seed 1 --duration "$duration" --leader-kills "$kills" --quiet
        # The server that skips dedup, as an image with a tag of its own.
        build_broken broken-skip-dedup
        broken_image=$(build_image target/broken/oncekv-broken-skip-dedup oncekv-jepsen-broken-skip-dedup)
        run containers-broken-skip-dedup 1 target/broken/oncekv-broken-skip-dedup --containers \
            --image "$broken_image" --seed 1 --duration "$duration" --leader-kills "$kills" --quiet
        print_summary
        ;;
    failover)
        [ -z "$suffix" ] || { echo "jepsen.sh: --tls is for smoke, ci-smoke and long" >&2; exit 2; }
        kills=${2:-20}
        load=${3:-32}
        shift $(($# < 3 ? $# : 3))
        cargo build --release --bin oncekv
        cargo build --release -p oncekv-jepsen --bin failover-bench
        target/release/failover-bench --server-bin target/release/oncekv \
            --kills "$kills" --load-clients "$load" "$@"
        ;;
    *)
        sed -n '2,23p' "$0"
        exit 2
        ;;
esac
