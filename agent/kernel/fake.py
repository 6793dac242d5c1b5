"""An in-memory datapath (the interface of ``kernel.interface``) and shaper, for runs without a kernel.

    dp = FakeDatapath()
    agent = Agent(cfg, transport=MemoryTransport, datapath=lambda cfg, gossip_port: dp)
    dp.send(1500)          # 1500 bytes passed the limiter, as one flow of class 0
    dp.bypass_send(1500)   # 1500 bytes left outside every class
    dp.classes[0]          # (mode, settings) the agent last wrote

Tests and tools that run the daemon without root use it; the counters are the
test's to advance.  Client rules' methods are absent: a test that needs them
adds its own.
"""
from __future__ import annotations

import contextlib

from drl.agent.kernel.datapath import Counters, FlowKey, FlowSample, now_ns
from drl.agent.kernel.shaper import handle
from drl.agent.model import Mode

CLASS_ID = 0                      # the datapath slot of the first class


class FakeDatapath:
    """What the daemon uses of kernel.datapath.Datapath, in memory."""

    def __init__(self):
        self.counters = Counters()
        self.bypass = Counters()          # traffic of no class (bpf/count.h bypass_counters)
        self.flows: list[FlowSample] = []
        self.classes: dict[int, tuple[Mode, dict]] = {}
        self.rules: list = []
        self.resets: list[int] = []
        self.attached = self.closed = False
        self.sample_probability = None
        self.writes = self.heartbeats = 0

    def attach(self):
        self.attached = True

    def ensure_attached(self):
        return False

    @property
    def attachment(self):
        return {"state": "attached" if self.attached else "detached", "reattached": 0, "error": None, "ahead": [],
                "unseen_bps": 0, "unseen": False}

    def close(self, detach=True):
        self.closed = True
        self.attached = self.attached and not detach

    def set_sample_probability(self, p):
        self.sample_probability = p

    def set_class(self, class_id, mode, **settings):
        self.classes[class_id] = (mode, settings)
        self.writes += 1

    def heartbeat(self):
        self.heartbeats += 1

    def set_rules(self, rules):
        self.rules = list(rules)

    @contextlib.contextmanager
    def batch(self):
        yield self

    def reset_class(self, class_id):
        self.resets.append(class_id)
        self.classes.pop(class_id, None)

    def read_counters(self, class_ids=(CLASS_ID,)):
        return {i: self.counters if i == CLASS_ID else Counters() for i in class_ids}

    def read_flows(self, full=False):
        return {CLASS_ID: list(self.flows)}

    def read_bypass(self):
        return self.bypass

    def bypass_send(self, nbytes: int) -> None:
        """``nbytes`` left the interface in one packet no class matched."""
        b = self.bypass
        self.bypass = b._replace(passed_bytes=b.passed_bytes + nbytes, passed_packets=b.passed_packets + 1)

    def send(self, nbytes: int) -> None:
        """``nbytes`` passed the limiter, as one flow."""
        c = self.counters
        self.counters = c._replace(passed_bytes=c.passed_bytes + nbytes, passed_packets=c.passed_packets + 1)
        key = FlowKey(4, 6, "10.0.0.1", "10.0.0.9", 40000, 80)
        first = self.flows[0].first_ns if self.flows else now_ns()
        self.flows = [FlowSample(key, CLASS_ID, self.counters.passed_bytes, self.counters.passed_packets,
                                 first, now_ns())]


class FakeShaper:
    """Shape mode's HTB tree in memory (what the daemon uses of kernel.shaper.Shaper): a test's
    shaped class (the default where a class matches all traffic) puts no HTB on the host."""

    def __init__(self, cfg=None):
        self.rates: dict[int, float] = {}
        self.bursts: dict[int, int | None] = {}
        self.closed = False

    def set_rate(self, class_id, limit_Bps, burst_bytes=None):
        self.rates[class_id] = limit_Bps
        self.bursts[class_id] = burst_bytes
        return handle(class_id)

    def discard(self, class_id):
        self.rates.pop(class_id, None)

    def retain(self, class_ids):
        self.rates = {k: v for k, v in self.rates.items() if k in set(class_ids)}

    def ensure_attached(self):
        return False

    def close(self, detach=True):
        self.closed = True
