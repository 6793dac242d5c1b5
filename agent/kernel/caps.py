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

    bpf_refused()    # None, or the one line to report when bpf(2) itself answers EPERM

Holding CAP_BPF is not enough where a seccomp filter refuses the bpf() call
(systemd-nspawn's default, a unit's ``SystemCallFilter=``): bcc then fails
creating its first map and says only "Failed to compile BPF module", which
reads like a missing kernel header.
"""
from __future__ import annotations

import ctypes
import errno
import os

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


BPF_REFUSED = ("bpf() refused (EPERM): the process lacks CAP_BPF/CAP_PERFMON or a seccomp filter forbids bpf() "
               "(systemd-nspawn: pass --system-call-filter=bpf; see docs/service.md)")
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "s390x": 351}
_BPF_MAP_CREATE, _BPF_MAP_TYPE_ARRAY = 0, 2


def bpf_errno() -> int:
    """0 when this process may create a BPF map (a one-entry array, closed at once), else the
    errno bpf(BPF_MAP_CREATE) gave; 0 also on an architecture whose syscall number is unknown here."""
    nr = _SYS_BPF.get(os.uname().machine)
    if nr is None:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    attr = (ctypes.c_uint32 * 16)(_BPF_MAP_TYPE_ARRAY, 4, 4, 1)   # map_type, key_size, value_size, max_entries
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_long(_BPF_MAP_CREATE), ctypes.byref(attr),
                      ctypes.c_uint(ctypes.sizeof(attr)))
    if fd < 0:
        return ctypes.get_errno()
    os.close(fd)
    return 0


def bpf_refused(probe=bpf_errno) -> str | None:
    """BPF_REFUSED when bpf() answers this process EPERM, else None (the failure is something else)."""
    return BPF_REFUSED if probe() == errno.EPERM else None
