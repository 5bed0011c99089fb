#!/usr/bin/env bash
# A local 3-node oncekv cluster on 127.0.0.1, for trying things by hand.
#
#   scripts/cluster.sh start [--tls] | stop | status | kill-leader | restart N | join N | remove N
#
# Node N serves clients on 127.0.0.1:$((ONCEKV_PORT_BASE + N)), Raft peers
# on 127.0.0.1:$((ONCEKV_PORT_BASE + 100 + N)), Prometheus metrics on
# http://127.0.0.1:$((ONCEKV_PORT_BASE + 200 + N))/metrics and the HTTP/JSON API
# (docs/http.md) on http://127.0.0.1:$((ONCEKV_PORT_BASE + 300 + N))/v1/kv/ (both
# https with --tls). Everything a node owns lives in
# $ONCEKV_DATA/nN: its Raft data dir (db/), its log (node.log) and, while it
# runs, its pid file (pid). Stopping keeps the data: a later start resumes the
# same cluster. The cluster's nodes are 1-3 at first; `join` adds one (a new
# nN directory) and `remove` takes one out (its directory is renamed to
# removed-nN-<time>, so later starts leave it alone).
#
# `start --tls` makes a local CA, node certificates, an `admin` and a
# `client` identity with tokens under $ONCEKV_DATA/pki (`oncekv certs`, no
# openssl), and runs the nodes with TLS on both ports and authentication on
# the client port. Once $ONCEKV_DATA/pki exists every command of this script
# uses it (remove the directory to go back to plain loopback).
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/cluster.sh COMMAND

commands:
  start        build (release) and start the three nodes, wait for a leader
  start --tls  the same with TLS and authentication (certificates, tokens
               under $ONCEKV_DATA/pki); prints the environment for the CLI
  stop         stop every node (SIGTERM, then SIGKILL after a grace period)
  status       show every node's view of the cluster
  kill-leader  SIGKILL the current leader
  restart N    SIGKILL node N if it runs, then start it again
  join N       start a fresh node N (1-99, a new id), add it as a learner
               (it catches up), then promote it to voter (`oncekv admin`)
  remove N     remove node N from the membership, stop it, and set its
               data directory aside

environment:
  ONCEKV_DATA        where the nodes keep their data and logs
                     (default ./data, relative to the current directory)
  ONCEKV_PORT_BASE   node N listens on base+N (clients), base+100+N (peers),
                     base+200+N (metrics) and base+300+N (HTTP API)
                     (default 7100)
  RUST_LOG           node log filter (default info)
  ONCEKV_WORKER_THREADS  async runtime threads per node (default: cores / 3, at least 1)
  ONCEKV_NODE_ARGS   more `oncekv node` flags for every node, space-separated
                     (e.g. "--heartbeat-ms 30 --election-timeout-min-ms 120")
  ONCEKV_BIN         the oncekv binary to run (default target/release/oncekv,
                     which `start` builds first); when set, nothing is built
  ONCEKV_SCHED_GROUP "own" (default): each node in a session of its own
                     (setsid), detached from the terminal; Linux's autogroup
                     then shares the CPU equally between the nodes, whatever
                     priority a thread has inside one of them. "shared": the
                     nodes stay in this script's session (and survive it: a
                     node ignores the hangup), so the scheduler weighs their
                     threads against each other and a node's background and
                     catch-up threads yield to the other nodes' requests, as
                     on hosts of their own (docs/operating.md)
EOF
}

readonly NODES=(1 2 3)
case ${ONCEKV_SCHED_GROUP:=own} in
    own) readonly DETACH=(setsid) ;;
    shared) readonly DETACH=() ;;
    *) echo "cluster.sh: ONCEKV_SCHED_GROUP is \"own\" or \"shared\"" >&2; exit 2 ;;
