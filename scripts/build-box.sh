#!/usr/bin/env bash
# Build the Vagrant box the VM lab boots (vagrant/README.md), from Debian's packages
# and a wheelhouse of drl's dependencies made on this host, so that provisioning (which
# installs drl's own wheel and units, uploaded: lab/vagrant.py) needs no network:
#
#   bash scripts/build-box.sh            # prints the .box path (cached)
#   DRL_BOX_CACHE=/somewhere bash scripts/build-box.sh
#
# The box is Debian 12 for vagrant-libvirt: one ext4 qcow2 without a partition table
# or bootloader, booted directly with the kernel and initrd that ship beside it in the
# box (its own Vagrantfile points libvirt at them), which boots fastest under TCG.  It
# holds the kernel and its headers, bcc, iproute2, iperf3, systemd(-networkd), sshd
# with Vagrant's insecure key, and a venv in /opt/drl with drl's dependencies (not drl:
# an edit of drl rebuilds no box).
#
# One debootstrap for the whole test suite: the box starts from the systemd-nspawn
# container's root file system (lab/nspawn.py, built and cached once, $DRL_BOX_CACHE/
# nspawn-rootfs/) and adds the kernel, sshd and tools with apt.  Two caches of its own in
# $DRL_BOX_CACHE (default /var/cache/drl-test): that root file system with the box's
# packages (rootfs-<hash>.tar, keyed by this script, the container's recipe and the package
# list: apt takes minutes) and the box (box-<hash>.box, also keyed by pyproject.toml's
# dependencies).  Every use touches what it reads;
# what no checkout used for 14 days is dropped, other checkouts' boxes stay.  Needs root, debootstrap,
# qemu-utils and e2fsprogs; reaches only the Debian mirror and PyPI (for the wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${DRL_BOX_CACHE:-/var/cache/drl-test}
MIRROR=${DRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
PY=${PYTHON:-$ROOT/.venv/bin/python}
say() { printf 'build-box: %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { echo "build-box: must run as root (debootstrap, chroot)" >&2; exit 1; }

# What the VMs need and nothing else (no recommends, no docs): the kernel and the
# headers bcc compiles limiter.c against, bcc, the tools provision.sh and the
# experiments call, sshd and sudo for Vagrant, an initramfs for the direct boot.
PKGS=(linux-image-amd64 linux-headers-amd64 initramfs-tools python3-bpfcc python3-venv
      iproute2 iperf3 ethtool procps kmod iputils-ping systemd systemd-sysv udev
      openssh-server sudo rsync ca-certificates)
REQS=$("$PY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')

t0=$(date +%s)
ns_key=$("$PY" -c 'from drl.lab.nspawn import rootfs_key; print(rootfs_key())')
base_key=$( { cat "$0"; printf '%s\n' "$SUITE" "$MIRROR" "$ns_key" "${PKGS[@]}"; } | sha256sum | cut -c1-16)
box_key=$( { echo "$base_key"; echo "$REQS"; } | sha256sum | cut -c1-16)
BOX=$CACHE/box-$box_key.box
BASE=$CACHE/rootfs-$base_key.tar
if [ -s "$BOX" ]; then
    touch "$BOX"        # in use: the pruning below keeps it
    say "cached: $BOX ($(( $(date +%s) - t0 )) s)"
    echo "$BOX"
    exit 0
fi
mkdir -p "$CACHE"
WORK=$(mktemp -d "$CACHE/build.XXXXXX")
R=$WORK/root
cleanup() {
    for m in dev/pts dev proc sys; do umount -l "$R/$m" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
in_root() { chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }
mount_api() { for m in proc sys dev dev/pts; do mkdir -p "$R/$m"; done
              mount -t proc proc "$R/proc"; mount -t sysfs sys "$R/sys"
              mount --bind /dev "$R/dev"; mount --bind /dev/pts "$R/dev/pts"; }
umount_api() { for m in dev/pts dev sys proc; do umount "$R/$m"; done; }

if [ -s "$BASE" ]; then
    touch "$BASE"       # in use: the pruning at the end keeps it
    say "Debian root file system cached: $BASE"
    mkdir -p "$R"
    tar -C "$R" -xf "$BASE"
else
    NS=$("$PY" -m drl.lab.nspawn build --cache "$CACHE") || exit 1
    say "Debian root file system from the container's: $NS"
    mkdir -p "$R" && cp -a "$NS/." "$R"
    # the container's marker and its console-getty mask are the container's, not a VM's
    rm -f "$R/.drl-rootfs-complete" "$R/etc/systemd/system/console-getty.service"
    # No service starts in the chroot; apt keeps no docs, no recommends, no caches.
    printf '#!/bin/sh\nexit 101\n' > "$R/usr/sbin/policy-rc.d"; chmod +x "$R/usr/sbin/policy-rc.d"
    cat > "$R/etc/dpkg/dpkg.cfg.d/01-drl-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
    printf 'APT::Install-Recommends "0";\nAPT::Install-Suggests "0";\n' > "$R/etc/apt/apt.conf.d/01-drl-norecommends"
    printf 'deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
        "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" "$SUITE" > "$R/etc/apt/sources.list"
    # The initramfs is built for any virtio machine, not for this host's hardware.
    mkdir -p "$R/etc/initramfs-tools/conf.d"
    echo 'MODULES=most' > "$R/etc/initramfs-tools/conf.d/drl"
    mount_api
    say "apt-get install ${PKGS[*]}"
    in_root apt-get update -qq
    in_root apt-get install -y -qq "${PKGS[@]}" >"$WORK/apt.log" 2>&1 || { tail -n 30 "$WORK/apt.log" >&2; exit 1; }
    in_root apt-get clean
    umount_api
    rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin
    tar -C "$R" -cf "$BASE.tmp" . && mv "$BASE.tmp" "$BASE"
    say "root file system: $BASE ($(du -h "$BASE" | cut -f1), $(( $(date +%s) - t0 )) s so far)"
fi

say "wheelhouse for drl's dependencies"
mkdir -p "$R/tmp/wheels" && echo "$REQS" > "$R/tmp/wheels/requirements.txt"
"$PY" -m pip wheel -q --wheel-dir "$R/tmp/wheels" -r "$R/tmp/wheels/requirements.txt" >"$WORK/pip.log" 2>&1 \
    || { tail -n 30 "$WORK/pip.log" >&2; exit 1; }
mount_api
in_root /usr/bin/python3 -m venv --system-site-packages /opt/drl
in_root /opt/drl/bin/pip install -q --no-index --find-links /tmp/wheels -r /tmp/wheels/requirements.txt \
    >"$WORK/pip-vm.log" 2>&1 || { umount_api; tail -n 30 "$WORK/pip-vm.log" >&2; exit 1; }
umount_api
"$PY" -c 'import json, sys; print(json.dumps({"venv": "/opt/drl", "requirements": sys.argv[1].split()}))' "$REQS" \
    > "$R/etc/drl-box.json"
rm -rf "$R/tmp/wheels" "$R"/root/.cache

# Vagrant's user, its insecure key (the one vagrant ships) and password-less sudo.
VKEY=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -n 1 || true)
[ -n "$VKEY" ] || VKEY=$(find / -path /proc -prune -o -name vagrant.pub -path '*keys*' -print -quit 2>/dev/null)
[ -n "$VKEY" ] || { echo "build-box: vagrant's insecure key (keys/vagrant.pub) not found" >&2; exit 1; }
in_root useradd -m -s /bin/bash -G sudo vagrant
echo 'vagrant:vagrant' | in_root chpasswd
install -d -m 0700 "$R/home/vagrant/.ssh"
install -m 0600 "$VKEY" "$R/home/vagrant/.ssh/authorized_keys"
in_root chown -R vagrant:vagrant /home/vagrant/.ssh
echo 'vagrant ALL=(ALL) NOPASSWD: ALL' > "$R/etc/sudoers.d/vagrant"; chmod 0440 "$R/etc/sudoers.d/vagrant"
printf 'UseDNS no\n' > "$R/etc/ssh/sshd_config.d/drl.conf"

# Boot: root is the whole virtio disk; the first NIC (vagrant's management network)
# asks DHCP, the others get Vagrant's static files (50-vagrant-*.network sort first).
echo '/dev/vda / ext4 defaults,noatime 0 1' > "$R/etc/fstab"
echo drl-box > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 drl-box\n' > "$R/etc/hosts"
cat > "$R/etc/systemd/network/99-drl-dhcp.network" <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
LinkLocalAddressing=no
EOF
in_root systemctl enable -q systemd-networkd ssh
in_root systemctl mask -q systemd-networkd-wait-online.service apt-daily.timer apt-daily-upgrade.timer \
    e2scrub_all.timer fstrim.timer man-db.timer getty@tty1.service 2>/dev/null || true
rm -f "$R/usr/sbin/policy-rc.d"
: > "$R/etc/machine-id"   # each VM makes its own at first boot (DHCP client ids differ)

B=$WORK/box
mkdir -p "$B"
cp "$(readlink -f "$R/vmlinuz")" "$B/vmlinuz"
cp "$(readlink -f "$R/initrd.img")" "$B/initrd.img"
size_mb=$(( $(du -sm "$R" | cut -f1) * 13 / 10 + 512 ))   # room for logs and bcc's caches
say "ext4 image (${size_mb} MiB, sparse)"
truncate -s "${size_mb}M" "$WORK/root.raw"
mkfs.ext4 -q -F -L drl-root -E root_owner=0:0 -d "$R" "$WORK/root.raw"
qemu-img convert -O qcow2 "$WORK/root.raw" "$B/box.img"
rm -f "$WORK/root.raw"
virtual_gb=$(( (size_mb + 1023) / 1024 ))
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %d}\n' "$virtual_gb" > "$B/metadata.json"
cat > "$B/Vagrantfile" <<'EOF'
# Direct kernel boot of the box's root disk: no bootloader in the image.
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |libvirt|
    libvirt.kernel = File.join(__dir__, "vmlinuz")
    libvirt.initrd = File.join(__dir__, "initrd.img")
    libvirt.cmd_line = "root=/dev/vda rw console=ttyS0 quiet"
  end
end
EOF
tar -C "$B" -cf "$BOX.tmp" metadata.json Vagrantfile vmlinuz initrd.img box.img
mv "$BOX.tmp" "$BOX"
# The work tree (several GiB) goes before the time is taken: the time printed is the whole build.
trap - EXIT
cleanup
# Other checkouts' boxes and root file systems (1+ GiB each) stay while they are used (a
# cached box is touched at every use); one unused for 14 days is dropped.
find "$CACHE" -maxdepth 1 \( -name 'box-*.box' -o -name 'rootfs-*.tar' \) -mtime +14 -delete
say "box: $BOX ($(du -h "$BOX" | cut -f1)) built in $(( $(date +%s) - t0 )) s"
echo "$BOX"
