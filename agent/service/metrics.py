"""Prometheus metrics: ``drl-agent up --metrics HOST:PORT`` serves ``/metrics``.

    board = Board(timeout_s=1.0)                      # the daemon owns one
    server = MetricsServer(("127.0.0.1", 9470), board)   # MetricsError: one line (port in use ...)
    after a tick:  if board.wanted: board.publish(status)   # what `drlctl status --json` shows, made between ticks
    server.close()

Threads: the daemon loop is single-threaded and its state is never shared.
Scrapes run on prometheus_client's HTTP thread, so they read only a status
dict the loop published: a scrape asks (:meth:`Board.request`), the loop
starts the status after its next tick, makes it a slice at a time between
ticks (service/slices.py, status.py status_parts) and swaps in one new
immutable :class:`Published` (:meth:`Board.publish`), and never touches that
dict again.  Metrics and ``drlctl status`` therefore come from the same
function and never disagree, and an idle endpoint costs the loop nothing.

Units are Prometheus base units: bytes and bytes/s (the status's ``*_bps``
are bits/s and are divided by 8 here), seconds.  docs/metrics.md lists every
series.  :class:`TickStats` and :func:`drop_reason` are the daemon's own
bookkeeping for the status, kept whether or not metrics are served.
"""
from __future__ import annotations

import bisect
import errno
import importlib.metadata
import threading
import time
from dataclasses import dataclass
from typing import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from drl.agent.model import Decision, Mode
from drl.agent.gossip.peers import HostPort, format_addr
from drl.agent.gossip.wire import Reason

# Tick durations: a tick is ~0.1-10 ms for a few classes, the default interval 100 ms;
# the top buckets show ticks that eat the interval (overruns).
TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# Why the datapath dropped a packet.  bpf/limiter.c keeps one drop counter per
# class, so the reason is the class's policy in force while the drops happened:
# random drop (Mode.DROP, GRD), the volume quota ran out (dqmp), else the token
# bucket (the allocator's rate, the fail-safe rate or the slow-start floor).
DROP_REASONS = ("bucket", "random_drop", "quota")
# A class with a client rule (docs/clients.md) has counters of its own for these:
# "throttle" (a client over its share) and "ban" (egress and ingress).
CLIENT_DROP_REASONS = ("throttle", "ban")


class MetricsError(Exception):
    """The metrics endpoint cannot be served (port in use, address not local); one line."""


def drop_reason(d: Decision | None) -> str:
    """The reason counted for drops under decision ``d`` (None: the start-up bucket)."""
    if d is None:
        return "bucket"
    if d.mode == Mode.DROP:
        return "random_drop"
    if d.quota_bytes is not None and (d.mode == Mode.PASS or d.quota_bytes == 0):
        return "quota"     # a quota class with rate left only drops on its allowance
    return "bucket"


class DropTally:
    """One class's drops split by reason: each tick's new drops go to the reason of the
    decision that was in force since the previous tick."""

    def __init__(self) -> None:
        self.seen = (0, 0)      # dropped (bytes, packets) already attributed
        self.bytes = dict.fromkeys(DROP_REASONS, 0)
        self.packets = dict.fromkeys(DROP_REASONS, 0)

    def add(self, dropped_bytes: int, dropped_packets: int, reason: str) -> None:
        # a reset slot counts from 0 again: start over rather than count backwards
        new_b, new_p = dropped_bytes - self.seen[0], dropped_packets - self.seen[1]
        self.bytes[reason] += max(0, new_b)
        self.packets[reason] += max(0, new_p)
        self.seen = (dropped_bytes, dropped_packets)


class TickStats:
    """Tick durations as a cumulative histogram, overruns (ticks that ended after the next
    one was due: slow, or started late, so the schedule slipped) and lateness: how long after
    its due time a tick started (the loop held by something else: a control reply, a scrape)."""

    def __init__(self, buckets: tuple[float, ...] = TICK_BUCKETS_S) -> None:
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)     # the last one is +Inf
        self.sum_s = self.last_s = 0.0
        self.overruns = 0
        self.late_s = self.late_max_s = 0.0
        self.held_late = 0          # ticks held to the safe rate: a peer sent nothing too long (tick.py)
        self.late_peers = 0         # in the last tick

    def observe(self, duration_s: float, overran: bool, late_s: float = 0.0) -> None:
        self.counts[bisect.bisect_left(self.bounds, duration_s)] += 1
        self.sum_s += duration_s
        self.last_s = duration_s
        self.overruns += overran
        self.late_s = late_s
        self.late_max_s = max(self.late_max_s, late_s)

    def unsent(self, peers: int) -> bool:
        """A tick found ``peers`` peers without a datagram for too long; True when that starts."""
        started = peers > 0 and not self.late_peers
        self.held_late += peers > 0
        self.late_peers = peers
        return started

    def as_dict(self) -> dict:
        """For the status: ``buckets`` maps each upper bound (Prometheus ``le``) to the
        ticks that took at most that long."""
        total, cumulative = 0, {}
        for le, n in zip([*map(_le, self.bounds), "+Inf"], self.counts):
            total += n
            cumulative[le] = total
        return {"buckets": cumulative, "sum_s": self.sum_s, "count": total, "last_s": self.last_s,
                "overruns": self.overruns, "late_ms": self.late_s * 1000, "late_max_ms": self.late_max_s * 1000,
                "held_late": self.held_late}


