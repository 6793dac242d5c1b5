"""What a run needs of this machine, checked before anything is built.

    check(exp)          # drl-lab run: the kernel features the experiment file asks for
    require_root()      # every Lab, before it builds: root and the tools
    skip_reason()       # kernel tests: why they cannot run here, or None

Reading a file (lab/reader.py) never looks at the machine, so a file written
on one host loads on every other; only the run asks whether this kernel has
the congestion control the file names, or nft for faults.  Failures keep the
file:line form of the reader's errors.  Link delay and loss need nothing: netem
where the kernel has it (``netem_available``), else the lab's own delay line
(lab/delay.py).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from .errors import LabError
from .reader import field_error
from .spec import Experiment

TOOLS = ("ip", "tc", "ethtool", "iperf3")
AVAILABLE_CC = "/proc/sys/net/ipv4/tcp_available_congestion_control"


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, tc, BPF): run it with sudo")
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        raise LabError(f"missing tools: {', '.join(missing)} (apt install iproute2 ethtool iperf3)")


def skip_reason() -> str | None:
    """Why kernel tests cannot run on this machine (they also need bcc), or None when they can."""
    try:
        require_root()
        import bcc  # noqa: F401
    except LabError as e:
        return str(e)
    except ImportError:
        return "needs bcc (apt install python3-bpfcc)"
    return None


def check(exp: Experiment) -> None:
    """Raise the first thing ``exp`` asks for that this machine lacks (root: Lab checks it)."""
    available = available_cc()
    asked = [("[experiment]", "experiment", 0, exp.congestion_control)]
    asked += [(f"[[traffic]] #{i + 1}", "traffic", i, t.congestion_control) for i, t in enumerate(exp.traffic)]
    for where, table, index, cc in asked:
        if cc and available is not None and cc not in available:
            raise field_error(exp, where, table, index, "congestion_control",
                              f"expected one of {', '.join(available)}, got {cc!r}")
    for fault in exp.faults:
        if fault.action in ("loss", "partition") and not shutil.which("nft"):
            raise field_error(exp, f"[[fault]] #{fault.index + 1}", "fault", fault.index, "action",
                              f"{fault.action} needs nftables' nft (apt install nftables)")
        if fault.action == "recreate":
            hop = exp.route(fault.agent, exp.sink)[1]
            link = next(l for l in exp.links if set(l.ends) == {fault.agent, hop})
            if link.impaired and not netem_available():
                raise field_error(exp, f"[[fault]] #{fault.index + 1}", "fault", fault.index, "action",
                                  f"recreate cannot make link {fault.agent}-{hop} again: it has a delay line "
                                  "here (no sch_netem), whose relay would need starting again too")


def available_cc() -> list[str] | None:
    """The kernel's TCP congestion controls; None when it does not say."""
    path = Path(AVAILABLE_CC)
    return path.read_text().split() if path.exists() else None


def netem_available() -> bool:
    """Whether the kernel has sch_netem (loaded, or as a module); without it, links get the delay line."""
    release = Path("/proc/sys/kernel/osrelease").read_text().strip()
    if Path("/sys/module/sch_netem").exists():
        return True
    return any(Path(f"/lib/modules/{release}/kernel/net/sched").glob("sch_netem.ko*"))
