#!/usr/bin/env bash
# Set up drl on a fresh Debian 12 machine (root): system packages, kernel
# headers for bcc, and a venv with the project and its test extras.
#
#   bash scripts/setup.sh            # everything (what .ci/run calls)
#   VENV=/opt/drl bash scripts/setup.sh
#
# bcc comes from Debian (python3-bpfcc), so the venv is made from Debian's
# /usr/bin/python3 with --system-site-packages.  bcc compiles limiter.c
# against /lib/modules/$(uname -r)/build; on a custom kernel with no header
# package we link Debian's nearest headers there: the tc program uses only
# UAPI structs, which are stable across these versions.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
say() { printf 'setup: %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "setup: must run as root (apt-get, kernel headers)" >&2; exit 1; }

APT_PKGS=(python3-bpfcc python3-cryptography bpfcc-tools python3-venv python3-pip iproute2 iperf3 ethtool procps kmod nftables)
# systemd: systemd-analyze verify of systemd/*.service; util-linux: setpriv and unshare, which
# run the agent as the unit does (tests/kernel/test_service.py)
APT_PKGS+=(systemd util-linux)
# systemd-container (systemd-nspawn) and debootstrap: a bookworm booted with systemd as PID 1,
# where tests/kernel/test_systemd.py runs the units for real (lab/nspawn.py)
APT_PKGS+=(systemd-container debootstrap)
# iputils-ping: the RTT through the lab's delay line (tests/kernel/test_delay_line.py, docs/lab.md)
APT_PKGS+=(iputils-ping)
# apache2-utils (ab) and nginx-light: the shaping benchmark (bench/datapath.py --part shape)
APT_PKGS+=(apache2-utils nginx-light)
# prometheus: /usr/bin/prometheus and promtool for tests/kernel/test_prometheus.py and
# tests/unit/service/test_metrics.py (installed below without its recommends: node-exporter, snmp, ...)
# vagrant: `vagrant validate` of the Vagrantfile (.ci/run), and the VM lab below; skip with DRL_NO_VAGRANT=1
[ "${DRL_NO_VAGRANT:-0}" = 1 ] || APT_PKGS+=(vagrant)
say "installing Debian packages: ${APT_PKGS[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${APT_PKGS[@]}" >/dev/null
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# etcd-server (3.4): /usr/bin/etcd for the registry's tests (lab/etcd.py, tests/kernel/test_registry_etcd.py)
apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
# The VM lab on libvirt (vagrant/README.md, tests/kernel/test_vagrant.py): vagrant-libvirt,
# QEMU, libvirtd (dnsmasq serves the management network's DHCP), and debootstrap, qemu-img
# and mkfs.ext4 for the box (scripts/build-box.sh).  Tests start a libvirtd of their own
# in a network namespace; the system's must not start, and must not bring up its NAT'ed
# "default" network on the host if it ever does.  Skip with DRL_NO_VAGRANT=1.
if [ "${DRL_NO_VAGRANT:-0}" != 1 ]; then
    say "installing the VM lab: vagrant-libvirt, libvirt, QEMU, debootstrap"
    policy_added=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy_added=1
    fi
    apt-get install -y -qq --no-install-recommends vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu \
        dnsmasq-base qemu-system-x86 qemu-utils debootstrap e2fsprogs >/dev/null
    [ "$policy_added" = 0 ] || rm -f /usr/sbin/policy-rc.d
    rm -f /etc/libvirt/qemu/networks/autostart/default.xml
    if [ -d /run/systemd/system ]; then
        systemctl disable --now -q libvirtd.service libvirtd.socket libvirtd-ro.socket libvirtd-admin.socket \
            virtlogd.socket virtlockd.socket 2>/dev/null || true
    fi
fi
# The tests start their own nginx, Prometheus and etcd; on a host booted with systemd the
# packages also enable and start system services (:80, :9090, :2379): stop and disable them.
# Without systemd, etcd's init script may have started it (policy-rc.d permitting).
if [ -d /run/systemd/system ]; then
    systemctl disable --now -q nginx prometheus etcd 2>/dev/null || true
elif [ -x /etc/init.d/etcd ]; then
    /etc/init.d/etcd stop >/dev/null 2>&1 || true
fi

kver=$(uname -r)
mod=/lib/modules/$kver
if [ -e "$mod/build/include" ] || [ -e /sys/kernel/kheaders.tar.xz ]; then
    say "kernel headers for $kver found"
elif apt-get install -y -qq "linux-headers-$kver" >/dev/null 2>&1; then
    say "installed linux-headers-$kver"
else
    arch=$(dpkg --print-architecture)
    apt-get install -y -qq "linux-headers-$arch" >/dev/null
    hdr=$(ls -d /usr/src/linux-headers-*-"$arch" | sort -V | tail -n 1)
    common=${hdr%-"$arch"}-common
    mkdir -p "$mod"
    ln -sfn "$hdr" "$mod/build"
    ln -sfn "$common" "$mod/source"
    say "no headers packaged for kernel $kver: linked $mod/build -> $hdr and $mod/source -> $common"
fi

if [ ! -x "$VENV/bin/python" ]; then
    say "creating venv $VENV from /usr/bin/python3 (--system-site-packages, for bcc)"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e '.[test]'
# grpcio-tools only bundles protoc, for the test that agent/gossip/drl_pb2.py matches
# drl.proto; its grpcio runtime dependency is not needed for that (--no-deps).
"$VENV/bin/python" -m pip install -q --no-deps grpcio-tools==1.85.1
"$VENV/bin/python" -c 'import bcc' || { echo "setup: bcc does not import from $VENV" >&2; exit 1; }
say "done: $VENV/bin/drl-agent, $VENV/bin/drlctl; tests: $VENV/bin/python -m pytest"
