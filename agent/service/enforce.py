"""Enforcement: the one writer of a class's kernel config (bucket, drop, safe rate, HTB class).

    enforce = Enforcer(dp, shaper, book, failsafe_s=2.0)
    enforce.start(conf, class_id, n_nodes)      # a new class: policed at 1/N from its first packet
    enforce.decision(run, decision, safe_Bps, n_nodes)   # a tick's decision, written if it changed
    enforce.fall_back(run, n_nodes)             # a class whose step failed: its safe rate
    enforce.free(class_id)                      # a removed class's slot, once no rule points at it

Every write goes through here, so what the datapath holds for a class is always one of
three things: the start-up share, the last decision, or the safe rate; ``run.written``
remembers which config is in the map so that an unchanged one is not written again (the
tick's heartbeat keeps it fresh).  The depth is this host's share of the class's burst
budget (agent/burst.py): the hosts' buckets together never hold more than D.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from drl.agent.cluster.limits import LimitBook
from drl.agent.kernel.interface import DatapathPort, ShaperPort
from drl.agent.model import Decision, Mode
from drl.agent.service.rates import host_burst, safe_rate

if TYPE_CHECKING:
    from drl.agent.config.build import ClassConf
    from drl.agent.service.class_table import ClassRun


class Enforcer:
    def __init__(self, dp: DatapathPort, shaper: ShaperPort, book: LimitBook, *, failsafe_s: float):
        self.dp, self.shaper, self.book, self.failsafe_s = dp, shaper, book, failsafe_s

    def start(self, conf: "ClassConf", class_id: int, n_nodes: int) -> None:
        """A new class's slot, reset and policed at the static 1/N share until its allocator's
        first tick (a shadow class only counts, from its first packet too)."""
        limit = self.book.get(conf.name)
        rate_Bps = limit.global_Bps / n_nodes
        self.dp.reset_class(class_id)
        self.dp.set_class(class_id, Mode.BUCKET, rate_Bps=rate_Bps, shadow=conf.shadow,
                          burst_bytes=host_burst(conf, limit, n_nodes, rate_Bps, "police"))

    def free(self, class_id: int) -> None:
        self.dp.reset_class(class_id)

    def decision(self, run: "ClassRun", d: Decision, safe_Bps: float, n_nodes: int) -> None:
        """Shape mode queues a bucket's rate in HTB (agent/kernel/shaper.py); shadow wins
        (nothing is shaped, would-be drops are counted), and a decision of PASS or DROP polices."""
        limit, prio = self.book.get(run.name), 0
        burst = host_burst(run.conf, limit, n_nodes, d.limit_Bps)
        if run.conf.shaped and d.mode == Mode.BUCKET:
            prio = self.shaper.set_rate(run.class_id, d.limit_Bps, burst)     # 0: it failed (logged): police
        else:
            self.shaper.discard(run.class_id)
        if not prio:
            burst = host_burst(run.conf, limit, n_nodes, d.limit_Bps, "police")
        safe_burst = host_burst(run.conf, limit, n_nodes, safe_Bps, "police")     # the fail-safe polices
        # a quota is written every time: every write of one starts a new allowance
        config = (d.mode, d.limit_Bps, burst, d.drop_probability, safe_Bps, safe_burst, self.failsafe_s,
                  run.conf.shadow, prio)
        if config == run.written and d.quota_bytes is None:
            return
        run.written = config
        self.dp.set_class(run.class_id, d.mode, rate_Bps=d.limit_Bps, burst_bytes=burst,
                          drop_probability=d.drop_probability, safe_rate_Bps=safe_Bps,
                          timeout_s=self.failsafe_s, quota_bytes=d.quota_bytes, shadow=run.conf.shadow,
                          shape_prio=prio, safe_burst_bytes=safe_burst)

    def fall_back(self, run: "ClassRun", n_nodes: int) -> None:
        """A class whose step failed is held to its safe rate.  If even that write fails (it
        raises), the class keeps the config last written (set_class is all or nothing), and
        the kernel falls back to that config's safe rate by itself should the agent stop ticking."""
        run.written = None          # whatever decision() noted may not be what the map holds
        limit = self.book.get(run.name)
        safe_Bps = safe_rate(run.conf, limit, n_nodes)
        burst = host_burst(run.conf, limit, n_nodes, safe_Bps, "police")
        self.dp.set_class(run.class_id, Mode.BUCKET, rate_Bps=safe_Bps, burst_bytes=burst,
                          safe_rate_Bps=safe_Bps, safe_burst_bytes=burst, timeout_s=self.failsafe_s,
                          shadow=run.conf.shadow)
        self.shaper.discard(run.class_id)
