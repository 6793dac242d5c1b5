#!/usr/bin/env bash
# The whole suite as CI runs it (.ci/run), as root: the kernel tests one after another, and
# beside them, at nice 19, the unit and simulator tests.  The kernel tests wait on real
# TCP and timers most of the time (a serial run keeps less than half of one core busy); at nice 19
# the others take only the CPU those leave, so the kernel tests see an idle core as before,
# and the fast set's 5-s guard reads CPU time there (DRL_FAST_CLOCK, tests/conftest.py).
# Arguments go to both pytest runs.  `pytest -q` alone still runs everything, one by one.
#
#   sudo bash scripts/test.sh
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# a job started with & has SIGINT ignored, and a Python started so never raises KeyboardInterrupt:
# plain SIGINT again for the tests that interrupt their children
DRL_FAST_CLOCK=cpu "$py" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp("nice", ["nice", *sys.argv[1:]])' \
    -n 19 "$py" -m pytest -q tests/unit tests/sim "$@" >"$log" 2>&1 &
beside=$!
"$py" -m pytest -q tests/kernel "$@"
kernel=$?
wait "$beside"
rest=$?
echo
echo "== tests/unit and tests/sim, run beside the kernel tests at nice 19:"
cat "$log"
exit $(( kernel != 0 || rest != 0 ))
