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

Classes live in a :class:`~agent.tenants.ClassTable`; their global limits
and versions in a :class:`~agent.limits.LimitBook`: a ``drlctl set`` or a
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
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import selectors
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from drl.agent.clients.table import ClientRuleError, parse_prefix
from drl.agent.config.build import ClassConf, Config, ConfigError
from drl.agent.service.control import ControlError, ControlServer
from drl.agent.kernel.datapath import Counters, Datapath, DatapathError, now_ns
from drl.agent.gossip.core import CLUSTER, Outgoing, Received, cycle_rounds, new_incarnation
from drl.agent import logs
from drl.agent.cluster.limits import Limit, LimitBook, LimitBookError
from drl.agent.gossip.membership import Membership, liveness_timeout
from drl.agent.service.metrics import (CLIENT_DROP_REASONS, Board, DropTally, MetricsError, MetricsServer, TickStats,
                               drop_reason)
from drl.agent.model import SLOW_START_Bps, Decision, Local, Mode, Snapshot, effective_limit
from drl.agent.service.notify import Notifier
from drl.agent.service.client_rules import ClientRules
from drl.agent.gossip.peers import format_addr
from drl.agent.cluster.registry import Registry, RegistryError, RegistryView
from drl.agent.kernel.shaper import Shaper
from drl.agent.kernel.interface import DatapathPort
from drl.agent.gossip.interface import TransportPort
from drl.agent.service.class_table import Changes, ClassRun, ClassTable, StateFileError
from drl.agent.gossip.transport import Standalone, TransportError, UdpTransport
from drl.agent.units import parse_rate, to_bps, UnitError
from drl.agent.gossip.wire import Batch, ClientReports, LimitNote

log = logs.get_logger("drl.agent")


# a first view of etcd takes milliseconds; more than this and the agent starts without it
REGISTRY_START_S = 3.0
REJECTS_EVERY_S = 60.0         # gossip_rejected: one line per reason at most this often
REJECT_HINTS = {"forged": "every agent of the cluster needs the same --key-file",
                "unknown_peer": "the sender is not in --peers (nor, with --registry, a member)",
                "wrong_cluster": "the sender belongs to another cluster",
                "unknown_version": "the sender runs another wire version of drl",
                "wrong_sender": "the sender uses a node id bound to another address"}
GC_YOUNG_THRESHOLD = 20_000     # allocations between young collections (Python's default: 700)


