"""Bytes the interface sent that drl's program never counted: traffic that bypasses the limit.

The program counts every packet it sees at tc egress (each class's passed bytes, and the
bypass counters: non-IP, no class, the agent's own exempt gossip), as wire bytes, GSO
segments' headers included (bpf/count.h), which is what a NIC's tx_bytes counts.  What
the interface sent beyond that over a window never met the program: a filter ahead of
ours, an AF_PACKET socket with PACKET_QDISC_BYPASS, XDP transmitting out of this
interface.  Packets the program passes that are dropped later (a qdisc) make the
difference negative, never a false alarm; veth counts a GSO skb without its segments'
headers, also on the safe side.
"""
from __future__ import annotations

from typing import Mapping

WINDOW_S = 1.0           # compare once a window, whatever the tick: one netlink request a second
TOLERANCE = 0.05         # of what the interface sent: counting done at slightly different moments
FLOOR_Bps = 12_500       # 100 kbit/s: below it, not worth a warning


class UnseenMeter:
    """Feed it the interface's tx byte counter and the program's counts once a window;
    ``bps`` is the last window's unseen rate (bits/s), ``on`` whether it was past the tolerance."""

    def __init__(self):
        self._last: tuple[float, int, int, dict] | None = None    # (time, ifindex, tx bytes, counts)
        self.bps = 0.0
        self.on = False

    def due(self, now: float) -> bool:
        return self._last is None or now - self._last[0] >= WINDOW_S

    def observe(self, now: float, ifindex: int, tx_bytes: int, counts: Mapping[object, int]) -> bool:
        """One sample (``counts``: cumulative counted bytes by counter, e.g. class id); True when ``on`` changed."""
        last, self._last = self._last, (now, ifindex, tx_bytes, dict(counts))
        if last is None or last[1] != ifindex or tx_bytes < last[2] or now <= last[0]:
            return False                     # a first sample, or a new interface's counter
        seen = sum(c - last[3].get(k, 0) if c >= last[3].get(k, 0) else c for k, c in counts.items())
        sent_Bps = (tx_bytes - last[2]) / (now - last[0])
        unseen_Bps = max(0.0, sent_Bps - seen / (now - last[0]))
        self.bps = unseen_Bps * 8
        was, self.on = self.on, unseen_Bps > max(FLOOR_Bps, TOLERANCE * sent_Bps)
        return was != self.on
