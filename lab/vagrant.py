"""Export an experiment as the JSON topology the Vagrant twin reads (vagrant/Vagrantfile).

    python -m drl.lab.vagrant baseline            # print it
    python -m drl.lab.vagrant --write-all         # refresh vagrant/topologies/*.json

The JSON comes from the lab's own reader and planner (lab/reader.py,
lab/topology.py, lab/agents.py, lab/traffic.py), so a VM gets exactly the
addresses, routes, shaping, agent options and traffic commands that the
namespace lab uses; tests/unit/lab/test_lab_vagrant.py checks the shipped files
are current and that vagrant/topology.rb reads them back the same.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from drl.agent.units import to_bps

from .agents import agent_argv
from .registry import builtin, resolve
from .spec import REFERENCE, Experiment
from .topology import plan as make_plan
from .traffic import place

TOPOLOGIES = Path(__file__).resolve().parent.parent / "vagrant" / "topologies"
VM_KEY = "/etc/drl/cluster.key"
VM_SOCKET = "/run/drl/agent.sock"
VM_OUT = Path("/var/tmp/drl")
IFACE = "{iface}"  # the VM's NIC carrying the agent's address; provision.sh fills it in


def export(exp: Experiment) -> dict:
    spread, central = make_plan(exp, run="lb0000"), make_plan(exp, run="lb0000", central=True)
    hosts = []
    for name, role in exp.hosts.items():
        links = [{"net": f"link{i}", "addr": end.addr, "prefix": 24,
                  "rate_bps": to_bps(v.link.rate_Bps) if v.link.rate_Bps else None, **_impairment(v.link)}
                 for i, v in enumerate(spread.veths) for end in (v.a, v.b) if end.host == name]
        hosts.append({"name": name, "role": role, "links": links,
                      "ctl_addr": spread.ctl_address(name) if role == "limiter" and spread.ctl else None,
                      "routes": [{"dst": r.dst, "via": r.via} for r in spread.routes if r.host == name]})
    agents = {}
    for alloc in exp.allocators:
        p = central if alloc == REFERENCE else spread
        agents[alloc] = {h: {"iface_addr": iface.addr,
                             "argv": agent_argv(p, h, alloc, VM_KEY, VM_SOCKET, iface=IFACE)}
                         for h, iface in p.agent_ifaces().items()}
    traffic = [{"label": g.label, "server": g.server_host, "client": g.client_host,
                "server_argv": g.server_argv(VM_OUT, python="python3"),
                "client_argv": g.client_argv(VM_OUT, python="python3"),
                "start_s": g.traffic.start_s, "stop_s": g.traffic.stop_s}
               for g in place(spread)]
    events = [{"at_s": e.at_s, "link": list(e.link), "rate_bps": to_bps(e.rate_Bps)} for e in exp.events]
    return {"experiment": exp.name, "description": exp.description, "global_bps": to_bps(exp.global_Bps),
            "duration_s": exp.duration_s, "allocators": list(exp.allocators),
            "rto_min": spread.rto_min,
            "hosts": hosts, "agents": agents, "traffic": traffic, "events": events}


def _impairment(link) -> dict:
    """A link's delay, jitter and loss for netem on the VMs' NICs (VMs have sch_netem: no delay
    line there); absent on links without them, so files without delay export as before."""
    if not link.impaired:
        return {}
    return {"delay_ms": round((link.delay_s or 0) * 1e3, 3), "jitter_ms": round((link.jitter_s or 0) * 1e3, 3),
            "loss_pct": link.loss_pct or 0}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m drl.lab.vagrant", description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", nargs="?", help="built-in name or TOML file")
    ap.add_argument("--write-all", action="store_true", help="rewrite vagrant/topologies/ for every built-in")
    args = ap.parse_args(argv)
    if args.write_all:
        TOPOLOGIES.mkdir(parents=True, exist_ok=True)
        for name in builtin():
            (TOPOLOGIES / f"{name}.json").write_text(dumps(export(resolve(name))))
        return
    if not args.experiment:
        ap.error("name an experiment or pass --write-all")
    sys.stdout.write(dumps(export(resolve(args.experiment))))


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    main()