class StartupError(Exception):
    """A resource could not be acquired; one line, nothing attached."""


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
    """The agent's state and tick.  ``transport(config)`` and ``datapath(config, gossip_port)``
    build its two resources (kernel.interface.DatapathPort, gossip.interface.TransportPort);
    tests pass the in-memory ones (kernel.fake, gossip.memory)."""

    def __init__(self, config: Config, transport: Callable[[Config], TransportPort] = udp_transport,
                 datapath: Callable[[Config, int | None], DatapathPort] = kernel_datapath,
                 shaper: Callable[[Config], Any] = kernel_shaper):
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
        self._facts: dict[str, Any] = {}
        self._rejects_said: dict[str, tuple[int, float]] = {}   # reason -> (count, when) of its last log line
        self.tick_stats = TickStats()
        self._drops: dict[str, tuple[ClassRun, DropTally]] = {}    # by class name; a new run starts over

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
                                  failsafe_s=cfg.failsafe_s, slack_s=_slack_s(cfg, len(cfg.peers)))
        self.registry: Registry | None = None
        self._peers_applied = ({p.addr: p.node_id for p in cfg.peers}, {})      # (members, lost)
        self._bad_keys: tuple[str, ...] = ()
        self._registry_seen: tuple[int, dict | None] = (-1, None)   # (Registry.changed(), the classes applied)
        self._classes_refused: str | None = None    # why etcd's classes do not check, while they do not
        self._registry_up = True
        if cfg.registry is not None:
            self.cfg = cfg = dataclasses.replace(cfg, classes=self._start_registry())
        self.book = LimitBook(Path(cfg.state_dir) / f"limits-{cfg.node_id}.json")
        self.dp = datapath(cfg, self.transport.address[1] if self.transport.address else None)
        self._stack.callback(self._close, self.dp)
        self.shaper = self._make_shaper(cfg)
        self._stack.callback(self._close, self.shaper)     # before dp's: the root qdisc comes back first
        self.table = ClassTable(self.dp, self.book, node_id=cfg.node_id, state_dir=cfg.state_dir,
                                max_classes=cfg.max_classes, founders=self.registry and self.registry.founders)
        self.table.apply(cfg.classes, self._member_ids(), self.members.n_nodes)
        self.clients = ClientRules(self.dp, cfg.node_id)
        self.clients.apply(self.table, time.monotonic(), self.members.timeout_s, self.members.n_nodes)
        for run in self.table:      # peers whose file says otherwise, or who missed a change, learn ours
            self._announce(run)
        self.dp.set_sample_probability(cfg.sample_probability)
        self.dp.attach()

    def _close(self, kernel_side) -> None:
        """The datapath or the shaper: detached at a stop, left enforcing after a failure."""
        kernel_side.close(detach=not self.failed)

    def _leave_registry(self) -> None:
        """At a stop we leave; after a failure our lease expires, as a killed agent's does."""
        self.registry.close(leave=not self.failed)

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
        first = next(iter(self.table))
        log.info("started", node=cfg.node_id, iface=cfg.iface, classes=len(self.table),
                 allocator=first.conf.allocator.name, global_bps=round(to_bps(self.book.get(first.name).global_Bps)),
                 peers=self.members.n_nodes - 1, listen=_listen(self.transport.address), interval_ms=round(cfg.interval_s * 1000, 3),
                 auth="hmac-sha256" if cfg.key else "none")
        if cfg.standalone:
            log.info("standalone", gossip="off", reason="no_peers")
        sel, wakeup = self._selector()
        next_tick = time.monotonic()
        try:
            while not self.stopping:
                now = time.monotonic()
                if now >= next_tick:
                    self._follow_registry()
                    self.tick(now)
                    self._notify_progress()
                    done = time.monotonic()
                    self.tick_stats.observe(done - now, overran=done > next_tick + cfg.interval_s)
                    if self.board.wanted:     # a scrape waits for this tick's state (agent/service/metrics.py)
                        self.board.publish(self.status())
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

    def _notify_progress(self) -> None:
        """systemd: READY=1 after the first tick (the filter is attached and the loop runs);
        watchdog beats only from completed ticks, so a loop stuck anywhere stops them."""
        if self.ticks == 1:
            self.notify.ready()
        self.notify.watchdog(time.monotonic())

    def _reload_notified(self) -> dict:
        """reload() between RELOADING=1 and READY=1: `systemctl reload` waits for it to end."""
        self.notify.reloading()
        try:
            return self.reload()
        finally:
            self.notify.ready()

    def _selector(self) -> tuple[selectors.BaseSelector, socket.socket]:
        sel = selectors.DefaultSelector()
        if self.transport.sock is not None:
            sel.register(self.transport.sock, selectors.EVENT_READ, self.receive)
        sel.register(self.control, selectors.EVENT_READ, self._serve_control)
        rx, tx = socket.socketpair()
        rx.setblocking(False)
        tx.setblocking(False)
        signal.set_wakeup_fd(tx.fileno())
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        sel.register(rx, selectors.EVENT_READ, lambda: self._signalled(rx))
        self._stack.callback(tx.close)
        self._stack.callback(signal.set_wakeup_fd, -1)
        return sel, rx

    def _on_signal(self, signum, frame) -> None:
        if signum != signal.SIGHUP:
            log.info("signal", name=signal.Signals(signum).name)
            self.stopping = True

    def _signalled(self, rx: socket.socket) -> None:
        """The signal pipe: a SIGHUP reloads here, in the loop, never inside a tick."""
        if signal.SIGHUP in rx.recv(64):
            log.info("signal", name="SIGHUP")
            self._reload_notified()

    def receive(self) -> None:
        """Hand every datagram that arrived to membership, point-to-point ones to their
        class's inbox, and the limits in Batches to the limit book."""
        now = time.monotonic()
        for rx in self.transport.poll(now):
            self.members.observe(rx, now)
            if isinstance(rx.payload, Batch):
                self._limits_heard(rx)
            elif isinstance(rx.payload, ClientReports):
                self.clients.receive(rx.header.node, rx.payload, now)
            elif (run := self.table.by_key(rx.header.class_id)) is not None:
                run.inbox.append(rx.envelope)

    def _limits_heard(self, rx: Received) -> None:
        """Adopt newer limits; tell a peer that holds an older one ours."""
        changed = False
        for note in rx.payload.limits:
            run = self.table.by_key(note.key)
            if run is None:
                continue
            heard = Limit(note.version, note.global_Bps)
            if self.book.merge(run.name, heard):
                log.info("limit_changed", class_=run.name, global_bps=round(to_bps(note.global_Bps)),
                         version=note.version, from_=rx.header.node)
                changed = True
            elif heard < self.book.get(run.name):     # e.g. the same version from a file that differs
                self._announce(run, rx.addr)
        if changed:
            self.book.save()
        for v in rx.payload.values:
            run = self.table.by_key(v.key)
            if run is not None and v.version < self.book.get(run.name).version:
                self._announce(run, rx.addr)

    def _announce(self, run: ClassRun, addr=None) -> None:
        """``run``'s limit to ``addr``, or to every peer."""
        limit = self.book.get(run.name)
        self.transport.announce(LimitNote(run.conf.key, limit.version, limit.global_Bps), addr)

    # -- control ----------------------------------------------------------------------------

    def _serve_control(self) -> None:
        self.control.handle_one({"status": lambda req: {"ok": True, "status": self.status()},
                                 "down": self._down, "set": self.set_limit,
                                 "reload": lambda req: self._reload_notified(),
                                 "clients": self._clients, "unban": self._unban})

    def _down(self, req: dict) -> dict:
        log.info("down_requested")
        self.stopping = True
        return {"ok": True}

    def set_limit(self, req: dict) -> dict:
        """drlctl set CLASS --global RATE: a new version here, announced to every peer."""
        run = self.table.get(str(req.get("class")))
        if run is None:
            return {"ok": False, "error": f"no class {req.get('class')!r} (see drlctl classes)"}
        try:
            rate = parse_rate(str(req.get("global")))
        except UnitError as e:
            return {"ok": False, "error": str(e)}
        if run.conf.allocator.name == "dqmp":      # a set would change the label and promise a limit
            return {"ok": False, "error": f"class {run.name!r} enforces its volume quota (allocator dqmp), not a "
                                         f"rate; its global only sets the fail-safe rate: change quota or global "
                                         f"in the config file and reload"}
        if self.registry is not None:
            return self._set_in_registry(run, str(req.get("global")), rate)
        limit = self.book.set(run.name, rate)
        self.book.save()
        self._announce(run)
        log.info("limit_changed", class_=run.name, global_bps=round(to_bps(rate)), version=limit.version,
                 from_="drlctl")
        return {"ok": True, "class": run.name, "global_limit_bps": to_bps(rate), "limit_version": limit.version,
                "peers": self.members.n_nodes - 1}

    def _clients(self, req: dict) -> dict:
        """drlctl clients [CLASS]: each class's client rule and its top clients."""
        name = req.get("class")
        if name is not None and self.table.get(str(name)) is None:
            return {"ok": False, "error": f"no class {name!r} (see drlctl classes)"}
        limit = req.get("limit")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            return {"ok": False, "error": f"limit {limit!r}: give a number of clients, 1 or more"}
        listing = self.clients.listing(name, time.monotonic(), limit)
        if name is not None and not listing:
            return {"ok": False, "error": f"class {name!r} has no client rule"}
        return {"ok": True, "classes": listing}

    def _unban(self, req: dict) -> dict:
        """drlctl unban PREFIX [--class NAME]: lifted here, the tombstones go to every peer."""
        try:
            prefix = parse_prefix(str(req.get("prefix")))
        except ClientRuleError as e:
            return {"ok": False, "error": str(e)}
        name = req.get("class")
        if name is not None and self.table.get(str(name)) is None:
            return {"ok": False, "error": f"no class {name!r} (see drlctl classes)"}
        lifted = self.clients.unban(prefix, None if name is None else str(name), time.monotonic())
        if not lifted:
            return {"ok": False, "error": f"no ban on {prefix}" + (f" in class {name!r}" if name else "")}
        return {"ok": True, "lifted": [{"class": c, "client": n} for c, n in lifted]}

    def _set_in_registry(self, run: ClassRun, text: str, rate: float) -> dict:
        """With a registry the class's table in etcd gets the new limit, and every agent (this
        one too) applies it from its watch; written when etcd is back if it is away now.  A
        class etcd does not have yet goes there whole (its rules and allocator), so an agent
        that has no such class of its own starts the same one, not one matching everything."""
        view = self.registry.view()
        table = view.classes.get(run.name) or {"name": run.name, "allocator": run.conf.allocator.name,
                                                "match": [str(rule) for rule in run.conf.rules]}
        self.registry.put_class({**table, "global": text})
        state = "queued" if view.reachable else "pending"      # pending: written once etcd is back
        log.info("limit_requested", class_=run.name, global_bps=round(to_bps(rate)), from_="drlctl", registry=state)
        return {"ok": True, "class": run.name, "global_limit_bps": to_bps(rate),
                "limit_version": self.book.get(run.name).version, "registry": state,
                "classes_refused": self._classes_refused}

    def reload(self) -> dict:
        """Re-read the config file: classes added, changed or removed in place.  A bad file
        changes nothing."""
        if self.cfg.reload is None:
            return {"ok": False, "error": "the agent was started without --config: nothing to reload"}
        try:
            changes = self._apply_classes(self.cfg.reload(self._registry_seen[1]))
        except (ConfigError, ValueError) as e:      # ClassifyError is a ValueError
            log.error("reload_failed", error=str(e))
            return {"ok": False, "error": str(e)}
        log.info("reloaded", classes=len(self.table), added=list(changes.added), changed=list(changes.changed),
                 removed=list(changes.removed))
        return {"ok": True, **dataclasses.asdict(changes)}

    def _apply_classes(self, confs: tuple[ClassConf, ...]) -> Changes:
        """Make ``confs`` the classes in force (a reload, or the registry's); raises like
        ClassTable.apply, having changed nothing."""
        changes = self.table.apply(confs, self._member_ids(), self.members.n_nodes)
        self.clients.apply(self.table, time.monotonic(), self.members.timeout_s, self.members.n_nodes)
        for run in self.table:
            if run.name in changes.changed or run.name in changes.added:
                self._announce(run)
        self.cfg = dataclasses.replace(self.cfg, classes=confs)
        self._drops = {name: v for name, v in self._drops.items() if self.table.get(name) is not None}
        self.shaper.retain([run.class_id for run in self.table])    # removed classes' HTB classes go
        return changes

    # -- the registry -----------------------------------------------------------------------

    def _start_registry(self) -> tuple[ClassConf, ...]:
        """Register in etcd and wait (REGISTRY_START_S at most) for its first view: the
        members to start with and the classes in force.  Without one the agent cannot know
        its peers, so it does not start (a 1/N share of a cluster it cannot see would be
        the whole limit), unless --peers names them."""
        cfg = self.cfg
        self.registry = Registry(dataclasses.replace(cfg.registry, mark=cfg.gossip_mark), cfg.node_id,
                                 self.transport.address, self.transport.core.incarnation)
        self._stack.callback(self._leave_registry)    # runs after the datapath's close: we leave last
        self.registry.start()
        deadline = time.monotonic() + REGISTRY_START_S
        while not self.registry.view().reachable and time.monotonic() < deadline:
            time.sleep(0.01)
        seen, view = self.registry.snapshot()
        self._registry_up = view.reachable
        if not view.reachable:
            if not cfg.peers or not cfg.classes:
                raise RegistryError(f"no view of the cluster from etcd ({view.error}): without it this agent "
                                    f"knows neither its peers nor, if it has none of its own, its classes")
            log.warning("registry", state="unreachable", error=view.error)
            return cfg.classes
        self._follow_members(view)
        self._registry_seen = (seen, view.classes)
        try:
            confs = self.cfg.live_classes(view.classes)
        except (ConfigError, ValueError) as e:      # one bad table in etcd must not keep every agent down
            if not cfg.classes:
                raise RegistryError(f"etcd's classes do not check and this agent has none of its own: {e}") from None
            self._refuse_registry_classes(e)
            return cfg.classes
        if not confs:
            raise RegistryError(f"no class to limit: none given (--global, --config) and none in etcd under "
                                f"{cfg.registry.prefix}classes/")
        return confs

    def _follow_registry(self) -> None:
        """What changed in etcd since the last tick: members, then classes.  While etcd is
        unreachable nothing changes: the last members and classes stay, gossip goes on."""
        if self.registry is None:
            return
        seen, view = self.registry.snapshot()
        if seen == self._registry_seen[0]:
            return
        self._registry_seen = (seen, self._registry_seen[1])
        if view.reachable != self._registry_up:
            self._registry_up = view.reachable
            if view.reachable:
                log.info("registry", state="reachable")
            else:
                log.warning("registry", state="unreachable", error=view.error)
        if not view.reachable:
            return
        if view.bad_keys != self._bad_keys:
            self._bad_keys = view.bad_keys
            if view.bad_keys:
                log.warning("registry_bad_keys", keys=list(view.bad_keys))     # an etcdctl typo, say
        self._follow_members(view)
        if view.classes != self._registry_seen[1]:
            self._registry_seen = (seen, view.classes)
            self._follow_classes(view.classes)

    def _follow_classes(self, tables: dict[str, dict]) -> None:
        """etcd's classes on top of ours; a set that does not check changes nothing."""
        try:
            confs = self.cfg.live_classes(tables)
            if not confs:
                raise ConfigError("no class left: the agent keeps the ones it has")
            changes = self._apply_classes(confs)
        except (ConfigError, ValueError) as e:
            self._refuse_registry_classes(e)
            return
        self._classes_refused = None
        log.info("registry_classes", classes=len(self.table), added=list(changes.added),
                 changed=list(changes.changed), removed=list(changes.removed))

    def _refuse_registry_classes(self, e: Exception) -> None:
        """etcd's classes do not check: the agent keeps its own, says why, and shows it in status."""
        self._classes_refused = str(e)
        log.error("registry_classes_refused", error=str(e))

    def _follow_members(self, view: RegistryView) -> None:
        """The registry's members (and --peers) become the gossip targets and N; a lost one
        stays a gossip target and reserved, but out of N (Membership.set_peers)."""
        cfg = self.cfg
        wanted = {m.addr: m.node_id for m in view.members.values() if m.node_id != cfg.node_id}
        wanted.update({p.addr: p.node_id for p in cfg.peers})
        lost = {m.addr: m.node_id for m in view.lost.values() if m.addr not in wanted}
        if (wanted, lost) == self._peers_applied:
            return
        (before, _), self._peers_applied = self._peers_applied, (wanted, lost)
        n = len(wanted)
        timeout_s = None if cfg.peer_timeout_fixed else liveness_timeout(cfg.interval_s, n, cfg.branching)
        heard_from = self.transport.set_peers({**wanted, **lost}, timeout_s=timeout_s)
        self.members.set_peers(heard_from, timeout_s=timeout_s, slack_s=_slack_s(cfg, n),
                               lost=[a for a, node in heard_from.items() if node in lost.values()])
        log.info("members", n=1 + n, joined=sorted(str(wanted[a]) for a in wanted.keys() - before.keys()) or None,
                 left=sorted(str(before[a]) for a in before.keys() - wanted.keys() - lost.keys()) or None,
                 lost=sorted(lost.values()) or None)
        for addr, why in self.transport.unresolved.items():
            log.warning("peer_unresolved", peer=f"{({**wanted, **lost})[addr]}@{addr[0]}:{addr[1]}", error=why)

    # -- the tick ---------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self.dp.ensure_attached()      # our filter removed or replaced behind our back: attach again
        self.shaper.ensure_attached()  # the same for shape mode's HTB root (no-op without shaped classes)
        runs = list(self.table)
        counters = self.dp.read_counters([run.class_id for run in runs])
        flows = self.dp.read_flows()
        kernel_now = now_ns()
        with self.dp.batch():
            out = {run.conf.key: self._step(run, now, counters[run.class_id], flows.get(run.class_id, []), kernel_now)
                   for run in runs}
        self.dp.heartbeat()     # every config stays fresh, the ones _enforce did not write again too
        self.transport.publish(out, now)
        if self.clients:
            n_hosts = 1 + self.members.view(0, now).n_alive      # the hosts whose reports count
            reports = self.clients.tick(now, n_hosts, self.members.timeout_s)
            if reports:
                self.transport.report_clients(reports, now)
        self._log_changes(now)
        self.ticks += 1

    def _step(self, run: ClassRun, now: float, counters: Counters, flows: list, kernel_now: int) -> Outgoing:
        """One class's estimate -> allocate -> enforce; what it gossips this round."""
        cfg = self.cfg
        local = run.estimator.update(now, counters, flows, kernel_now)
        limit = self.book.get(run.name)
        safe_Bps = self._safe_rate(run, limit)
        view = self.members.view(run.conf.key, now, safe_Bps)
        snap = Snapshot(now, cfg.node_id, cfg.interval_s, limit.global_Bps, local, view, tuple(run.inbox))
        run.inbox = []
        step = run.conf.allocator.step(run.state, snap)
        run.state = step.state
        self._enforce(run, step.decision, safe_Bps)
        if run.statefile:
            run.statefile.save(run.state)   # before the outbox: a restored node sent nothing it forgot
        for env in step.outbox:
            self.transport.send(env, run.conf.key, now)
        self._count_drops(run, counters)
        run.last = (snap, step, counters)
        d = step.decision
        may_pass = _local_limit(d, local)
        if d.mode == Mode.BUCKET:       # a bucket never refills slower than the slow-start floor
            may_pass = max(may_pass, SLOW_START_Bps)
        return Outgoing(d.publish, limit.version, local.demand_Bps > 0, may_pass)

    def _tally(self, run: ClassRun) -> DropTally:
        owner, tally = self._drops.get(run.name, (None, None))
        if owner is not run:         # a new class, or one removed and added again: a fresh tally
            tally = DropTally()
            self._drops[run.name] = (run, tally)
        return tally

    def _count_drops(self, run: ClassRun, counters: Counters) -> None:
        """The drops since the last tick, under the reason of the decision then in force."""
        if run.last is not None and run.last[2].dropped_packets == counters.dropped_packets:
            return          # most ticks drop nothing new (the tally has seen last tick's counters)
        tally = self._tally(run)
        if (counters.dropped_bytes, counters.dropped_packets) != tally.seen:
            tally.add(counters.dropped_bytes, counters.dropped_packets, drop_reason(run.last and run.last[1].decision))

    def _enforce(self, run: ClassRun, d: Decision, safe_Bps: float) -> None:
        # shape mode queues a bucket's rate in HTB (agent/kernel/shaper.py); shadow wins (nothing is
        # shaped, would-be drops are counted), and a tick that decides PASS or DROP polices
        prio = 0
        if run.conf.shaped and d.mode == Mode.BUCKET:
            prio = self.shaper.set_rate(run.class_id, d.limit_Bps)     # 0: it failed (logged): police
        else:
            self.shaper.discard(run.class_id)
        # the config in force again is not written again (the tick's heartbeat keeps it fresh),
        # unless it carries a quota: every write of one starts a new allowance
        config = (d.mode, d.limit_Bps, run.conf.burst_bytes, d.drop_probability, safe_Bps, self.cfg.failsafe_s,
                  run.conf.shadow, prio)
        if config == run.written and d.quota_bytes is None:
            return
        run.written = config
        self.dp.set_class(run.class_id, d.mode, rate_Bps=d.limit_Bps, burst_bytes=run.conf.burst_bytes,
                          drop_probability=d.drop_probability, safe_rate_Bps=safe_Bps,
                          timeout_s=self.cfg.failsafe_s, quota_bytes=d.quota_bytes, shadow=run.conf.shadow,
                          shape_prio=prio)

    def _safe_rate(self, run: ClassRun, limit: Limit) -> float:
        return run.conf.safe_Bps if run.conf.safe_Bps is not None else limit.global_Bps / self.members.n_nodes

    def _log_changes(self, now: float) -> None:
        """One line per peer that turned alive or stale, per class whose mode or warning changed,
        and per reason datagrams were rejected for (at most once a minute each)."""
        self._log_rejects(now)
        facts = {f"peer {p['node_id']} ({p['address']})": p["state"] for p in self.members.status(now)}
        for what, value in facts.items():
            if what in self._facts and self._facts[what] != value:
                log.info("change", what=what, now=value)
        self._facts = facts
        for run in self.table:
            d = run.last[1].decision
            said = (d.mode, d.info.get("warning"))
            if said != run.said and run.said is not None:     # the common case, once per class: equal
                for what, before, now_ in zip(("mode", "warning"), run.said, said):
                    if before != now_:
                        log.info("change", class_=run.name, what=what,
                                 now=now_.name.lower() if what == "mode" else now_)
            run.said = said

    def _log_rejects(self, now: float) -> None:
        """A peer with another key shows only as stale otherwise: its datagrams fail the MAC."""
        for reason, n in self.transport.stats.rejected.items():
            said, at = self._rejects_said.get(reason, (0, -math.inf))
            if n > said and now - at >= REJECTS_EVERY_S:
                log.warning("gossip_rejected", reason=reason, datagrams=n - said, hint=REJECT_HINTS.get(reason))
                self._rejects_said[reason] = (n, now)

    # -- status -----------------------------------------------------------------------------

    def status(self) -> dict:
        """drlctl status --json: the agent, each class under ``classes``, and at the top
        level the first class (``default`` when there is one) as before classes existed."""
        now = time.monotonic()
        cfg = self.cfg
        classes = [self._class_status(run) for run in self.table]
        first = next((c for c in classes if c["name"] == "default"), classes[0])
        out = {"node_id": cfg.node_id, "interface": cfg.iface, "interval_s": cfg.interval_s,
               "uptime_s": now - self.started, "ticks": self.ticks, "listen": _listen(self.transport.address),
               "standalone": cfg.standalone, "authenticated": cfg.key is not None,
               "gossip": {**self.transport.stats.as_dict(now), "client_entries_ignored": self.clients.ignored},
               "peers": self.members.status(now),
               "datapath": dict(self.dp.attachment), "tick": self.tick_stats.as_dict(),
               "registry": self._registry_status(now)}
        out.update({k: v for k, v in first.items() if k != "name"})
        out["classes"] = classes
        return out

    def _registry_status(self, now: float) -> dict | None:
        if self.registry is None:
            return None
        view, reg = self.registry.view(), self.cfg.registry
        return {"endpoints": [f"etcd://{format_addr(e)}" for e in reg.endpoints], "cluster": reg.cluster,
                "state": "reachable" if view.reachable else "unreachable", "error": view.error or None,
                "for_s": now - view.since, "members": sorted(view.members), "classes": sorted(view.classes),
                "classes_refused": self._classes_refused, "bad_keys": list(view.bad_keys)}

    def _class_status(self, run: ClassRun) -> dict:
        limit = self.book.get(run.name)
        if run.last is None:      # before its first tick: the 1/N share ClassTable.apply wrote
            snap, c, local = None, Counters(), Local(0.0)
            d = Decision(Mode.BUCKET, limit.global_Bps / self.members.n_nodes)
        else:
            snap, step, c = run.last
            d, local = step.decision, snap.local
        return {
            "name": run.name, "allocator": run.conf.allocator.name,
            "global_limit_bps": to_bps(limit.global_Bps), "limit_version": limit.version,
            "effective_limit_bps": to_bps(effective_limit(snap) if snap else limit.global_Bps),
            "local_limit_bps": to_bps(_local_limit(d, local)), "safe_rate_bps": to_bps(self._safe_rate(run, limit)),
            "mode": d.mode.name.lower(), "shadow": run.conf.shadow, "enforce": run.conf.enforce,
            "shaped": run.class_id in self.shaper.rates,     # enforce shape, and its HTB class holds
            "drop_probability": d.drop_probability,
            "demand_bps": to_bps(local.demand_Bps), "rate_bps": to_bps(local.sent_Bps),
            "flows": len(local.flow_rates_Bps), "max_flow_bps": to_bps(max(local.flow_rates_Bps, default=0.0)),
            "passed_bytes": c.passed_bytes, "passed_packets": c.passed_packets,
            "dropped_bytes": c.dropped_bytes, "dropped_packets": c.dropped_packets,
            **self._drops_by_reason(run, c),
            "throttled_bytes": c.throttled_bytes, "throttled_packets": c.throttled_packets,
            "banned_bytes": c.banned_bytes, "banned_packets": c.banned_packets,
            "clients": self._client_summary(run),
            "quota_bytes_left": d.quota_bytes, "gossip_lost": self.members.class_lost[run.conf.key],
            "allocator_state": _allocator_state(d.info)}

    def _client_summary(self, run: ClassRun) -> dict | None:
        """The class's client rule and its clients tracked, throttled and banned; None without one."""
        cr = self.clients.get(run.name)
        if cr is None:
            return None
        return {"key": str(cr.rule.key), "measure": cr.rule.measure, "threshold": str(cr.rule.threshold),
                "action": cr.rule.action, **cr.table.summary(time.monotonic())}

    def _drops_by_reason(self, run: ClassRun, c: Counters) -> dict:
        """The class's drops by policy reason (DropTally), and with a client rule its
        throttled and banned packets, which the datapath counts apart."""
        tally = self._tally(run)
        by_bytes, by_packets = dict(tally.bytes), dict(tally.packets)
        if run.conf.client is not None:
            by_bytes.update(zip(CLIENT_DROP_REASONS, (c.throttled_bytes, c.banned_bytes)))
            by_packets.update(zip(CLIENT_DROP_REASONS, (c.throttled_packets, c.banned_packets)))
        return {"dropped_bytes_by_reason": by_bytes, "dropped_packets_by_reason": by_packets}


