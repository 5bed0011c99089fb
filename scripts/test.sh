#!/usr/bin/env bash
# The whole test suite — what the README's quick start and .ci/run run:
# the workspace's tests (with the fault-injection hooks and the unreleased
# rules versions), the Python
# client's (clients/python/run-tests.sh: a venv under target/, pip install
# from PyPI, pytest and the consumer example against the debug binary just
# built), then the jepsen-like smoke run on that debug build (one 45 s run
# with 3 leader kills; it must come out valid). The long run and the
# broken builds stay out of it: scripts/jepsen.sh long | broken.
set -euo pipefail
cd "$(dirname "$0")/.."

# With the unreleased rules versions known (rules version 3, finished claims
# in the record store: docs/state-beyond-ram.md 4.12), so that their tests
# (crates/oncekv-core/tests/finished_claims.rs, tests/claims_store.rs) run
# in the same build; a cluster still starts at the latest released version,
# and no served build turns the feature on.
cargo test --workspace --features fault-injection,unreleased-rules
ONCEKV_BIN=target/debug/oncekv clients/python/run-tests.sh
scripts/jepsen.sh ci-smoke
