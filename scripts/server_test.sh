#!/bin/sh
# End-to-end tests of `dsv4 serve` (tests/server/): the openai / anthropic Python clients, curl, raw wire
# formats, errors, concurrency vs. the same request alone, cancellation, 503 admission, SIGTERM drain.
#
#   sh scripts/server_test.sh [BUILD_DIR]           pytest suite against BUILD_DIR/dsv4 (default: build)
#
# Environment:
#   DSV4_STRESS=1        also run tests/server/stress.py (DSV4_STRESS_N requests, default 1000) against the
#                        same binary; meant for the ASan build (leaks make the server exit non-zero)
#   DSV4_SERVER_CONC     concurrent streaming clients (default 16), DSV4_SERVER_TOKENS tokens each (24)
#   DSV4_TEST_MODEL      reuse a model directory instead of synthesizing one
# Needs python3 with pytest, httpx, openai and anthropic (installed with pip when missing) and curl.
set -e
build=${1:-build}
cd "$(dirname "$0")/.."
[ -x "$build/dsv4" ] || { echo "server_test: $build/dsv4 not built" >&2; exit 1; }
command -v curl >/dev/null 2>&1 || { echo "server_test: curl is required" >&2; exit 1; }
if ! python3 -c "import pytest, httpx, openai, anthropic" 2>/dev/null; then
    echo "server_test: installing pytest httpx openai anthropic" >&2
    python3 -m pip install -q pytest httpx openai anthropic >&2 || pip install -q pytest httpx openai anthropic >&2
fi
export DSV4_BIN="$PWD/$build/dsv4"
if [ -z "$DSV4_TEST_MODEL" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT INT TERM
    "$DSV4_BIN" synth -o "$tmp/tiny" >/dev/null 2>&1
    export DSV4_TEST_MODEL="$tmp/tiny"
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp}"
python3 -m pytest -q -p no:cacheprovider tests/server
if [ "${DSV4_STRESS:-0}" = 1 ]; then
    python3 tests/server/stress.py --bin "$DSV4_BIN" --model "$DSV4_TEST_MODEL" -n "${DSV4_STRESS_N:-1000}"
fi
echo "server tests ($build): passed"
