#!/bin/sh
# Provision one VM of the Vagrant twin (called by the Vagrantfile with DRL_* set):
# install drl and its units, add the lab's routes and link shaping, start the shipped
# drl-agent.service with the host's drl.toml (if this host runs an agent) and the
# traffic servers (if it is the sink) as systemd services.
set -eu

# drl and its units, as docs/service.md installs them.  A box of scripts/build-box.sh has
# the venv with drl's dependencies (and no network): the wheel and the units come uploaded
# in /tmp/drl-install.  Any other box gets everything from the internet and the synced
# checkout in /drl.
if [ -d /tmp/drl-install ]; then
    /opt/drl/bin/pip install -q --no-index --no-deps /tmp/drl-install/drl-*.whl
    units=/tmp/drl-install
else
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -qy python3-venv python3-bpfcc iperf3 ethtool iproute2 "linux-headers-$(uname -r)"
    [ -d /opt/drl ] || python3 -m venv --system-site-packages /opt/drl
    # The core install (no extra): the agent, drlctl, and drl.lab.web for the web
    # traffic, which needs only the standard library; numpy and matplotlib
    # (drl[lab], drl[sim]) serve the lab's metrics and plots, which VMs do not run.
    # /drl is an rsync copy: drop a build/ synced from the host so no stale file
    # reaches the install.
    rm -rf /drl/build
    /opt/drl/bin/pip install -q /drl
    units=/drl/systemd
fi
# sudo's secure_path has /usr/local/bin (and the unit's ExecStart= wants it there); login
# shells get the venv's python3 for the traffic commands (python3 -m drl.lab.web ...).
ln -sf /opt/drl/bin/drl-agent /opt/drl/bin/drlctl /usr/local/bin/
echo 'PATH=/opt/drl/bin:$PATH' > /etc/profile.d/drl.sh
id drl >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin drl
install -d /var/tmp/drl
install -d -m 0755 /etc/drl
install -m 0640 -g drl /tmp/drl-cluster.key /etc/drl/cluster.key   # the agent reads it as drl
rm -f /tmp/drl-cluster.key
install -m 0644 "$units/drl-agent.service" "$units/drl-agent@.service" /etc/systemd/system/
rm -rf /tmp/drl-install

iface_of() {  # the NIC that carries address $1
    ip -o -4 addr show | awk -v a="$1" '{split($4, p, "/"); if (p[1] == a) print $2}'
}

sysctl -qw net.ipv4.ip_forward=1
rto=${DRL_RTO_MIN:+rto_min ${DRL_RTO_MIN}}   # the experiment's TCP RTO floor, on every lab route (lab/spec.py)
for r in ${DRL_ROUTES}; do
    ip route replace "${r%%,*}" via "${r##*,}" $rto
done
if [ -n "$rto" ]; then
    ip -o -4 route show scope link | awk '$1 ~ /^10\.1\./ {print $1, $3}' | while read -r dst dev; do
        ip route replace "$dst" dev "$dev" $rto
    done
fi
for s in ${DRL_SHAPING}; do   # addr,rate_bps[,delay_ms,jitter_ms,loss_pct] (vagrant/topology.rb)
    IFS=, read -r addr rate delay jitter loss <<SPEC
$s
SPEC
    dev=$(iface_of "$addr")
    if [ -n "$delay" ]; then      # netem, as the lab uses where the kernel has it (lab/topology.py)
        tc qdisc replace dev "$dev" root netem delay "${delay}ms" "${jitter}ms" loss "${loss}%" \
            $( [ "$rate" = 0 ] || echo rate "${rate}bit" )
        continue
    fi
    burst=$(( rate / 800 > 6056 ? rate / 800 : 6056 ))   # 10 ms of traffic, >= 4 frames (lab/topology.py)
    tc qdisc replace dev "$dev" root tbf rate "${rate}bit" burst "$burst" latency 50ms
done
for dev in $(ls /sys/class/net | grep -v '^lo$'); do   # police MTU-sized packets, as the lab does
    ethtool -K "$dev" tso off gso off gro off 2>/dev/null || true
done

if [ -n "${DRL_AGENT_CONFIG}" ]; then
    dev=$(iface_of "${DRL_AGENT_IFACE_ADDR}")
    printf '%s' "${DRL_AGENT_CONFIG}" | sed "s/{iface}/${dev}/" > /etc/drl/drl.toml
    if [ -n "${DRL_VAGRANT_TCG}" ]; then   # docs/service.md "On a slow host"
        install -d /etc/systemd/system/drl-agent.service.d
        printf '[Service]\nTimeoutStartSec=600s\n' > /etc/systemd/system/drl-agent.service.d/slow-start.conf
    fi
    systemctl daemon-reload
    systemctl enable -q drl-agent.service
    # not waited for here (Type=notify: READY=1 after bcc's compile): drl-lab waits for drlctl
    systemctl start --no-block drl-agent.service
fi

i=0
printf '%s\n' "${DRL_SERVERS}" | while IFS= read -r cmd; do
    [ -n "$cmd" ] || continue
    i=$((i + 1))
    # iperf3 -s -1 exits after one test; as a service it restarts for the next one
    cat > "/etc/systemd/system/drl-traffic-server${i}.service" <<UNIT
[Unit]
Description=drl lab traffic server ${i}

[Service]
WorkingDirectory=/var/tmp/drl
Environment=PATH=/opt/drl/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart=/usr/bin/env ${cmd}
Restart=always

[Install]
WantedBy=multi-user.target
UNIT
    systemctl daemon-reload
    systemctl enable --now "drl-traffic-server${i}.service"
done
