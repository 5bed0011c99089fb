#!/usr/bin/env bash
# A 3-node oncekv cluster in containers (deploy/compose.yaml): one node per
# container on a private network, host names node-1..3, data on named
# volumes. The sibling of scripts/cluster.sh, which runs the nodes as local
# processes.
#
#   scripts/containers.sh start | stop | destroy | status | endpoints
#
# Node N's client port is published on the host as 127.0.0.1:$ONCEKV_CLIENT_PORT_N
# (default 710N) and its metrics as 127.0.0.1:$ONCEKV_METRICS_PORT_N/metrics
# (default 730N). Unless ONCEKV_ADVERTISE_CLIENT_HOST says otherwise, nodes
# announce those host addresses (127.0.0.1:710N) as their client addresses,
# so the NOT_LEADER hints a client on the host gets lead somewhere it can
# connect; see deploy/compose.yaml for the other choice (node-N:710N).
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/containers.sh COMMAND

commands:
  start      build the image if missing (scripts/image.sh), start the three
             containers, wait for a leader, print the endpoints
  stop       stop and remove the containers; the data volumes stay, and a
             later start resumes the same cluster
  destroy    stop, and delete the network and the data volumes
  status     the containers' state and health, and every node's view of the
             cluster
  endpoints  the client endpoints, comma-separated (for --endpoints)

environment:
  ONCEKV_PROJECT                compose project name (default oncekv): the
                                prefix of the containers, network and volumes
  ONCEKV_IMAGE                  image (default oncekv:latest)
  ONCEKV_ADVERTISE_CLIENT_HOST  host part of the client addresses the nodes
                                announce (default here 127.0.0.1; fixed in
                                the membership when the cluster is first
                                initialised)
  ONCEKV_CLIENT_PORT_1..3, ONCEKV_METRICS_PORT_1..3, ONCEKV_NODE_ARGS,
  ONCEKV_RESTART, RUST_LOG      see deploy/compose.yaml
EOF
}

readonly START_TIMEOUT_S=60
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT
readonly COMPOSE_FILE=$ROOT/deploy/compose.yaml
readonly PROJECT=${ONCEKV_PROJECT:-oncekv}
export ONCEKV_IMAGE=${ONCEKV_IMAGE:-oncekv:latest}
export ONCEKV_ADVERTISE_CLIENT_HOST=${ONCEKV_ADVERTISE_CLIENT_HOST:-127.0.0.1}

die() {
    echo "containers.sh: $*" >&2
    exit 1
}

compose() {
    docker-compose --file "$COMPOSE_FILE" --project-name "$PROJECT" "$@"
}

client_port() {
    local var=ONCEKV_CLIENT_PORT_$1
    echo "${!var:-$((7100 + $1))}"
}
metrics_port() {
    local var=ONCEKV_METRICS_PORT_$1
    echo "${!var:-$((7300 + $1))}"
}

# The client endpoints as the host reaches them.
endpoints() {
    echo "127.0.0.1:$(client_port 1),127.0.0.1:$(client_port 2),127.0.0.1:$(client_port 3)"
}

# The client endpoints as the containers reach them.
inner_endpoints() {
    echo "node-1:$(client_port 1),node-2:$(client_port 2),node-3:$(client_port 3)"
}

# `oncekv status` run inside a running node's container (so the host needs
# no binary): the first of node-1..3 that runs answers.
inner_status() {
    local n
    for n in 1 2 3; do
        if [[ -n $(compose ps --quiet --filter status=running "node-$n" 2>/dev/null) ]]; then
            compose exec -T "node-$n" /oncekv status --endpoints "$(inner_endpoints)" "$@"
            return
        fi
    done
    echo "no node container runs" >&2
    return 1
}

# The id of the node that reports role leader (the highest term if several
# do); fails if none. Reads `status --json`, one compact object per line
# whose first "node_id" is the node's own.
leader_id() {
    local lines line leader='' best_term=-1 term
    lines=$(inner_status --json 2>/dev/null) || return 1
    while IFS= read -r line; do
        [[ $line =~ \"role\":\"leader\" ]] || continue
        [[ $line =~ \"term\":([0-9]+) ]] || continue
        term=${BASH_REMATCH[1]}
        [[ $line =~ \"node_id\":([0-9]+) ]] || continue
        if ((term > best_term)); then
            best_term=$term
            leader=${BASH_REMATCH[1]}
        fi
    done <<<"$lines"
    [[ -n $leader ]] && echo "$leader"
}

check_docker() {
    command -v docker >/dev/null || die "docker not found"
    command -v docker-compose >/dev/null || die "docker-compose not found"
    docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed)"
}

cmd_start() {
    check_docker
    if ! docker image inspect "$ONCEKV_IMAGE" >/dev/null 2>&1; then
        [[ $ONCEKV_IMAGE == oncekv:latest ]] \
            || die "image $ONCEKV_IMAGE not found (scripts/image.sh builds oncekv:latest)"
        echo "image $ONCEKV_IMAGE not found: building it"
        "$ROOT/scripts/image.sh"
    fi
    compose up --detach
    local leader deadline=$((SECONDS + START_TIMEOUT_S))
    until leader=$(leader_id); do
        if ((SECONDS >= deadline)); then
            compose ps >&2
            compose logs --tail 30 >&2
            die "no leader within ${START_TIMEOUT_S}s"
        fi
        sleep 0.5
    done
    echo "client endpoints: $(endpoints)"
    echo "  e.g. target/release/oncekv incr c --endpoints $(endpoints)"
    echo "  in the network: $(inner_endpoints)"
    local n
    for n in 1 2 3; do
        echo "node $n metrics: http://127.0.0.1:$(metrics_port "$n")/metrics"
    done
    echo "leader: node $leader (127.0.0.1:$(client_port "$leader"))"
}

cmd_status() {
    check_docker
    compose ps
    inner_status
}

main() {
    case ${1:-} in
        start) cmd_start ;;
        stop) check_docker; compose down ;;
        destroy) check_docker; compose down --volumes ;;
        status) cmd_status ;;
        endpoints) endpoints ;;
        -h | --help | help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"
