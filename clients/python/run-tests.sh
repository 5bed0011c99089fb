#!/usr/bin/env bash
# The Python client's checks, as CI runs them: a virtual environment
# (target/python-venv, or $ONCEKV_PY_VENV), `pip install ./clients/python
# pytest grpcio-tools` into it, the pytest suite (real 3-node clusters of
# the oncekv binary) and the SQS-style consumer example. Exit status 0 iff
# all pass.
#
# The binary: $ONCEKV_BIN, else target/debug/oncekv (what `cargo test`
# builds), else target/release/oncekv. Python: $PYTHON (default python3,
# 3.9 or later, with the venv module). ONCEKV_PY_FRESH=1 recreates the
# venv. PYTEST_ARGS adds pytest arguments.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python3}
VENV=${ONCEKV_PY_VENV:-$ROOT/target/python-venv}

die() {
    echo "clients/python/run-tests.sh: $*" >&2
    exit 1
}

if [[ -z ${ONCEKV_BIN:-} ]]; then
    for candidate in "$ROOT/target/debug/oncekv" "$ROOT/target/release/oncekv"; do
        if [[ -x $candidate ]]; then
            ONCEKV_BIN=$candidate
            break
        fi
    done
fi
[[ -n ${ONCEKV_BIN:-} ]] || die "no oncekv binary: set ONCEKV_BIN or build it (cargo build --bin oncekv)"
[[ $ONCEKV_BIN == /* ]] || ONCEKV_BIN=$PWD/$ONCEKV_BIN
[[ -x $ONCEKV_BIN ]] || die "ONCEKV_BIN=$ONCEKV_BIN is not an executable"
export ONCEKV_BIN
echo "oncekv binary: $ONCEKV_BIN"

started=$SECONDS
if [[ ${ONCEKV_PY_FRESH:-0} == 1 || ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV" ||
        die "cannot create a virtual environment with $PYTHON -m venv (Debian and Ubuntu: apt-get install python3-venv)"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)
# An earlier install has the same version number: remove it, so that pip
# installs this tree's code rather than keeping it.
"${PIP[@]}" uninstall --yes oncekv 2>/dev/null || true
# setuptools builds in the source tree: a stale build/ could carry removed files.
rm -rf "$HERE/build"
"${PIP[@]}" install "$HERE" pytest "grpcio-tools>=1.85.1" || die "pip install failed"
echo "venv ready in $((SECONDS - started)) s: $VENV"

# Run from the tests' own directory so that `import oncekv` is the installed
# package, not the source tree.
cd "$HERE"
status=0
started=$SECONDS
TIMEOUT=()
command -v timeout >/dev/null && TIMEOUT=(timeout --kill-after=10 300)
# shellcheck disable=SC2086 # PYTEST_ARGS is split on purpose
"${TIMEOUT[@]}" "$VENV/bin/python" -m pytest -p no:cacheprovider -q --durations=5 ${PYTEST_ARGS:-} tests || status=1
echo "pytest: $((SECONDS - started)) s"

started=$SECONDS
"${TIMEOUT[@]}" "$VENV/bin/python" examples/consumer.py || status=1
echo "examples/consumer.py: $((SECONDS - started)) s"

if ((status != 0)); then
    echo "clients/python/run-tests.sh: FAILED" >&2
fi
exit $status
