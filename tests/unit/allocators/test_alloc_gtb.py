"""GTB ([Raghavan07] §3.2): local limit = global - the others' reported rates,
stale reports kept as they stand (its known weakness)."""
from __future__ import annotations

import pytest

from drl.agent.allocators import common, create
from drl.agent.model import Local, Mode, PeerState, Snapshot

MBIT = 1e6 / 8


def step(local_Bps: float, peers: list[PeerState], global_Bps: float = 10 * MBIT):
    view = common.peer_view(("a", *(p.node_id for p in peers)), peers)
    snap = Snapshot(now=1.0, node_id="a", interval_s=0.05, global_Bps=global_Bps,
                    local=Local(demand_Bps=local_Bps), view=view)
    alloc = create("gtb")
    return alloc.step(alloc.initial_state("a", view.members), snap).decision


def test_gtb_refills_at_global_less_remote_arrivals():
    d = step(2 * MBIT, [PeerState("b", 3 * MBIT, True, 0.05), PeerState("c", 1.5 * MBIT, True, 0.05)])
    assert d.mode == Mode.BUCKET
    assert d.limit_Bps == pytest.approx(5.5 * MBIT)
    assert d.publish == 2 * MBIT          # its own arrival rate


def test_gtb_keeps_stale_reports_unlike_grd():
    # c died reporting 6 Mbit/s: GTB still drains at 3 + 6 and keeps the full
    # global rate, where the 1/N policy would zero c and cut L to 2/3.
    peers = [PeerState("b", 3 * MBIT, True, 0.05), PeerState("c", 6 * MBIT, False, 30.0)]
    d = step(2 * MBIT, peers)
    assert d.limit_Bps == pytest.approx(1 * MBIT)
    assert d.info["remote_Bps"] == pytest.approx(9 * MBIT)


def test_gtb_limit_never_negative():
    assert step(1 * MBIT, [PeerState("b", 12 * MBIT, True, 0.05)]).limit_Bps == 0.0


def test_gtb_alone_gets_the_global_rate():
    assert step(1 * MBIT, []).limit_Bps == pytest.approx(10 * MBIT)
