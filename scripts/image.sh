#!/usr/bin/env bash
# Builds the node's container image from nothing: FROM scratch, holding the
# release binary (stripped), exactly the shared libraries `ldd` says it needs
# (the dynamic loader included), an /etc/passwd with the unprivileged user
# `oncekv` (uid 10001), and a data directory /data owned by that user. No
# registry is needed: nothing is pulled.
#
#   scripts/image.sh [--features LIST] [--binary PATH] [--tag NAME:TAG] [--print-context]
#
# The binary is the entrypoint (`docker run oncekv:latest node --id 1 ...`);
# the health check runs `oncekv health` (the gRPC health service of the
# client port at $ONCEKV_HEALTH_ENDPOINT, default 127.0.0.1:7101).
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/image.sh [options]

Builds `cargo build --release` and the image oncekv:latest, also tagged
oncekv:<git short hash> (with -dirty when the work tree has changes).

options:
  --features LIST   cargo features (e.g. fault-injection, for tests); the
                    default tags become oncekv:<LIST> and oncekv:<hash>-<LIST>
  --binary PATH     package this already built oncekv binary instead of
                    running cargo (the test suite packages its own build)
  --tag NAME:TAG    tag the image NAME:TAG only (no hash tag)
  --print-context   build the docker context, print its directory, build no
                    image (for inspection; the caller removes it)
  -h, --help        this text
EOF
}

# Uid and gid of the unprivileged user in the image.
readonly USER_ID=10001
readonly ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() {
    echo "image.sh: $*" >&2
    exit 1
}

features=''
binary=''
tag=''
print_context=false
while (($# > 0)); do
    case $1 in
        --features) features=${2:?--features needs a value}; shift 2 ;;
        --binary) binary=${2:?--binary needs a path}; shift 2 ;;
        --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
        --print-context) print_context=true; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done

command -v ldd >/dev/null || die "ldd not found"
if ! $print_context; then
    command -v docker >/dev/null || die "docker not found"
    docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed)"
fi

if [[ -z $binary ]]; then
    cargo_args=(build --release --bin oncekv)
    [[ -n $features ]] && cargo_args+=(--features "$features")
    (cd "$ROOT" && cargo "${cargo_args[@]}") || die "cargo build failed"
    binary=$ROOT/target/release/oncekv
fi
[[ -x $binary ]] || die "$binary is not an executable"

# ---- the build context ------------------------------------------------------

context=$(mktemp -d "${TMPDIR:-/tmp}/oncekv-image.XXXXXX")
$print_context || trap 'rm -rf "$context"' EXIT
rootfs=$context/rootfs
mkdir -p "$rootfs/etc" "$rootfs/tmp" "$context/data"
chmod 1777 "$rootfs/tmp"

# The binary without its debug information (the release profile keeps line
# tables for backtraces on the build machine; the image does not need them).
if command -v strip >/dev/null; then
    strip -o "$rootfs/oncekv" "$binary"
else
    echo "image.sh: strip not found; the image holds the unstripped binary" >&2
    cp "$binary" "$rootfs/oncekv"
fi
chmod 0755 "$rootfs/oncekv"

# Exactly the libraries the dynamic linker resolves for the binary, at the
# paths it resolves them to, plus the loader itself (the program interpreter
# named in the ELF header, e.g. /lib64/ld-linux-x86-64.so.2). Symlinks are
# copied as the files they point to.
libraries=()
while read -r line; do
    case $line in
        *'=> not found'*) die "ldd: $line" ;;
        *'=> /'*) path=${line#*=> }; libraries+=("${path%% (*}") ;;
        /*) libraries+=("${line%% (*}") ;;
        *) ;; # linux-vdso.so.1: provided by the kernel
    esac
done < <(ldd "$binary")
((${#libraries[@]} > 0)) || die "ldd lists no libraries: is $binary static? (then nothing to copy)"
for library in "${libraries[@]}"; do
    mkdir -p "$rootfs$(dirname "$library")"
    cp -L "$library" "$rootfs$library"
done

cat >"$rootfs/etc/passwd" <<EOF
root:x:0:0:root:/nonexistent:/nonexistent
oncekv:x:$USER_ID:$USER_ID:oncekv:/data:/nonexistent
EOF
cat >"$rootfs/etc/group" <<EOF
root:x:0:
oncekv:x:$USER_ID:
EOF
# Host names (node-2, ...) through /etc/hosts, then the DNS server Docker
# writes into /etc/resolv.conf (glibc has both built in since 2.34).
echo 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"

revision=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] && [[ -n $(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    revision=$revision-dirty
fi

cat >"$context/Dockerfile" <<EOF
FROM scratch
COPY rootfs/ /
COPY --chown=$USER_ID:$USER_ID data /data
USER $USER_ID:$USER_ID
WORKDIR /data
ENV ONCEKV_HEALTH_ENDPOINT=127.0.0.1:7101
# Client API (gRPC, health and reflection included), peer API, metrics.
EXPOSE 7101 7201 7301
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=3 CMD ["/oncekv", "health"]
LABEL org.opencontainers.image.title="oncekv" org.opencontainers.image.revision="$revision"
ENTRYPOINT ["/oncekv"]
CMD ["--help"]
EOF

if $print_context; then
    echo "$context"
    exit 0
fi

# ---- the image ------------------------------------------------------------------

tags=()
if [[ -n $tag ]]; then
    tags=("$tag")
elif [[ -n $features ]]; then
    suffix=${features//[^A-Za-z0-9_.-]/_}
    tags=("oncekv:$suffix" "oncekv:$revision-$suffix")
else
    tags=("oncekv:latest" "oncekv:$revision")
fi
tag_args=()
for name in "${tags[@]}"; do
    tag_args+=(--tag "$name")
done

# The classic builder: it needs no buildx plugin and builds FROM scratch alone.
if ! output=$(DOCKER_BUILDKIT=0 docker build "${tag_args[@]}" "$context" 2>&1); then
    echo "$output" >&2
    die "docker build failed"
fi
size=$(docker image inspect --format '{{.Size}}' "${tags[0]}")
echo "built ${tags[*]} ($((size / 1024 / 1024)) MiB; ${#libraries[@]} libraries: ${libraries[*]})"
