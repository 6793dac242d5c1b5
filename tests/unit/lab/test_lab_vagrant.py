"""The Vagrant twin reads the same topology as the lab, for every shipped experiment."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from drl.lab.registry import builtin, resolve
from drl.lab.topology import plan
from drl.lab.vagrant import IFACE, TOPOLOGIES, dumps, export

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", sorted(builtin()))
def test_shipped_json_is_what_the_lab_parser_produces(name):
    shipped = (TOPOLOGIES / f"{name}.json").read_text()
    assert shipped == dumps(export(resolve(name))), "stale: run `python -m drl.lab.vagrant --write-all`"


@pytest.mark.skipif(not shutil.which("ruby"), reason="needs ruby to run vagrant/topology.rb")
@pytest.mark.parametrize("name", sorted(builtin()))
def test_vagrantfile_reader_builds_the_labs_hosts(name):
    exp = resolve(name)
    lab = plan(exp, run="lb0000")
    for alloc in exp.allocators:
        out = subprocess.run(["ruby", str(ROOT / "vagrant" / "topology.rb"), str(TOPOLOGIES / f"{name}.json"), alloc],
                             check=True, capture_output=True, text=True).stdout
        vms = {vm["name"]: vm for vm in json.loads(out)}
        assert list(vms) == list(exp.hosts)
        for host in exp.hosts:
            ips = [i.addr for v in lab.veths for i in (v.a, v.b) if i.host == host]
            if host in exp.limiters and lab.ctl:
                ips.append(lab.ctl_address(host))
            assert [n["ip"] for n in vms[host]["networks"]] == ips
            assert vms[host]["routes"] == [f"{r.dst},{r.via}" for r in lab.routes if r.host == host]
            assert vms[host]["rto_min"] == (lab.rto_min or "")
        agents = {h: vm for h, vm in vms.items() if vm["agent_argv"]}
        central = plan(exp, run="lb0000", central=alloc == "ctb")
        assert set(agents) == set(central.agent_ifaces())
        for h, vm in agents.items():
            assert vm["agent_iface_addr"] == central.agent_ifaces()[h].addr
            assert vm["agent_argv"][vm["agent_argv"].index("--allocator") + 1] == alloc
            assert IFACE in vm["agent_argv"]


def test_vm_probe_is_valid_python():
    """lab/vagrant.py's PROBE runs on the VMs (their Python 3.11); a syntax error there would
    only show as a run without samples."""
    from drl.lab.vagrant import PROBE
    compile(PROBE, "<probe>", "exec")


@pytest.mark.slow            # two runs of vagrant (Ruby): 2 s on a quiet machine, 10 s seen beside kernel tests
@pytest.mark.skipif(not shutil.which("vagrant"), reason="needs vagrant")
def test_libvirt_links_give_the_host_bridge_no_address(tmp_path):
    """Every link network is "veryisolated" without DHCP: vagrant-libvirt would otherwise give
    the host's bridge the subnet's .1, which the topology gives to l1, l2 and sw."""
    text = (ROOT / "vagrant" / "Vagrantfile").read_text()
    assert 'libvirt__forward_mode: "veryisolated"' in text
    assert "libvirt__dhcp_enabled: false" in text
    assert 'lv.management_network_mode = "none"' in text
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VAGRANT_HOME": str(tmp_path / "home"),
           "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot"), "DRL_BOX": "drl", "DRL_VAGRANT_TCG": "1"}
    out = subprocess.run(["vagrant", "validate"], cwd=ROOT / "vagrant", env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "needs DRL_INSTALL" in out.stderr, out.stdout + out.stderr
    install = tmp_path / "install"          # what lab/vagrant.py build_install makes (validate reads no file)
    install.mkdir()
    (install / "drl-0.1.0-py3-none-any.whl").touch()
    out = subprocess.run(["vagrant", "validate"], cwd=ROOT / "vagrant", env={**env, "DRL_INSTALL": str(install)},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
