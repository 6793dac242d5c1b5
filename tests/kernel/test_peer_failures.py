"""No host starved by another's failure (issue 43): two real agents that found each other in
etcd (test_agent_registry.py's fleet, etcd on the sink), unpaced cubic on both: 6 flows on
h1, 1 on h2, so h1's local limit is most of the limit and h2's well under its safe rate.

First h2 goes deaf (nftables drops the gossip coming in): it hears no peer, and passes at
least its safe rate in every 1-s window from 1 s after the cut (its liveness timeout and
TCP's ramp); before, it reserved h1's last local limit until h1's fail-safe could have
started and passed 0.1 Mbit/s for 2 s.  h1, which still hears it, is told by its echo and
holds itself to its own safe rate.  Then h2's agent is SIGKILLed: h1 passes at least its safe rate
from 1 s after the kill on, through h2's lease expiring (5 s), and its safe rate stays G/2
(the killed datapath keeps the fail-safe of N = 2).  Before, h1 fell to the slow-start
floor once the lease went: its safe rate became G, and h2 was reserved all of it.

Each host's rate is its eth0's transmitted bytes (L2, what the limiter counts; its gossip
is a few kbit/s of it).  A shaped class passes close to its rate; 0.85 of the safe rate is
what bulk TCP through it always reaches here, and far above the floor the bug left.
"""
from __future__ import annotations

import signal
import time

import pytest

from drl.lab.measure import DT, RxMeter
from drl.lab.metrics import sliding_means
from drl.lab.traffic import iperf3_server, iperf3_start

from test_agent_registry import make_fleet, members  # noqa: F401  (make_fleet: a fixture)

pytestmark = pytest.mark.kernel

LIMIT = 12e6
SAFE = LIMIT / 2
FLOOR = 0.85 * SAFE
GOSSIP_PORT = 7470


class TxMeter(RxMeter):
    """RxMeter on the bytes host's eth0 sent."""

    def _sample(self) -> None:
        link = self.nl.get_links(self.index)[0]
        self.samples.append((time.monotonic(), link.get_attr("IFLA_STATS64")["tx_bytes"]))


def windows_bps(meter: RxMeter, start: float, end: float) -> list[float]:
    """Every 1-s window (sliding by DT) of [start, end), bits/s; waits for the last sample."""
    time.sleep(max(0.0, end + DT - time.monotonic()))
    return [8 * w for w in sliding_means(meter.series(start, end), DT)]


def deafen(host) -> None:
    """Drop every gossip datagram coming in to ``host`` (its own still go out)."""
    host.run("nft", "add table inet drl43")
    host.run("nft", "add chain inet drl43 in { type filter hook input priority 0 ; }")
    host.run("nft", f"add rule inet drl43 in udp dport {GOSSIP_PORT} drop")


def test_a_deaf_host_and_a_killed_peers_survivor_keep_their_safe_rates(make_fleet):  # noqa: F811
    lab, _, _, start_together = make_fleet(3)
    h1, h2, sink = lab.hosts
    agents = start_together((h1, h2), global_="12mbit")
    for a in agents:
        a.wait_for(lambda s: members(s) == 2, 10)
    clients = [iperf3_start(h, iperf3_server(sink), seconds=40, streams=n) for h, n in ((h1, 6), (h2, 1))]
    try:
        with TxMeter(h1) as tx1, TxMeter(h2) as tx2:
            time.sleep(4)
            before = agents[0].status()["classes"][0]["local_limit_bps"]
            cut = time.monotonic()
            h2_before = min(windows_bps(tx2, cut - 2, cut))
            deafen(h2)
            time.sleep(1)
            deaf_limit = agents[1].status()["classes"][0]["local_limit_bps"]
            deaf = windows_bps(tx2, cut + 1, cut + 5)
            st1 = agents[0].status()["classes"][0]
            h2.run("nft", "delete table inet drl43")
            time.sleep(3)
            killed_at = time.monotonic()
            agents[1].kill(signal.SIGKILL)
            safe_seen = set()
            while time.monotonic() < killed_at + 8:        # past its lease (5 s) and the watch
                safe_seen.add(agents[0].status()["classes"][0]["safe_rate_bps"])
                time.sleep(0.5)
            survivor = windows_bps(tx1, killed_at + 1, killed_at + 8)
    finally:
        for c in clients:
            c.stop()
    st = agents[0].status()
    print(f"measured: h1's local limit before {before / 1e6:.2f} Mbit/s; deaf h2 worst 1-s window {min(deaf) / 1e6:.2f} Mbit/s (h1 then: local "
          f"{st1['local_limit_bps'] / 1e6:.2f}); survivor h1 worst {min(survivor) / 1e6:.2f} Mbit/s "
          f"from 1 s after the kill, safe rates seen {sorted(safe_seen)}, peers {st['peers']}")
    # h2's one flow had ~1/7 of G before the cut: its limit goes straight to the safe rate,
    # and what it sends never falls below what it had (the bug: 0.1 Mbit/s for 2 s); a
    # cubic flow then climbs to the new limit at its own pace
    assert deaf_limit >= SAFE * 0.999, deaf_limit
    assert min(deaf) >= 0.85 * min(h2_before, SAFE), (h2_before, deaf)
    assert min(survivor) >= FLOOR, survivor
    assert safe_seen == {SAFE}, safe_seen
    assert [p["state"] for p in st["peers"]] == ["lost"], st["peers"]      # the lease went: lost, still in N
