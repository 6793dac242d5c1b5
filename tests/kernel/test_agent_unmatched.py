"""A real agent whose class names a server's port as dport: its replies leave from that port
(sport), so the class matches nothing, and after 30 s of traffic the agent says so
(agent/service/unmatched.py): `hint` in drlctl status, `class_matches_nothing` in its log.

Topology (lab/topology.py's star): the agent on h1, with h2 as a peer so its own gossip
crosses the bypass counter too; h3 is the sink.
"""
from __future__ import annotations

import time

import pytest

from drl.agent.service.unmatched import WINDOW_S

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

# UDP from SPORT to DPORT on DST, RATE bytes/s in 1000-byte datagrams, for SECONDS
_SEND = """
import socket, sys, time
dst, sport, dport, rate, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("", sport))
start = time.monotonic()
sent = 0
while time.monotonic() - start < seconds:
    if sent < rate * (time.monotonic() - start):
        s.sendto(bytes(1000), (dst, dport))
        sent += 1000
    else:
        time.sleep(0.002)
"""


def test_a_dport_class_for_a_servers_replies_gets_a_sport_hint_and_loses_it_when_it_matches(net3, agents):
    h1, h2, h3 = net3.hosts
    a = agents.start(h1, [h2], "static", "10mbit", "--class", "dport=8080,proto=udp")
    replies = h1.popen("python3", "-c", _SEND, h3.addr4, "8080", "40000", "125000", str(WINDOW_S + 10))
    deadline = time.monotonic() + WINDOW_S + 8
    while (hint := a.status()["classes"][0]["hint"]) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    st = a.status()["classes"][0]
    assert hint and "sport=8080" in hint, st
    assert st["passed_bytes"] == st["dropped_bytes"] == 0, st
    logged = [line for line in a.log.read_text().splitlines() if "event=class_matches_nothing" in line]
    assert len(logged) == 1 and "class=default" in logged[0], logged
    assert replies.poll() is None       # the replies were still flowing when the hint came
    replies.terminate()                 # the 10 s they had left would show nothing more
    replies.wait()
    h1.run("python3", "-c", _SEND, h3.addr4, "40001", "8080", "125000", "0.5")    # what dport=8080 is for
    time.sleep(0.5)
    st = a.status()["classes"][0]
    assert st["passed_bytes"] > 0 and st["hint"] is None, st
