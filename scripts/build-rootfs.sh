#!/usr/bin/env bash
# Build (once) the Debian bookworm root filesystem tests/kernel/test_systemd.py boots with
# systemd-nspawn, and print where it is: /var/cache/drl-test/nspawn-rootfs/<hash of the
# package list>.  The test builds it itself when it is missing; this is for doing it ahead
# (a CI image) or by hand.  Needs root, debootstrap and the Debian mirror (DRL_DEBIAN_MIRROR).
#
#   bash scripts/build-rootfs.sh
#   DRL_TEST_CACHE=/srv/cache bash scripts/build-rootfs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m drl.lab.nspawn build