esac
readonly START_TIMEOUT_S=30
readonly STOP_TIMEOUT_S=10

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT
DATA=${ONCEKV_DATA:-./data}
case $DATA in
    /*) ;;
    *) DATA=$PWD/${DATA#./} ;;
esac
readonly DATA
readonly BASE=${ONCEKV_PORT_BASE:-7100}
if [[ -n ${ONCEKV_BIN:-} ]]; then
    BIN=$ONCEKV_BIN
    [[ $BIN == /* ]] || BIN=$PWD/$BIN
else
    BIN=$ROOT/target/release/oncekv
fi
readonly BIN

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

# ---- addresses and files ---------------------------------------------------

client_addr() { echo "127.0.0.1:$((BASE + $1))"; }
peer_addr() { echo "127.0.0.1:$((BASE + 100 + $1))"; }
metrics_addr() { echo "127.0.0.1:$((BASE + 200 + $1))"; }
# The metrics URL: HTTPS with the node's certificate when secure.
metrics_url() {
    local scheme=http
    secure && scheme=https
    echo "$scheme://$(metrics_addr "$1")/metrics"
}
http_addr() { echo "127.0.0.1:$((BASE + 300 + $1))"; }
# The HTTP API's base URL: HTTPS with the node's certificate when secure.
http_url() {
    local scheme=http
    secure && scheme=https
    echo "$scheme://$(http_addr "$1")/v1/kv/"
}
node_dir() { echo "$DATA/n$1"; }
# Each of the three nodes on this machine gets its share of the cores as
# async runtime threads (at least one), not one thread per core each.
worker_threads() {
    local cores
    if [[ -n ${ONCEKV_WORKER_THREADS:-} ]]; then
        echo "$ONCEKV_WORKER_THREADS"
        return
    fi
    cores=$(nproc 2>/dev/null || echo 1)
    echo $((cores / 3 > 0 ? cores / 3 : 1))
}
pid_file() { echo "$(node_dir "$1")/pid"; }
pki_dir() { echo "$DATA/pki"; }
# Whether the cluster runs with TLS and authentication.
secure() { [[ -f $(pki_dir)/ca.pem ]]; }

# The certificates of nodes $@ (and, the first time, the CA and the admin and
# client identities) under pki/.
make_certs() {
    local args=() n
    for n in "$@"; do
        [[ -f $(pki_dir)/node-$n.pem ]] || args+=(--node "$n")
    done
    if [[ ! -f $(pki_dir)/admin.pem ]]; then
        args+=(--admin admin --client client)
    fi
    ((${#args[@]} == 0)) || "$BIN" certs --dir "$(pki_dir)" "${args[@]}" >/dev/null \
        || die "oncekv certs failed"
}

# The environment the CLI (and this script) needs: the CA, and the admin's
# token (this script runs admin commands).
export_credentials() {
    if secure; then
        export ONCEKV_CA ONCEKV_TOKEN
        ONCEKV_CA=$(pki_dir)/ca.pem
        ONCEKV_TOKEN=$(<"$(pki_dir)/admin.token")
    fi
}

# node N's TLS flags, when secure.
tls_flags() {
    local pki
    pki=$(pki_dir)
    if secure; then
        echo "--tls-cert $pki/node-$1.pem --tls-key $pki/node-$1-key.pem --tls-ca $pki/ca.pem --token-file $pki/tokens"
    fi
}
log_file() { echo "$(node_dir "$1")/node.log"; }

# The cluster's node ids, one per line in order: every node with a data
# directory (joined nodes included, removed ones not); 1-3 before the first
# start.
members() {
    local dir n list=()
    for dir in "$DATA"/n*; do
        n=${dir##*/n}
        [[ -d $dir && $n =~ ^[1-9][0-9]*$ ]] && list+=("$n")
    done
    ((${#list[@]} > 0)) || list=("${NODES[@]}")
    printf '%s\n' "${list[@]}" | sort -n
}

# Fails unless $1 is a node id whose ports fit under the port base.
check_id() {
    [[ ${1:-} =~ ^[1-9][0-9]?$ ]] || { usage >&2; exit 2; }
    ((BASE + 300 + $1 <= 65535)) || die "node $1's HTTP port would exceed 65535"
}

# Fails unless node $1 is one of the cluster's nodes.
check_member() {
    check_id "$1"
    [[ -d $(node_dir "$1") ]] || die "node $1 is not a node of this cluster (no $(node_dir "$1"))"
}

# The client endpoints of all nodes, comma-separated.
endpoints() {
    local n list=()
    for n in $(members); do
        list+=("$(client_addr "$n")")
    done
    (IFS=,; echo "${list[*]}")
}

# ---- processes ---------------------------------------------------------------

# Whether pid $2 is node $1's `oncekv node` process: its command line names
# the node's id and data directory (a pid reused by another process, or
# another cluster's node, does not match). Only ever asked of a pid recorded
# after its exec (see start_node), never of the shell that is about to exec.
is_node() {
    local n=$1 pid=$2 args
    args=$(ps -ww -o args= -p "$pid" 2>/dev/null) || return 1
    [[ $args == *" node --id $n "*"--data-dir $(node_dir "$n")/db "* ]]
}

# Prints node N's pid if its pid file names its live `oncekv node` process;
# fails otherwise (a stale pid file is removed).
running_pid() {
    local file pid
    file=$(pid_file "$1")
    [[ -f $file ]] || return 1
    pid=$(<"$file")
    if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && is_node "$1" "$pid"; then
        echo "$pid"
    else
        rm -f "$file"
        return 1
    fi
}

# Waits until background child $2 (started for node $1) has exec'd the node
# binary: until then its command line is this script's own (the forked
# shell sets up redirections, then execs setsid, which execs the node), and
# a pid recorded before would look like a dead node to running_pid. Fails
# if the child exits first or has not exec'd within START_TIMEOUT_S.
wait_exec() {
    local n=$1 pid=$2 deadline=$((SECONDS + START_TIMEOUT_S)) line stat args
    while true; do
        line=$(ps -ww -o stat=,args= -p "$pid" 2>/dev/null) || return 1
        read -r stat args <<<"$line"
        [[ $stat == Z* ]] && return 1 # exited, not reaped yet
        [[ $args == "$BIN node --id $n "* ]] && return 0
        ((SECONDS < deadline)) || return 1
        sleep 0.02
    done
}

# Starts node N in the background, in its own session (setsid, unless
# ONCEKV_SCHED_GROUP=shared) so it outlives this script and the terminal;
# setsid execs in place, so $! becomes the node's pid, and the pid file is
# written once it has (wait_exec). In this script's session a node outlives
# it too: it ignores the interrupt (an asynchronous command of a script)
# and reloads its certificates on a hangup. With a second
# argument `join`, never with --initialize (it waits to be added as a
# learner).
start_node() {
    local n=$1 mode=${2:-} dir peers=() m
    dir=$(node_dir "$n")
    mkdir -p "$dir/db"
    for m in $(members); do
        peers+=(--peer "$m=$(peer_addr "$m")/$(client_addr "$m")")
    done
    local init=()
    if [[ $n == 1 && $mode != join ]]; then
        # Ignored by the node once its data dir holds Raft state.
        init=(--initialize)
    fi
    local extra=() tls=()
    read -r -a extra <<<"${ONCEKV_NODE_ARGS:-}"
    if secure; then
        make_certs "$n"
        read -r -a tls <<<"$(tls_flags "$n")"
    fi
    RUST_LOG=${RUST_LOG:-info} "${DETACH[@]}" "$BIN" node \
        --id "$n" \
        --client-addr "$(client_addr "$n")" \
        --peer-addr "$(peer_addr "$n")" \
        --metrics-addr "$(metrics_addr "$n")" \
        --http-addr "$(http_addr "$n")" \
        --data-dir "$dir/db" \
        --worker-threads "$(worker_threads)" \
        "${extra[@]}" "${tls[@]}" \
        "${peers[@]}" "${init[@]}" \
        </dev/null >>"$(log_file "$n")" 2>&1 &
    local pid=$!
    if ! wait_exec "$n" "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        print_log_tails
        die "node $n (pid $pid) exited or did not start within ${START_TIMEOUT_S}s"
    fi
    echo "$pid" >"$(pid_file "$n")"
    echo "node $n started (pid $pid, client $(client_addr "$n"), metrics $(metrics_url "$n"), log $(log_file "$n"))"
}

# Waits up to $2 seconds for pid $1 to exit; fails if it is still there.
wait_exit() {
    local pid=$1 deadline=$((SECONDS + $2))
    while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

# SIGKILLs node N if it runs.
kill_node() {
    local pid
    if pid=$(running_pid "$1"); then
        kill -KILL "$pid"
        wait_exit "$pid" 5 || die "node $1 (pid $pid) survived SIGKILL"
        rm -f "$(pid_file "$1")"
        echo "node $1 killed (pid $pid)"
    fi
}

# ---- status --------------------------------------------------------------------

# `oncekv status` for all nodes; extra args are passed on.
run_status() {
    [[ -x $BIN ]] || die "$BIN not built; run: scripts/cluster.sh start"
    "$BIN" status --endpoints "$(endpoints)" "$@"
}

# Prints the id of the node that reports role leader (the highest term if
# several do, e.g. a deposed leader that has not heard yet); fails if none.
# Reads `status --json` (one compact object per line) with bash alone; the
# first "node_id" of a line is the node's own: the members list comes last.
leader_id() {
    local lines line leader='' best_term=-1
    lines=$(run_status --json 2>/dev/null) || return 1
    while IFS= read -r line; do
        [[ $line =~ \"role\":\"leader\" ]] || continue
        [[ $line =~ \"term\":([0-9]+) ]] || continue
        local term=${BASH_REMATCH[1]}
        [[ $line =~ \"node_id\":([0-9]+) ]] || continue
        if ((term > best_term)); then
            best_term=$term
            leader=${BASH_REMATCH[1]}
        fi
    done <<<"$lines"
    [[ -n $leader ]] && echo "$leader"
}

# Waits until node N answers Status; fails if it exits or stays silent.
wait_answers() {
    local n=$1 deadline=$((SECONDS + START_TIMEOUT_S))
    until "$BIN" status --endpoints "$(client_addr "$n")" >/dev/null 2>&1; do
        running_pid "$n" >/dev/null || { print_log_tails; die "node $n exited"; }
        ((SECONDS < deadline)) || { print_log_tails; die "node $n silent for ${START_TIMEOUT_S}s"; }
        sleep 0.2
    done
}

# Fails, showing the logs, if some node is not running.
check_all_running() {
    local n
    for n in $(members); do
        if ! running_pid "$n" >/dev/null; then
            print_log_tails
            die "node $n is not running"
        fi
    done
}

print_log_tails() {
    local n
    for n in $(members); do
        echo "----- node $n: last 30 lines of $(log_file "$n") -----" >&2
        tail -n 30 "$(log_file "$n")" >&2 2>/dev/null || echo "(no log)" >&2
    done
}

# ---- commands ------------------------------------------------------------------

cmd_start() {
    local tls=${1:-}
    [[ -z $tls || $tls == --tls ]] || { usage >&2; exit 2; }
    if [[ -z ${ONCEKV_BIN:-} ]]; then
        (cd "$ROOT" && cargo build --release --quiet) || die "build failed"
    fi
    [[ -x $BIN ]] || die "$BIN is not an executable"
    local n pid leader nodes
    if [[ $tls == --tls ]]; then
        mkdir -p "$DATA"
        # shellcheck disable=SC2046 # one id per word
        make_certs $(members)
        export_credentials
    fi
    # Every node's directory first: a node's --peer list is the directories.
    nodes=$(members)
    for n in $nodes; do
        mkdir -p "$(node_dir "$n")"
    done
    for n in $nodes; do
        if pid=$(running_pid "$n"); then
            echo "node $n already running (pid $pid)"
        else
            start_node "$n"
        fi
    done
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until leader=$(leader_id); do
        check_all_running
        if ((SECONDS >= deadline)); then
            print_log_tails
            die "no leader within ${START_TIMEOUT_S}s"
        fi
        sleep 0.2
    done
    # Two nodes elect a leader; make sure the third did not die meanwhile.
    check_all_running
    echo "client endpoints: $(endpoints)"
    print_metrics_urls
    print_http_urls
    print_http_example
    echo "leader: node $leader ($(client_addr "$leader"))"
    if secure; then
        local pki
        pki=$(pki_dir)
        echo "TLS and authentication are on. For the CLI and the client library:"
        echo "  export ONCEKV_CA=$pki/ca.pem"
        echo "  export ONCEKV_TOKEN=\$(cat $pki/client.token)   # role client"
        echo "for operator commands (oncekv admin), the admin identity:"
        echo "  export ONCEKV_TOKEN=\$(cat $pki/admin.token)    # role admin"
        echo "  (or ONCEKV_CERT=$pki/admin.pem ONCEKV_KEY=$pki/admin-key.pem)"
        echo "for the HTTP API (docs/http.md), a bearer token and the CA:"
        echo "  curl --cacert $pki/ca.pem -H \"Authorization: Bearer \$(cat $pki/client.token)\" $(http_url 1)KEY"
    fi
}

print_metrics_urls() {
    local n
    for n in $(members); do
        echo "node $n metrics: $(metrics_url "$n")"
    done
    if secure; then
        echo "  (HTTPS: curl --cacert $(pki_dir)/ca.pem $(metrics_url 1))"
    fi
}

print_http_urls() {
    local n
    for n in $(members); do
        echo "node $n HTTP API: $(http_url "$n")"
    done
}

# An exactly-once write over HTTP (docs/http.md): sent twice, the second is a
# replay of the first answer (Idempotent-Replayed: true).
print_http_example() {
    local tls=""
    secure && tls="--cacert $(pki_dir)/ca.pem -H \"Authorization: Bearer \$(cat $(pki_dir)/client.token)\" "
    echo "an exactly-once increment over HTTP (repeat it: same answer, Idempotent-Replayed: true):"
    echo "  curl -i ${tls}-X POST $(http_url 1)visits/incr -H 'Idempotency-Key: \"order-17\"' -d '{\"delta\": 1}'"
}

cmd_stop() {
    local n pid pids=()
    for n in $(members); do
        if pid=$(running_pid "$n"); then
            kill -TERM "$pid"
            pids+=("$n:$pid")
        fi
    done
    local entry
    for entry in "${pids[@]}"; do
        n=${entry%%:*}
        pid=${entry#*:}
        if wait_exit "$pid" "$STOP_TIMEOUT_S"; then
            echo "node $n stopped"
        else
            kill -KILL "$pid" 2>/dev/null || true
            wait_exit "$pid" 5 || die "node $n (pid $pid) survived SIGKILL"
            echo "node $n did not stop within ${STOP_TIMEOUT_S}s: killed"
        fi
        rm -f "$(pid_file "$n")"
    done
    ((${#pids[@]} > 0)) || echo "no node running"
}

cmd_status() {
    local rc=0
    run_status || rc=$?
    print_metrics_urls
    print_http_urls
    return "$rc"
}

cmd_kill_leader() {
    local leader pid
    leader=$(leader_id) || die "no leader known"
    pid=$(running_pid "$leader") || die "leader is node $leader, but it is not ours (no live pid file)"
    kill -KILL "$pid"
    wait_exit "$pid" 5 || die "node $leader (pid $pid) survived SIGKILL"
    rm -f "$(pid_file "$leader")"
    echo "killed leader node $leader (pid $pid)"
}

cmd_restart() {
    local n=${1:-}
    check_member "$n"
    [[ -x $BIN ]] || die "$BIN not built; run: scripts/cluster.sh start"
    kill_node "$n"
    start_node "$n"
    wait_answers "$n"
    run_status
}

cmd_join() {
    local n=${1:-}
    check_id "$n"
    [[ -x $BIN ]] || die "$BIN not built; run: scripts/cluster.sh start"
    [[ -d $(node_dir "$n") ]] && die "node $n exists already ($(node_dir "$n")); pick a new id"
    local others
    others=$(endpoints)
    start_node "$n" join
    wait_answers "$n"
    "$BIN" admin add-learner "$n" "$(peer_addr "$n")" "$(client_addr "$n")" \
        --endpoints "$others" || die "node $n was not added, or has not caught up yet (it still runs; wait: $BIN admin add-learner $n ... again; give up: scripts/cluster.sh remove $n)"
    "$BIN" admin promote "$n" --endpoints "$others" \
        || die "node $n is a learner but was not promoted (retry: $BIN admin promote $n)"
    run_status
}

cmd_remove() {
    local n=${1:-} pid
    check_member "$n"
    [[ -x $BIN ]] || die "$BIN not built; run: scripts/cluster.sh start"
    "$BIN" admin remove "$n" --endpoints "$(endpoints)" || die "node $n was not removed"
    if pid=$(running_pid "$n"); then
        kill -TERM "$pid"
        if ! wait_exit "$pid" "$STOP_TIMEOUT_S"; then
            kill -KILL "$pid" 2>/dev/null || true
            wait_exit "$pid" 5 || die "node $n (pid $pid) survived SIGKILL"
        fi
        rm -f "$(pid_file "$n")"
        echo "node $n stopped"
    fi
    local aside
    aside="$DATA/removed-n$n-$(date +%Y%m%dT%H%M%S)"
    mv "$(node_dir "$n")" "$aside"
    echo "node $n's data set aside in $aside"
}

main() {
    if ! [[ $BASE =~ ^[1-9][0-9]*$ ]] || ((BASE + 303 > 65535)); then
        die "ONCEKV_PORT_BASE=$BASE: want a number without leading zeros, at most 65232"
    fi
    export_credentials
    case ${1:-} in
        start) shift; cmd_start "$@" ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        kill-leader) cmd_kill_leader ;;
        restart) shift; cmd_restart "$@" ;;
        join) shift; cmd_join "$@" ;;
        remove) shift; cmd_remove "$@" ;;
        -h | --help | help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"
