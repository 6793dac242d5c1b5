"""The agent's tick loop: kernel maps -> estimator -> allocators -> maps + gossip.

    run(build_config(opts))      # what `drl-agent up` does; returns the exit code

Every ``interval_s`` one tick reads every class's counters and the flow table,
estimates each class's demand (agent/estimator.py), hands each class's
Snapshot to its pure allocator and writes the Decision to the kernel, then
gossips all classes' published values together (agent/gossip/core.py batches
them) and sends the allocators' point-to-point messages.  Between ticks the
loop waits on the gossip socket (datagrams are validated and handed to
membership as they arrive, so liveness is exact and the socket buffer never
fills), the control socket (drlctl, drl-agent down/reload) and the signal
pipe (SIGTERM/SIGINT stop, SIGHUP reloads the config file).

Classes live in a :class:`~drl.agent.service.class_table.ClassTable`; their global
limits and versions in a :class:`~drl.agent.cluster.limits.LimitBook`: a ``drlctl set`` or a
changed config file makes a new version, which gossip announces to every
peer, and a peer still on an older version is told the newer one.

Every tick writes the class configs that changed and stamps the datapath's
heartbeat with the kernel clock: if this process stops ticking (hung, killed
-9) the datapath falls back to the safe rate after ``failsafe_s``
(bpf/limiter.c stale).  Startup acquires the sockets
before it attaches, and every exit path detaches: nothing stays on the
interface after an error.  Logs are one line per state change (start, peer
alive/stale, mode, allocator warnings, limit changes, reloads, stop), as
logfmt or JSON (agent/logs.py; docs/logs.md lists the events).

The agent holds the pieces; each concern is its own module beside this one:
the control commands (``commands``), the status tree (``status``), etcd's
members and classes (``registry_sync``), limits between peers
(``limit_gossip``), drops by reason (``drops``), the change log lines
(``change_log``), signals (``signals``) and what a host may send (``rates``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import selectors
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable

from drl.agent import logs
from drl.agent.cluster.limits import LimitBook, LimitBookError
from drl.agent.cluster.registry import RegistryError
from drl.agent.config.build import ClassConf, Config, ConfigError
from drl.agent.gossip.core import CLUSTER, Outgoing, new_incarnation
from drl.agent.gossip.interface import TransportPort
from drl.agent.gossip.membership import Membership
from drl.agent.gossip.transport import Standalone, TransportError, UdpTransport
from drl.agent.gossip.tree import SumTree, tree_wanted
from drl.agent.gossip.wire import Batch, ClientReports, Sums
from drl.agent.kernel import rtnetlink
from drl.agent.kernel.datapath import Counters, Datapath, DatapathError, now_ns
from drl.agent.kernel.interface import DatapathPort, ShaperPort
from drl.agent.kernel.shaper import Shaper
from drl.agent.model import SLOW_START_Bps, Decision, Mode, Snapshot, heard_cap
from drl.agent.service import commands
from drl.agent.service.change_log import ChangeLog
from drl.agent.service.class_table import Changes, ClassRun, ClassTable, StateFileError
from drl.agent.service.client_rules import ClientRules
from drl.agent.service.control import ControlError, ControlServer
from drl.agent.service.drops import Drops
from drl.agent.service.limit_gossip import LimitGossip
from drl.agent.service.metrics import Board, MetricsError, MetricsServer, TickStats
from drl.agent.service.notify import Notifier
from drl.agent.service.rates import host_burst, local_limit, safe_rate, slack_s
from drl.agent.service.registry_sync import RegistrySync
from drl.agent.service.tick_errors import TickErrors
from drl.agent.service.unmatched import Unmatched, gossip_wire_bytes
from drl.agent.service.signals import watch_signals
from drl.agent.service.status import agent_status, listen
from drl.agent.units import to_bps

# What other code imports from here; CLUSTER is gossip.core's, the cluster id the agent gossips under.
__all__ = ["CLUSTER", "Agent", "StartupError", "run", "udp_transport", "kernel_datapath", "kernel_shaper"]

log = logs.get_logger("drl.agent")


GC_YOUNG_THRESHOLD = 20_000     # allocations between young collections (Python's default: 700)


class StartupError(Exception):
    """A resource could not be acquired; one line, nothing attached."""


class _Enforcing(Exception):
    """A class's write failed (its __cause__): the tick counts it as stage ``enforce``."""