def _le(bound: float) -> str:
    return repr(float(bound))


@dataclass(frozen=True)
class Published:
    status: dict        # Agent.status(); nobody changes it once published
    wall_time: float    # time.time() when published: a Prometheus timestamp


class Board:
    """Where the loop puts its status and scrapes read it (see the module docstring).

    A status costs about as much as a tick at 1,000 classes, so the loop makes
    one only when a scrape asks: :meth:`request` (scrape thread) raises
    ``wanted`` and waits up to ``timeout_s`` for the end of the next tick, whose
    loop calls :meth:`publish`.  A snapshot younger than ``max_age_s`` (the
    daemon's interval) is served as it is, so scrapes in a burst (several
    Prometheus servers, a curl loop) cost the loop one status, not one each.  A loop that does not tick in time
    (hung, or far behind) gets the last snapshot served, its age visible in
    ``drl_last_tick_timestamp_seconds``."""

    def __init__(self, timeout_s: float = 1.0, max_age_s: float = 0.0) -> None:
        self.timeout_s, self.max_age_s = timeout_s, max_age_s
        self.latest: Published | None = None
        self._fresh = threading.Condition()
        self._wanted = False
        self._published = 0     # how many snapshots so far: a waiter wants a newer one than it saw

    @property
    def wanted(self) -> bool:
        return self._wanted      # read without the lock: at worst one tick late

    def publish(self, status: dict) -> None:
        """The loop's side: ``status`` is never changed afterwards."""
        with self._fresh:
            self.latest = Published(status, time.time())
            self._published += 1
            self._wanted = False
            self._fresh.notify_all()

    def request(self) -> Published | None:
        """The scrape's side: the state at the end of the next tick, or the last one."""
        with self._fresh:
            if self.latest is not None and time.time() - self.latest.wall_time < self.max_age_s:
                return self.latest
            seen, self._wanted = self._published, True
            self._fresh.wait_for(lambda: self._published != seen, self.timeout_s)
            return self.latest


class Collector:
    """A prometheus_client collector over a :class:`Board`: reads one snapshot per scrape."""

    def __init__(self, board: Board, version: str | None = None):
        self.board = board
        self.version = version or _version()

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("drl_build_info", "drl's version; always 1", labels=["version"])
        info.add_metric([self.version], 1)
        yield info
        snap = self.board.request()
        if snap is None:    # before the first tick: nothing measured yet
            return
        yield from agent_metrics(snap)
        yield from class_metrics(snap.status["classes"])
        yield from peer_metrics(snap.status["peers"])
        yield from gossip_metrics(snap.status["gossip"])