def _slack_s(cfg: Config, n_peers: int) -> float:
    """A peer's last config write is at most two gossip cycles (and a tick) after the last
    datagram we had from it: the slack of the stale rule (Membership.may_still_pass)."""
    return (2 * cycle_rounds(n_peers, cfg.branching) + 1) * cfg.interval_s


def _local_limit(d: Decision, local: Local) -> float:
    """What this host may send now: the bucket rate, or for random drop what survives it."""
    if d.mode == Mode.BUCKET:
        return d.limit_Bps
    if d.mode == Mode.DROP:
        return local.demand_Bps * (1.0 - d.drop_probability)
    return local.demand_Bps


def _listen(address) -> str | None:
    return None if address is None else "%s:%d" % address[:2]


def _allocator_state(info: Any) -> Any:
    """Decision.info as drlctl shows it: JSON values, and rates in bits/s like the rest of
    the status.  Allocators keep bytes/s (``*_Bps``); each such key, nested ones too,
    becomes ``*_bps`` with 8x the value."""
    return json.loads(json.dumps(info, default=_jsonable), object_hook=_in_bits)


def _jsonable(value: Any) -> Any:
    """What json cannot encode itself: a read-only mapping (Decision's default info) as a
    dict, anything else as its str."""
    return dict(value) if isinstance(value, Mapping) else str(value)


def _in_bits(d: dict) -> dict:
    out = {}
    for key, value in d.items():
        if key.endswith("_Bps"):
            key, value = key.removesuffix("_Bps") + "_bps", None if value is None else to_bps(value)
        out[key] = value
    return out