def run(config: Config) -> int:
    """Run the agent until SIGTERM/SIGINT or `drl-agent down`; the process exit code."""
    logs.setup(config.log_format)
    # Until the loop runs, SIGTERM unwinds like Ctrl-C, so whatever startup attached is detached.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        agent = Agent(config)
    except StartupError as e:
        log.error("startup_failed", error=str(e))
        return 1
    except KeyboardInterrupt:      # a stop asked for (systemctl stop, Ctrl-C) is a clean stop
        log.info("stopped_during_startup")
        return 0
    with agent:
        _tune_gc()
        return agent.serve()


def _tune_gc() -> None:
    """A tick at 1,000 classes allocates ~15,000 short-lived objects over a heap of
    long-lived per-class state; with the default thresholds (700, 10, 10) the collector
    ran ~57 times a second and took 10 % of a core (gc.callbacks timing the collections
    of the measured agent of bench/agent_cost.py: 2.5 s of 25; 0.04 s after this).  The
    loop makes few reference cycles, so collect the young generation 30x less often, and
    freeze what startup made (bcc, the program, every class) out of the full collections,
    after collecting startup's own garbage so that none of it is frozen for good."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


def udp_transport(cfg: Config) -> UdpTransport | Standalone:
    """The gossip transport the agent runs with: UDP on ``--listen``, or none without peers."""
    if cfg.standalone:
        return Standalone()
    return UdpTransport.bind(cfg.listen, [p.addr for p in cfg.peers], mark=cfg.gossip_mark, node_id=cfg.node_id,
                             cluster=CLUSTER,
                             key=cfg.key, branching=cfg.branching, incarnation=new_incarnation(),
                             names={p.addr: p.node_id for p in cfg.peers if p.node_id}, timeout_s=cfg.peer_timeout_s)


def kernel_datapath(cfg: Config, gossip_port: int | None) -> Datapath:
    """The datapath the agent runs with, on ``--iface``; our own gossip (from the port, with
    the mark) and registry connections (to etcd's port, with the mark) are never policed;
    ``exclusive``: one agent per interface (agent/kernel/lock.py)."""
    return Datapath(cfg.iface, max_flows=cfg.max_flows, max_classes=cfg.max_classes, max_clients=cfg.max_clients,
                    gossip_port=gossip_port, gossip_mark=cfg.gossip_mark,
                    registry_port=cfg.registry.endpoints[0][1] if cfg.registry else None, exclusive=True)


def kernel_shaper(cfg: Config) -> Shaper:
    """Shape mode's HTB tree on ``--iface`` (agent/kernel/shaper.py); it touches nothing until a class
    is shaped, and restores the root qdisc it replaced when the last one goes.  An agent that
    shapes nothing puts back at once what a killed shape agent's HTB replaced: nothing else
    would (an operator who turned shape mode off after the crash kept the HTB for good)."""
    shaper = Shaper(cfg.iface, state_dir=cfg.state_dir)
    if not any(c.shaped for c in cfg.classes):
        shaper.restore_leftover()
    return shaper


class Agent:
    """The agent's state and tick.  ``transport(config)``, ``datapath(config, gossip_port)`` and
    ``shaper(config)`` build its resources (gossip.interface.TransportPort,
    kernel.interface.DatapathPort and ShaperPort); tests pass the in-memory ones
    (gossip.memory, kernel.fake)."""

    def __init__(self, config: Config, transport: Callable[[Config], TransportPort] = udp_transport,
                 datapath: Callable[[Config, int | None], DatapathPort] = kernel_datapath,
                 shaper: Callable[[Config], ShaperPort] = kernel_shaper):
        self.cfg = config
        self._stack = contextlib.ExitStack()
        self._make_shaper = shaper
        # A failure (a DatapathError in serve, any other exception out of `with agent`) is not
        # a stop: detached, this host's classes would pass everything.  Left attached, the
        # kernel enforces each class's safe rate once its config goes stale, and the peers
        # count this host as a killed one: silent (its lease expiring, with a registry), at
        # what its datapath may still pass (README "Faults").  systemd restarts us.
        self.failed = False
        try:
            self._acquire(transport, datapath)
        except (ControlError, TransportError, MetricsError, DatapathError, StateFileError, LimitBookError,
                RegistryError, ConfigError, ValueError) as e:
            self._stack.close()
            raise StartupError(str(e)) from None
        except BaseException:
            self._stack.close()
            raise
        self.stopping = False
        self.started = time.monotonic()
        self.ticks = 0
        self.notify = Notifier.from_env()    # systemd Type=notify (agent/service/notify.py); a no-op without NOTIFY_SOCKET
        self._stack.callback(self.notify.close)
        self.changes = ChangeLog()
        self.tick_stats = TickStats()
        self.errors = TickErrors()
        self.drops = Drops()
        self.unmatched = Unmatched(self.cfg.iface)

    def _acquire(self, transport: Callable[[Config], Any], datapath: Callable[[Config, int | None], Any]) -> None:
        """Sockets, state and BPF, in the order that leaves nothing attached if one fails."""
        cfg = self.cfg
        self.control = ControlServer(cfg.socket_path)
        self._stack.callback(self.control.close)
        self.transport = transport(cfg)
        self._stack.callback(self.transport.close)
        # a scrape (metrics thread) waits at most a few intervals for the next tick's status
        # a snapshot at most one interval old: an older one would shift Prometheus's samples by
        # up to its age (a CI run's rate over 10 s read 0.90 of iperf3's with a 1 s limit)
        self.board = Board(timeout_s=min(5.0, max(1.0, 2 * cfg.interval_s)), max_age_s=cfg.interval_s)
        if cfg.metrics is not None:
            self._stack.callback(MetricsServer(cfg.metrics, self.board).close)
        names = {self.transport.resolved[p.addr]: p.node_id for p in cfg.peers if p.node_id}
        self.members = Membership(cfg.node_id, self.transport.peer_addrs, cfg.peer_timeout_s, names=names,
                                  failsafe_s=cfg.failsafe_s, slack_s=slack_s(cfg, len(cfg.peers)))
        self.sync = RegistrySync(cfg, self.transport, self.members)
        self.tree = SumTree(cfg.node_id, cfg.interval_s, self.members.timeout_s)
        self.tree_on = False        # this tick's: tree_wanted (the peers and the classes may change)
        if cfg.registry is not None:
            self._stack.callback(self._leave_registry)    # runs after the datapath's close: we leave last
            self.cfg = cfg = dataclasses.replace(cfg, classes=self.sync.start())
        self.book = LimitBook(Path(cfg.state_dir) / f"limits-{cfg.node_id}.json")
        self.dp = datapath(cfg, self.transport.address[1] if self.transport.address else None)
        self._stack.callback(self._close, self.dp)
        self.shaper = self._make_shaper(cfg)
        self._stack.callback(self._close, self.shaper)     # before dp's: the root qdisc comes back first
        self.table = ClassTable(self.dp, self.book, node_id=cfg.node_id, state_dir=cfg.state_dir,
                                max_classes=cfg.max_classes, founders=self.registry and self.registry.founders)
        if (core := getattr(self.transport, "core", None)) is not None:    # peers' negative values: per class
            core.signed = self.table.signed
        self.table.apply(cfg.classes, self._member_ids(), self.members.n_nodes)
        self.clients = ClientRules(self.dp, cfg.node_id)
        self.clients.apply(self.table, time.monotonic(), self.members.timeout_s, self.members.n_nodes)
        self.limits = LimitGossip(self.book, self.table, self.transport)
        for run in self.table:      # peers whose file says otherwise, or who missed a change, learn ours
            self.limits.announce(run)
        self.dp.set_sample_probability(cfg.sample_probability)
        self.dp.attach()

    @property
    def registry(self):
        """etcd (cluster.registry.Registry) with --registry, else None."""
        return self.sync.registry

    def _close(self, kernel_side) -> None:
        """The datapath or the shaper: detached at a stop, left enforcing after a failure."""
        kernel_side.close(detach=not self.failed)

    def _leave_registry(self) -> None:
        """At a stop we leave; after a failure our lease expires, as a killed agent's does."""
        self.sync.close(leave=not self.failed)

    def _member_ids(self) -> tuple[str, ...]:
        return self.members.view(0, time.monotonic()).members

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is not None and issubclass(kind, Exception):
            self.failed = True      # a bug (logs.py logs it as `crashed` after this), not a stop
        try:
            self._stack.close()
            log.info("stopped", iface=self.cfg.iface, detached=not self.failed)
        except DatapathError as e:
            log.error("stop_failed", iface=self.cfg.iface, error=str(e))

    # -- the loop ---------------------------------------------------------------------------

    def serve(self) -> int:
        cfg = self.cfg
        self._log_started()
        sel, wakeup = self._selector()
        next_tick = time.monotonic()
        try:
            while not self.stopping:
                now = time.monotonic()
                if now >= next_tick:
                    self._tick_and_report(now, next_tick)
                    # a late tick is not made up: the next one is a whole interval away
                    next_tick = max(next_tick + cfg.interval_s, now + cfg.interval_s / 2)
                for key, _ in sel.select(max(0.0, next_tick - time.monotonic())):
                    key.data()
        except DatapathError as e:
            self.failed = True
            log.error("datapath_error", error=str(e))
            return 1
        finally:
            self.notify.stopping()
            sel.close()
            wakeup.close()
        return 0

    def _log_started(self) -> None:
        cfg = self.cfg
        first = next(iter(self.table))
        log.info("started", node=cfg.node_id, iface=cfg.iface, classes=len(self.table),
                 allocator=first.conf.allocator.name, global_bps=round(to_bps(self.book.get(first.name).global_Bps)),
                 peers=self.members.n_nodes - 1, listen=listen(self.transport.address),
                 interval_ms=round(cfg.interval_s * 1000, 3), auth="hmac-sha256" if cfg.key else "none")
        if cfg.standalone:
            log.info("standalone", gossip="off", reason="no_peers")
        defaulted = [run.conf for run in self.table if run.conf.policed_by_default]
        if defaulted:       # the default shapes; say why these are policed (config/build.py default_police_reason)
            log.info("enforce_default_police", classes=len(defaulted), reason=defaulted[0].policed_by_default)

    def _tick_and_report(self, now: float, due: float) -> None:
        """One tick of the loop, and what watches it: systemd, the tick statistics, a scrape."""
        self._follow_registry()
        self.tick(now)
        self._notify_progress()
        done = time.monotonic()
        self.tick_stats.observe(done - now, overran=done > due + self.cfg.interval_s)
        if self.board.wanted:     # a scrape waits for this tick's state (agent/service/metrics.py)
            self.board.publish(self.status())

    def _notify_progress(self) -> None:
        """systemd: READY=1 after the first tick (the filter is attached and the loop runs);
        watchdog beats only from completed ticks, so a loop stuck anywhere stops them."""
        if self.ticks == 1:
            self.notify.ready()
        self.notify.watchdog(time.monotonic())

    def _selector(self) -> tuple[selectors.BaseSelector, socket.socket]:
        """Datagrams, control requests and signals, each handled as it arrives."""
        sel = selectors.DefaultSelector()
        if self.transport.sock is not None:
            sel.register(self.transport.sock, selectors.EVENT_READ, self.receive)
        sel.register(self.control, selectors.EVENT_READ, self._serve_control)
        try:
            links = rtnetlink.link_events()
        except OSError as e:     # then the tick's check alone finds an interface made again
            log.warning("link_events_unavailable", error=e.strerror)
        else:
            self._stack.callback(links.close)
            sel.register(links, selectors.EVENT_READ, lambda: self._link_changed(links))
        return sel, watch_signals(sel, self._stack, stop=self._stop, reload=self._reload_notified)

    def _link_changed(self, links: socket.socket) -> None:
        """An interface was made, changed or deleted: is our filter (and HTB root) still there?
        An interface deleted and made again under our name is attached to within milliseconds
        of its making, before whoever makes it has added its addresses and routes, instead of
        at the next tick, up to an interval during which it passes everything unpoliced."""
        if rtnetlink.drain(links):
            self.dp.ensure_attached()
            self.shaper.ensure_attached()

    def _stop(self) -> None:
        self.stopping = True

    def receive(self) -> None:
        """Hand every datagram that arrived to membership, point-to-point ones to their
        class's inbox, and the limits in Batches to the limit book."""
        now = time.monotonic()
        for rx in self.transport.poll(now):
            try:
                self.members.observe(rx, now)
                if isinstance(rx.payload, Batch):
                    self.limits.heard(rx)
                elif isinstance(rx.payload, Sums):
                    self.tree.receive(rx.header.node, rx.payload, now)
                elif isinstance(rx.payload, ClientReports):
                    self.clients.receive(rx.header.node, rx.payload, now)
                elif (run := self.table.by_key(rx.header.class_id)) is not None:
                    run.inbox.append(rx.envelope)
            except Exception as e:          # one datagram's failure is that datagram's
                self.errors.record("receive", e, now, peer=rx.header.node)

    # -- control (service/commands.py) --------------------------------------------------------

    def commands(self) -> dict[str, Callable[[dict], dict]]:
        """The control socket's commands by name, each a request dict -> a reply dict."""
        handlers = {"status": lambda req: {"ok": True, "status": self.status()},
                    "down": self._down, "set": self.set_limit,
                    "reload": lambda req: self._reload_notified(),
                    "clients": lambda req: commands.list_clients(req, self.table, self.clients, time.monotonic()),
                    "unban": lambda req: commands.unban(req, self.table, self.clients, time.monotonic())}
        return {cmd: functools.partial(self._counted, cmd, handler) for cmd, handler in handlers.items()}

    def _counted(self, cmd: str, handler: Callable[[dict], dict], req: dict) -> dict:
        """A control request's exception is counted with the tick's (stage control), then
        answered as an error reply by control.answer, which logs control_failed."""
        try:
            return handler(req)
        except Exception as e:
            self.errors.record("control", e, time.monotonic(), cmd=cmd)
            raise

    def _serve_control(self) -> None:
        self.control.handle_one(self.commands())

    def _down(self, req: dict) -> dict:
        log.info("down_requested")
        self.stopping = True
        return {"ok": True}

    def set_limit(self, req: dict) -> dict:
        """drlctl set CLASS --global RATE (commands.set_limit)."""
        return commands.set_limit(req, self.table, self.book, self.limits, self.sync, self.members.n_nodes - 1)

    def reload(self) -> dict:
        """Re-read the config file (commands.reload); a bad file changes nothing."""
        return commands.reload(self.cfg, self.sync, self._apply_classes, self.table)

    def _reload_notified(self) -> dict:
        """reload() between RELOADING=1 and READY=1: `systemctl reload` waits for it to end."""
        self.notify.reloading()
        try:
            return self.reload()
        finally:
            self.notify.ready()

    def _apply_classes(self, confs: tuple[ClassConf, ...]) -> Changes:
        """Make ``confs`` the classes in force (a reload, or the registry's); raises like
        ClassTable.apply, having changed nothing."""
        # parsing a big file took a while already (20,000 classes: ~1 s of the ~2 s a reload
        # takes): the classes in force stay fresh, so the kernel's fail-safe does not take over
        self.dp.heartbeat()
        changes = self.table.apply(confs, self._member_ids(), self.members.n_nodes)
        self.clients.apply(self.table, time.monotonic(), self.members.timeout_s, self.members.n_nodes)
        announced = {*changes.changed, *changes.added}      # a set: 20,000 classes in a tuple is 2e8 compares
        for run in self.table:
            if run.name in announced:
                self.limits.announce(run)
        self.cfg = dataclasses.replace(self.cfg, classes=confs)
        self.drops.retain(self.table)
        self.unmatched.retain(self.table)
        self.shaper.retain([run.class_id for run in self.table])    # removed classes' HTB classes go
        return changes

    def _follow_registry(self) -> None:
        """What changed in etcd since the last tick (registry_sync.py); none without --registry."""
        self.sync.follow(self._apply_classes, self.book)

    def status(self) -> dict:
        """drlctl status --json (status.py agent_status)."""
        return agent_status(self, time.monotonic())

    # -- the tick ---------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self.dp.ensure_attached()      # our filter removed or replaced behind our back: attach again
        self.shaper.ensure_attached()  # the same for shape mode's HTB root (no-op without shaped classes)
        runs = list(self.table)
        counters = self.dp.read_counters([run.class_id for run in runs])
        flows = self.dp.read_flows()
        kernel_now = now_ns()
        out = {}
        with self.dp.batch():
            for run in runs:
                try:
                    out[run.conf.key] = self._step(run, now, counters[run.class_id], flows.get(run.class_id, []),
                                                   kernel_now)
                except Exception as e:      # one class's failure is that class's: the others go on
                    stage, e = ("enforce", e.__cause__) if isinstance(e, _Enforcing) else ("allocate", e)
                    self.errors.record(stage, e, now, class_=run.name)
                    self._fall_back(run)
        self.dp.heartbeat()     # every config stays fresh, the ones _enforce did not write again too
        self.unmatched.observe(now, runs, counters, self.dp.read_bypass(), gossip_wire_bytes(self.transport.stats))
        self.transport.publish(out, now)
        try:
            self._sum_round(out, now)
        except Exception as e:      # the classes read per-peer gossip's sums instead (tree_on)
            self.tree_on = False
            self.errors.record("sum_tree", e, now)
        if self.clients:
            n_hosts = 1 + self.members.view(0, now).n_alive      # the hosts whose reports count
            reports = self.clients.tick(now, n_hosts, self.members.timeout_s)
            if reports:
                self.transport.report_clients(reports, now)
        self.changes.log(now, self.transport.stats.rejected, self.members.status(now), self.table)
        self.ticks += 1

    def _sum_round(self, out: dict[int, Outgoing], now: float) -> None:
        """The sum tree's messages (agent/gossip/tree.py), when per-peer gossip is slower than one
        interval and some class's allocator reads only the sum of its peers' values."""
        summed = {key: o.value for key, o in out.items() if self.table.reads_sum(key)}
        self.tree_on = tree_wanted(len(self.transport.peer_addrs), self.cfg.branching, bool(summed))
        if self.tree_on:
            self.tree.timeout_s = self.members.timeout_s
            for node, sums in self.tree.round(self.members.view(0, now).members, summed, now, self.transport.knows):
                self.transport.send_sums(node, sums, now)

    def _fall_back(self, run: ClassRun) -> None:
        """A class whose step failed is held to its safe rate, and says nothing this round.  If
        even that write fails, the class keeps the config last written (set_class is all or
        nothing), and the kernel falls back to that config's safe rate by itself should the
        agent stop ticking."""
        run.written = None          # whatever _enforce noted may not be what the map holds
        try:
            limit, n_nodes = self.book.get(run.name), self.members.n_nodes
            safe_Bps = safe_rate(run.conf, limit, n_nodes)
            burst = host_burst(run.conf, limit, n_nodes, safe_Bps, "police")
            self.dp.set_class(run.class_id, Mode.BUCKET, rate_Bps=safe_Bps, burst_bytes=burst,
                              safe_rate_Bps=safe_Bps, safe_burst_bytes=burst, timeout_s=self.cfg.failsafe_s,
                              shadow=run.conf.shadow)
            self.shaper.discard(run.class_id)
        except Exception as e:
            self.errors.record("fallback", e, time.monotonic(), class_=run.name)

    def _step(self, run: ClassRun, now: float, counters: Counters, flows: list, kernel_now: int) -> Outgoing:
        """One class's estimate -> allocate -> enforce; what it gossips this round."""
        cfg = self.cfg
        local = run.estimator.update(now, counters, flows, kernel_now)
        limit = self.book.get(run.name)
        safe_Bps = safe_rate(run.conf, limit, self.members.n_nodes)
        view = self.members.view(run.conf.key, now, safe_Bps)
        if self.tree_on and self.table.reads_sum(run.conf.key):
            view = self.tree.apply(view, run.conf.key, now)
        snap = Snapshot(now, cfg.node_id, cfg.interval_s, limit.global_Bps, local, view, tuple(run.inbox))
        run.inbox = []
        step = run.conf.allocator.step(run.state, snap)
        run.state = step.state
        step = step._replace(decision=heard_cap(step.decision, view, safe_Bps))   # one-way loss
        try:
            self._enforce(run, step.decision, safe_Bps)
        except Exception as e:          # told apart from the allocator's in the count (tick_errors.py)
            raise _Enforcing() from e
        if run.statefile:
            run.statefile.save(run.state)   # before the outbox: a restored node sent nothing it forgot
        for env in step.outbox:
            self.transport.send(env, run.conf.key, now)
        self.drops.count(run, counters)
        run.last = (snap, step, counters)
        d = step.decision
        may_pass = local_limit(d, local)
        if d.mode == Mode.BUCKET:       # a bucket never refills slower than the slow-start floor
            may_pass = max(may_pass, SLOW_START_Bps)
        return Outgoing(d.publish, limit.version, local.demand_Bps > 0, may_pass)

    def _enforce(self, run: ClassRun, d: Decision, safe_Bps: float) -> None:
        # shape mode queues a bucket's rate in HTB (agent/kernel/shaper.py); shadow wins (nothing is
        # shaped, would-be drops are counted), and a tick that decides PASS or DROP polices
        # the depth is this host's share of the class's burst budget (agent/burst.py), so that
        # the hosts' buckets together never hold more than D
        limit, n_nodes, prio = self.book.get(run.name), self.members.n_nodes, 0
        burst = host_burst(run.conf, limit, n_nodes, d.limit_Bps)
        if run.conf.shaped and d.mode == Mode.BUCKET:
            prio = self.shaper.set_rate(run.class_id, d.limit_Bps, burst)     # 0: it failed (logged): police
        else:
            self.shaper.discard(run.class_id)
        if not prio:
            burst = host_burst(run.conf, limit, n_nodes, d.limit_Bps, "police")
        safe_burst = host_burst(run.conf, limit, n_nodes, safe_Bps, "police")     # the fail-safe polices
        # the config in force again is not written again (the tick's heartbeat keeps it fresh),
        # unless it carries a quota: every write of one starts a new allowance
        config = (d.mode, d.limit_Bps, burst, d.drop_probability, safe_Bps, safe_burst, self.cfg.failsafe_s,
                  run.conf.shadow, prio)
        if config == run.written and d.quota_bytes is None:
            return
        run.written = config
        self.dp.set_class(run.class_id, d.mode, rate_Bps=d.limit_Bps, burst_bytes=burst,
                          drop_probability=d.drop_probability, safe_rate_Bps=safe_Bps,
                          timeout_s=self.cfg.failsafe_s, quota_bytes=d.quota_bytes, shadow=run.conf.shadow,
                          shape_prio=prio, safe_burst_bytes=safe_burst)
