"""agent/kernel/caps.py: which of the agent's capabilities a CapEff mask lacks."""
from __future__ import annotations

import pytest

from drl.agent.kernel.caps import CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON, CAP_SYS_ADMIN, effective, missing

ALL = (1 << 41) - 1


@pytest.mark.parametrize("held, lacking", [
    (ALL, []),
    (0, ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"]),
    (1 << CAP_BPF | 1 << CAP_PERFMON | 1 << CAP_NET_ADMIN, []),          # the unit's set
    (1 << CAP_BPF | 1 << CAP_NET_ADMIN, ["CAP_PERFMON"]),
    (1 << CAP_SYS_ADMIN | 1 << CAP_NET_ADMIN, []),                       # SYS_ADMIN implies BPF and PERFMON
    (1 << CAP_SYS_ADMIN, ["CAP_NET_ADMIN"]),                             # but not NET_ADMIN
])
def test_missing(held, lacking):
    assert missing(held) == lacking


def test_effective_reads_capeff(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython3\nCapInh:\t0000000000000000\nCapPrm:\t000000c000001000\n"
                      "CapEff:\t000000c000001000\nCapBnd:\t000001ffffffffff\n")
    assert effective(str(status)) == 1 << CAP_BPF | 1 << CAP_PERFMON | 1 << CAP_NET_ADMIN
    assert missing(effective(str(status))) == []


def test_a_status_without_capeff_is_an_error(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython3\nCapInh:\t0000000000000000\n")
    with pytest.raises(OSError, match="no CapEff"):
        effective(str(status))
