#!/usr/bin/env bash
# The whole test suite — what the README's quick start and .ci/run run:
# the workspace's tests (with the fault-injection hooks), then the
# jepsen-like smoke run on the debug build just tested (one 45 s run with
# 3 leader kills; it must come out valid). The long run and the broken
# builds stay out of it: scripts/jepsen.sh long | broken.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --features fault-injection
scripts/jepsen.sh ci-smoke
