"""The capabilities ``drl-agent up`` needs, checked before anything is touched.

    missing()        # [] when this process may run the agent, else e.g. ["CAP_BPF", "CAP_NET_ADMIN"]

Root has them all; a dedicated user gets exactly these from the unit
(systemd/drl-agent.service ``AmbientCapabilities=``).  Found by running the
agent with each one removed (docs/service.md has the table and each error):

* CAP_BPF: bcc creates the maps and loads the program (``kernel.unprivileged_bpf_disabled``);
* CAP_PERFMON: the verifier refuses the program's variable-offset packet
  pointer arithmetic without it (Spectre v1 hardening for "!root");
* CAP_NET_ADMIN: tc clsact and the filter, sched_cls programs, and SO_MARK on
  the gossip socket.

CAP_SYS_ADMIN implies CAP_BPF and CAP_PERFMON (the kernel's bpf_capable() and
perfmon_capable()), so it stands in for both.
"""
from __future__ import annotations

CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 12, 21, 38, 39
REQUIRED = {"CAP_BPF": CAP_BPF, "CAP_PERFMON": CAP_PERFMON, "CAP_NET_ADMIN": CAP_NET_ADMIN}
IMPLIED_BY_SYS_ADMIN = {"CAP_BPF", "CAP_PERFMON"}


def effective(status: str = "/proc/self/status") -> int:
    """This process's effective capability mask (CapEff in /proc/self/status)."""
    with open(status) as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    raise OSError(f"no CapEff line in {status}")


def missing(caps: int | None = None) -> list[str]:
    """The names of the REQUIRED capabilities not in ``caps`` (default: ours), in REQUIRED's order."""
    caps = effective() if caps is None else caps
    sys_admin = bool(caps >> CAP_SYS_ADMIN & 1)
    return [name for name, bit in REQUIRED.items()
            if not caps >> bit & 1 and not (sys_admin and name in IMPLIED_BY_SYS_ADMIN)]
