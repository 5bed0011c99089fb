# A local 3-node etcd for the benchmarks that compare against it
# (scripts/bench-vs-etcd.sh, scripts/bench-etcd-state.sh). Sourced, not run.
#
# The sourcing script sets ETCD_PORT_BASE (member N listens on base+N for
# clients, base+100+N for peers), WORK (a directory for the members' data
# and logs) and ETCD_SCRIPT (its name, for messages), and defines die().
# start_etcd TOKEN [ETCD FLAG...] starts the members (pids in ETCD_PIDS)
# and waits until etcd is healthy; stop_etcd stops them (SIGTERM, then
# SIGKILL); print_etcd_logs shows the tail of each member's log.

ETCD_PIDS=()
readonly ETCD_WAIT_S=30
readonly ETCD_STOP_WAIT_S=10

etcd_client() { echo "127.0.0.1:$((ETCD_PORT_BASE + $1))"; }
etcd_peer() { echo "127.0.0.1:$((ETCD_PORT_BASE + 100 + $1))"; }
etcd_endpoints() { echo "$(etcd_client 1),$(etcd_client 2),$(etcd_client 3)"; }

# Waits up to $2 seconds for pid $1 to exit; fails if it is still there.
wait_exit() {
    local pid=$1 deadline=$((SECONDS + $2))
    while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

print_etcd_logs() {
    local n
    for n in 1 2 3; do
        echo "----- etcd n$n: last 20 lines -----" >&2
        tail -n 20 "$WORK/etcd-n$n.log" >&2 2>/dev/null || true
    done
}

start_etcd() {
    local token=$1 n cluster=""
    shift
    for n in 1 2 3; do
        cluster+="${cluster:+,}n$n=http://$(etcd_peer "$n")"
    done
    for n in 1 2 3; do
        etcd --name "n$n" --data-dir "$WORK/etcd-n$n" \
            --listen-client-urls "http://$(etcd_client "$n")" \
            --advertise-client-urls "http://$(etcd_client "$n")" \
            --listen-peer-urls "http://$(etcd_peer "$n")" \
            --initial-advertise-peer-urls "http://$(etcd_peer "$n")" \
            --initial-cluster "$cluster" --initial-cluster-state new \
            --initial-cluster-token "$token" \
            --logger zap --log-level error "$@" \
            </dev/null >"$WORK/etcd-n$n.log" 2>&1 &
        ETCD_PIDS+=("$!")
    done
    local deadline=$((SECONDS + ETCD_WAIT_S)) pid
    until ETCDCTL_API=3 etcdctl --endpoints "$(etcd_endpoints)" --command-timeout 2s \
        endpoint health >/dev/null 2>&1; do
        for pid in "${ETCD_PIDS[@]}"; do
            kill -0 "$pid" 2>/dev/null || { print_etcd_logs; die "an etcd member exited (ports taken? ETCD_PORT_BASE=$ETCD_PORT_BASE)"; }
        done
        if ((SECONDS >= deadline)); then
            print_etcd_logs
            die "etcd not healthy within ${ETCD_WAIT_S}s"
        fi
        sleep 0.2
    done
}

stop_etcd() {
    local pid
    for pid in "${ETCD_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${ETCD_PIDS[@]}"; do
        if ! wait_exit "$pid" "$ETCD_STOP_WAIT_S"; then
            kill -KILL "$pid" 2>/dev/null || true
            wait_exit "$pid" 5 || echo "$ETCD_SCRIPT: etcd pid $pid survived SIGKILL" >&2
        fi
    done
}
