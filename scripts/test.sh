#!/usr/bin/env bash
# The whole test suite — what the README's quick start and .ci/run run:
# the workspace's tests (with the fault-injection hooks), the Python
# client's (clients/python/run-tests.sh: a venv under target/, pip install
# from PyPI, pytest and the consumer example against the debug binary just
# built), then the jepsen-like smoke run on that debug build (one 45 s run
# with 3 leader kills; it must come out valid). The long run and the
# broken builds stay out of it: scripts/jepsen.sh long | broken.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --features fault-injection
ONCEKV_BIN=target/debug/oncekv clients/python/run-tests.sh
scripts/jepsen.sh ci-smoke