def _version() -> str:
    try:
        return importlib.metadata.version("drl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def agent_metrics(snap: Published) -> Iterator[Metric]:
    st = snap.status
    tick = st["tick"]
    info = GaugeMetricFamily("drl_agent_info", "This agent's node id and interface; always 1",
                             labels=["node_id", "interface"])
    info.add_metric([st["node_id"], st["interface"]], 1)
    yield info
    yield GaugeMetricFamily("drl_last_tick_timestamp_seconds",
                            "Unix time of the tick whose state this scrape shows", value=snap.wall_time)
    yield GaugeMetricFamily("drl_tick_interval_seconds", "Configured tick interval (--interval)",
                            value=st["interval_s"])
    yield CounterMetricFamily("drl_ticks", "Ticks run since start", value=st["ticks"])
    yield HistogramMetricFamily("drl_tick_duration_seconds", "Time one tick took (read, allocate, write, gossip)",
                                buckets=list(tick["buckets"].items()), sum_value=tick["sum_s"])
    yield CounterMetricFamily("drl_tick_overruns", "Ticks that ended after the next one was due",
                              value=tick["overruns"])
    yield CounterMetricFamily("drl_tick_held_late", "Ticks held to the safe rate: some peer had no datagram "
                              "from this agent for longer than the stale rule allows", value=tick["held_late"])
    yield GaugeMetricFamily("drl_tick_late_seconds", "How long after its due time the last tick started",
                            value=tick["late_ms"] / 1000)
    errors = CounterMetricFamily("drl_tick_errors", "Exceptions caught where they happened, by class (empty for "
                                 "a datagram or a control request) and stage (the log's tick_error)",
                                 labels=["class", "stage"])
    for row in tick.get("errors_by", ()):
        errors.add_metric([row["class"], row["stage"]], row["count"])
    yield errors
    yield GaugeMetricFamily("drl_datapath_attached", "1 while the BPF filter is attached to the interface",
                            value=1 if st["datapath"]["state"] == "attached" else 0)
    yield CounterMetricFamily("drl_datapath_reattached", "Times the filter was found removed and attached again",
                              value=st["datapath"]["reattached"])
    yield GaugeMetricFamily("drl_peers_unseen", "Members never heard since this agent started (after the "
                            "liveness timeout): each keeps a share of every class", value=len(st.get("unseen_peers", ())))
    yield GaugeMetricFamily("drl_datapath_filters_ahead", "Priorities of other egress filters that run before "
                            "drl's: what they classify is not limited", value=len(st["datapath"].get("ahead", ())))
    yield CounterMetricFamily("drl_datapath_filter_reasserted", "Times drl's egress filter was added again ahead of "
                              "another tool's that ran before it", value=st["datapath"].get("reasserted", 0))
    yield GaugeMetricFamily("drl_datapath_unseen_bps", "Bits/s the interface sent that drl's program never counted, "
                            "over the last second: traffic that bypasses the limit", value=st["datapath"].get("unseen_bps", 0))
    yield CounterMetricFamily("drl_datapath_iface_recreated", "Times the interface was found deleted and made "
                              "again under its name, and the filter moved to it", value=st["datapath"].get("recreated", 0))
    if st["registry"] is not None:
        yield GaugeMetricFamily("drl_registry_up", "1 while etcd (--registry) answers, 0 while the agent runs "
                                "on the members and classes it last saw", value=int(st["registry"]["state"] == "reachable"))
        yield GaugeMetricFamily("drl_registry_members", "Agents registered in etcd, this one included",
                                value=len(st["registry"]["members"]))


# status key (bits/s) -> metric name (bytes/s), help
_CLASS_RATES = (
    ("global_limit_bps", "drl_class_global_limit_bytes_per_second", "The class's global limit in force"),
    ("effective_limit_bps", "drl_class_effective_limit_bytes_per_second",
     "Global limit less what stale peers may still pass: what the live agents share"),
    ("local_limit_bps", "drl_class_local_limit_bytes_per_second", "What this host may send now"),
    ("safe_rate_bps", "drl_class_safe_rate_bytes_per_second", "Fail-safe rate if the agent stops ticking"),
    ("demand_bps", "drl_class_demand_bytes_per_second", "Estimated local demand (EWMA of passed + dropped)"),
    ("rate_bps", "drl_class_sent_bytes_per_second", "EWMA of bytes passed"),
    ("max_flow_bps", "drl_class_max_flow_bytes_per_second", "Rate of the fastest sampled flow (EWMA)"),
)


def class_metrics(classes: list[dict]) -> Iterator[Metric]:
    lab = ["class"]
    rates = {key: GaugeMetricFamily(name, f"{doc} (bytes/s)", labels=lab) for key, name, doc in _CLASS_RATES}
    g = {"info": GaugeMetricFamily("drl_class_info", "A configured class and its allocator; always 1",
                                   labels=["class", "allocator"]),
         "mode": GaugeMetricFamily("drl_class_mode", "1 for the datapath mode in force (pass, bucket, drop)",
                                   labels=["class", "mode"]),
         "shadow": GaugeMetricFamily("drl_class_shadow", "1 when the class only counts what it would drop "
                                     "(shadow mode): its drops went out anyway", labels=lab),
         "drop_probability": GaugeMetricFamily("drl_class_drop_probability",
                                               "Random-drop probability (grd), 0-1", labels=lab),
         "limit_version": GaugeMetricFamily("drl_class_limit_version", "Version of the global limit in force",
                                            labels=lab),
         "flows": GaugeMetricFamily("drl_class_flows", "Flows in the flow table (sampled)", labels=lab),
         "budget": GaugeMetricFamily("drl_class_burst_budget_bytes", "Burst budget D: in any window of T >= 1 s "
                                     "all hosts together pass at most global limit x T + D", labels=lab),
         "quota": GaugeMetricFamily("drl_class_quota_remaining_bytes", "Volume quota left (quota classes only)",
                                    labels=lab),
         "lost": CounterMetricFamily("drl_class_gossip_values_lost", "This class's gossiped values lost, all peers",
                                     labels=lab),
         "clients": GaugeMetricFamily("drl_class_clients", "Clients of the class's client rule, by state "
                                      "(tracked: counted in the window; waiting: flagged, not yet adopted)",
                                      labels=["class", "state"])}
    c = {k: CounterMetricFamily(f"drl_{k}", doc, labels=lab) for k, doc in (
        ("passed_bytes", "L2 bytes that passed the limiter"), ("passed_packets", "Packets that passed the limiter"))}
    d = {k: CounterMetricFamily(f"drl_{k}", doc, labels=["class", "reason"]) for k, doc in (
        ("dropped_bytes", "L2 bytes the limiter dropped, by reason"),
        ("dropped_packets", "Packets the limiter dropped, by reason"))}
    for cl in classes:
        name = [cl["name"]]
        for key, fam in rates.items():
            fam.add_metric(name, cl[key] / 8)
        g["info"].add_metric([cl["name"], cl["allocator"]], 1)
        for mode in Mode:
            g["mode"].add_metric([cl["name"], mode.name.lower()], 1 if cl["mode"] == mode.name.lower() else 0)
        g["shadow"].add_metric(name, 1 if cl.get("shadow") else 0)
        g["drop_probability"].add_metric(name, cl["drop_probability"])
        g["limit_version"].add_metric(name, cl["limit_version"])
        g["flows"].add_metric(name, cl["flows"])
        g["budget"].add_metric(name, cl["burst_budget_bytes"])
        if cl["quota_bytes_left"] is not None:
            g["quota"].add_metric(name, cl["quota_bytes_left"])
        g["lost"].add_metric(name, cl["gossip_lost"])
        for key, fam in c.items():
            fam.add_metric(name, cl[key])
        for key, fam in d.items():
            for reason, n in cl[f"{key}_by_reason"].items():
                fam.add_metric([cl["name"], reason], n)
        if cl["clients"] is not None:
            for state in ("tracked", "throttled", "banned", "waiting"):
                g["clients"].add_metric([cl["name"], state], cl["clients"][state])
    yield from rates.values()
    yield from g.values()
    yield from c.values()
    yield from d.values()


def peer_metrics(peers: list[dict]) -> Iterator[Metric]:
    lab = ["peer", "address"]
    up = GaugeMetricFamily("drl_peer_up", "1 while the peer is alive, 0 when stale or lost", labels=lab)
    seen = GaugeMetricFamily("drl_peer_last_seen_seconds",
                             "Seconds since the peer's last accepted datagram, at the last tick "
                             "(absent until first heard)", labels=lab)
    lost = CounterMetricFamily("drl_peer_lost_datagrams", "Datagrams from the peer lost (sequence gaps)", labels=lab)
    for p in peers:
        key = [p["node_id"], p["address"]]
        up.add_metric(key, 1 if p["state"] == "alive" else 0)
        if p["last_seen_s"] is not None:
            seen.add_metric(key, p["last_seen_s"])
        lost.add_metric(key, p["lost"])
    yield from (up, seen, lost)


def gossip_metrics(g: dict) -> Iterator[Metric]:
    for key, name, doc in (("sent", "drl_gossip_sent_datagrams", "Gossip datagrams sent"),
                           ("received", "drl_gossip_received_datagrams", "Gossip datagrams accepted"),
                           ("bytes_sent", "drl_gossip_sent_bytes", "Gossip UDP payload bytes sent"),
                           ("bytes_received", "drl_gossip_received_bytes", "Accepted gossip UDP payload bytes"),
                           ("lost", "drl_gossip_lost_datagrams", "Datagrams lost on the way (sequence gaps)"),
                           ("unroutable", "drl_gossip_unroutable_messages",
                            "Point-to-point messages to a peer not heard from yet"),
                           ("send_errors", "drl_gossip_send_errors", "sendto() failures")):
        yield CounterMetricFamily(name, doc, value=g[key])
    rejected = CounterMetricFamily("drl_gossip_rejected_datagrams", "Datagrams dropped, by reason",
                                   labels=["reason"])
    for reason in Reason:      # every reason from the start: a series appearing late breaks rate()
        rejected.add_metric([reason.value], g["rejected_by_reason"].get(reason.value, 0))
    yield rejected
    yield GaugeMetricFamily("drl_gossip_control_bytes_per_second",
                            "Gossip sent over the last 10 s, IP and UDP headers included (bytes/s)",
                            value=g["control_bps"] / 8)


class MetricsServer:
    """``/metrics`` on ``address`` in a thread of its own, for the agent's lifetime."""

    def __init__(self, address: HostPort, board: Board):
        self.registry = CollectorRegistry()
        self.registry.register(Collector(board))
        self.registry.register(ProcessCollector(registry=None))    # process_cpu_seconds_total, RSS, fds ...
        try:
            self.server, self.thread = start_http_server(address[1], address[0], registry=self.registry)
        except OSError as e:
            why = {errno.EADDRINUSE: "port already in use",
                   errno.EADDRNOTAVAIL: "address is not on this host"}.get(e.errno, e.strerror or str(e))
            raise MetricsError(f"cannot serve metrics on {format_addr(address)}: {why}") from None
        self.address = self.server.server_address[:2]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
