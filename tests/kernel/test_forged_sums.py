"""Forged sums with real agents (issue 44): a key holder that is no chosen summer, sending
from its own address, moves nothing through the sum tree.  A PARTIAL of 1e300 is refused at
decode (a Sums counts at most MAX_VALUE a limiter); one of the most a limiter may publish is
counted by nobody, since h1, its group's first member, sums.

Topology: lab/topology.py's star, 3 hosts; h1 and h2 run FPS agents at branching 1 (so the
tree runs), h3 runs none: the forger holds the key and binds h3's gossip port, h3 being a
named peer of h1.
"""
from __future__ import annotations

import hashlib
import hmac

import pytest

from drl.agent.config.build import class_key
from drl.agent.gossip import drl_pb2
from drl.agent.gossip.keys import load_key
from drl.agent.gossip.wire import MAX_VALUE, Header, Message, Sums, SumKind, encode
from drl.agent.service.daemon import CLUSTER

from tests.kernel.test_agent_identity import send_bound_from

pytestmark = pytest.mark.kernel


def forged(key: bytes, seq: int, value: float) -> bytes:
    """h3's PARTIAL of ``value`` to h1, built past the encoder's clamp and signed."""
    header = Header(cluster=CLUSTER, node="h3", dst="h1", seq=seq, incarnation=7, sent_at=0.0)
    dg = drl_pb2.Datagram.FromString(encode(Message(header, Sums(SumKind.PARTIAL, 1, ((class_key("default"), 1.0),))),
                                            None))
    dg.sums.values[0] = value
    body = dg.SerializeToString()
    return body + hmac.new(key, body, hashlib.sha256).digest()


def test_a_forged_partial_from_no_summer_moves_no_sum(net3, agents, tmp_path):
    h1, h2, h3 = net3.hosts
    args = ("--interval", "100ms", "--branching", "1")
    a1 = agents.start(h1, [h2, h3], "fps", "10mbit", *args)
    agents.start(h2, [h1, h3], "fps", "10mbit", *args)
    before = a1.wait_for(lambda s: (s.get("sum_tree") or {}).get("summer") == "h1", 10)
    assert before["sum_tree"]["summer"] == "h1", before.get("sum_tree")
    key = load_key(tmp_path / "cluster.key")
    send_bound_from(h3, h1.addr4, [forged(key, seq, 1e300) for seq in range(1, 11)]
                    + [forged(key, seq, MAX_VALUE) for seq in range(11, 41)])
    after = a1.wait_for(lambda s: s["gossip"]["rejected_by_reason"].get("out_of_range", 0) >= 10, 5)
    assert after["gossip"]["rejected_by_reason"] == {"out_of_range": 10}, after["gossip"]
    for _ in range(10):       # a second of ticks: the 30 accepted ones counted by nobody
        st = a1.wait_for(lambda s: s["gossip"]["received"] > after["gossip"]["received"], 2)
        assert st["sum_tree"]["summer"] == "h1", st["sum_tree"]
        assert st["allocator_state"]["remote_weights"] < 1e6, st["allocator_state"]
        after = st
