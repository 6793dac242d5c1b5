"""The agent's event loop: start-up, the loop, control commands, signals, shutdown.

    run(build_config(opts))      # what `drl-agent up` does; returns the exit code

Every ``interval_s`` the loop runs one tick (service/tick.py: kernel maps -> estimator ->
the class step -> enforcement + gossip).  Between ticks it waits on the gossip socket
(datagrams are validated and handed to their consumers as they arrive, gossip/dispatch.py,
so liveness is exact and the socket buffer never fills), the control socket (drlctl,
drl-agent down/reload), link events and the signal pipe (SIGTERM/SIGINT stop, SIGHUP
reloads the config file).

Classes live in a :class:`~drl.agent.service.class_table.ClassTable`; their global
limits and versions in a :class:`~drl.agent.cluster.limits.LimitBook`: a ``drlctl set`` or a
changed config file makes a new version, which gossip announces to every
peer, and a peer still on an older version is told the newer one.  Only
service/enforce.py writes a class's kernel config; the tick stamps the datapath's
heartbeat with the kernel clock, so if this process stops ticking (hung, killed -9) the
datapath falls back to the safe rate after ``failsafe_s`` (bpf/limiter.c stale).

Startup (service/startup.py builds the sockets, BPF and HTB) acquires the sockets before it
attaches, and every exit path detaches: nothing stays on the interface after an error.
Logs are one line per state change, as logfmt or JSON (agent/logs.py; docs/logs.md).
The other concerns are modules beside this one: ``commands``, ``status``,
``registry_sync``, ``limit_gossip``, ``drops``, ``change_log``, ``signals``, ``rates``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import selectors
import signal
import socket
import time
from typing import Callable, Iterator

from drl.agent import logs
from drl.agent.cluster.limits import LimitBookError
from drl.agent.cluster.registry import RegistryError
from drl.agent.config.build import ClassConf, Config, ConfigError
from drl.agent.gossip.core import CLUSTER
from drl.agent.gossip.interface import TransportPort
from drl.agent.gossip.keys import KeyFileError
from drl.agent.gossip.signing import load_node_keys
from drl.agent.gossip.transport import TransportError
from drl.agent.kernel import rtnetlink
from drl.agent.kernel.datapath import DatapathError
from drl.agent.kernel.interface import DatapathPort, ShaperPort
from drl.agent.service import commands
from drl.agent.service.change_log import ChangeLog
from drl.agent.service.class_table import Changes, StateFileError
from drl.agent.service.control import ControlError, Reply
from drl.agent.service.drops import Drops
from drl.agent.service.metrics import MetricsError, TickStats
from drl.agent.service.notify import Notifier
from drl.agent.service.signals import watch_signals
from drl.agent.service.startup import acquire, kernel_datapath, kernel_shaper, tune_gc, udp_transport
from drl.agent.service.slices import SLICE_S
from drl.agent.service.status import agent_status, listen, status_parts, status_reply
from drl.agent.service.tick import tick
from drl.agent.service.tick_errors import TickErrors
from drl.agent.service.unmatched import Unmatched
from drl.agent.service.unseen import UnseenPeers
from drl.agent.units import to_bps

# What other code imports from here; CLUSTER is gossip.core's, the cluster id the agent gossips under.
__all__ = ["CLUSTER", "Agent", "StartupError", "run", "udp_transport", "kernel_datapath", "kernel_shaper"]

log = logs.get_logger("drl.agent")


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
        tune_gc()
        return agent.serve()


class Agent:
    """The agent: its state, the loop and the control commands.  ``transport(config)``,
    ``datapath(config, gossip_port)`` and ``shaper(config)`` build its resources (gossip.interface.TransportPort,
    kernel.interface.DatapathPort and ShaperPort); tests pass the in-memory ones
    (gossip.memory, kernel.fake)."""

    def __init__(self, config: Config, transport: Callable[[Config], TransportPort] = udp_transport,
                 datapath: Callable[[Config, int | None], DatapathPort] = kernel_datapath,
                 shaper: Callable[[Config], ShaperPort] = kernel_shaper):
        self.cfg = config
        self._stack = contextlib.ExitStack()
        # A failure (a DatapathError in serve, any other exception out of `with agent`) is not
        # a stop: detached, this host's classes would pass everything.  Left attached, the
        # kernel enforces each class's safe rate once its config goes stale, and the peers
        # count this host as a killed one: silent (its lease expiring, with a registry), at
        # what its datapath may still pass (README "Faults").  systemd restarts us.
        self.failed = False
        try:
            acquire(self, self._stack, transport, datapath, shaper)
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
        self._publishing = False     # a metrics snapshot is being made between ticks
        self.errors = TickErrors()
        self.drops = Drops()
        self.unmatched = Unmatched(self.cfg.iface)
        self.unseen = UnseenPeers(self.started, self.members.timeout_s)

    @property
    def registry(self):
        """etcd (cluster.registry.Registry) with --registry, else None."""
        return self.sync.registry

    def member_ids(self) -> tuple[str, ...]:
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
                slices = self.control.slices    # replies and scrapes made between ticks (service/slices.py)
                for key, _ in sel.select(0.0 if slices else max(0.0, next_tick - time.monotonic())):
                    key.data()
                slices.run(min(next_tick, time.monotonic() + SLICE_S))
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
                 interval_ms=round(cfg.interval_s * 1000, 3), auth="hmac-sha256" if cfg.key else "none",
                 enforce=",".join(sorted({run.conf.enforce for run in self.table})))
        if cfg.standalone:
            log.info("standalone", gossip="off", reason="no_peers")
        defaulted = [run.conf for run in self.table if run.conf.policed_by_default]
        if defaulted:       # the default shapes; say why these are policed (config/build.py default_police_reason)
            log.info("enforce_default_police", classes=len(defaulted), reason=defaulted[0].policed_by_default,
                     mode="police", fix="--enforce shape (or enforce = \"shape\") queues them instead")

    def _tick_and_report(self, now: float, due: float) -> None:
        """One tick of the loop, and what watches it: systemd, the tick statistics, a scrape."""
        self._follow_registry()
        self.tick(now)
        self._notify_progress()
        done = time.monotonic()
        self.tick_stats.observe(done - now, overran=done > due + self.cfg.interval_s, late_s=now - due)
        if self.board.wanted and not self._publishing:   # a scrape waits for this tick's state (metrics.py)
            self._publishing = True
            self.control.slices.add(self._publish())

    def _publish(self):
        """A slices job: the status for the metrics, made a part at a time, then published."""
        classes = []
        try:
            for part in status_parts(self):
                if isinstance(part, dict):
                    self.board.publish({**part, "classes": classes})
                else:
                    classes += part
                    yield
        except Exception as e:      # the scrape gets the last snapshot; the loop goes on
            self.errors.record("metrics", e, time.monotonic())
        finally:
            self._publishing = False

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
        """An interface, qdisc or filter was made, changed or deleted: is our filter (and HTB
        root) still there, and ahead of every other?  An interface deleted and made again under
        our name is attached to within milliseconds of its making, before whoever makes it has
        added its addresses and routes, and a filter put ahead of ours is passed again as soon,
        instead of at the next tick, up to an interval during which it passes everything."""
        if rtnetlink.drain(links):
            self.dp.ensure_attached()
            self.shaper.ensure_attached()

    def _stop(self) -> None:
        self.stopping = True

    def receive(self) -> None:
        """Every datagram that arrived to its consumers (gossip/dispatch.py): membership first."""
        now = time.monotonic()
        for rx in self.transport.poll(now):
            try:
                self.dispatch.deliver(rx, now)
            except Exception as e:          # one datagram's failure is that datagram's
                self.errors.record("receive", e, now, peer=rx.header.node)

    # -- control (service/commands.py) --------------------------------------------------------

    def commands(self) -> dict[str, Callable[[dict], Reply]]:
        """The control socket's commands by name, each a request dict -> a reply dict."""
        handlers = {"status": lambda req: status_reply(self),     # streamed between ticks (control.py)
                    "down": self._down, "set": self.set_limit,
                    "reload": lambda req: self._reload_notified(),
                    "clients": lambda req: commands.list_clients(req, self.table, self.clients, time.monotonic()),
                    "unban": lambda req: commands.unban(req, self.table, self.clients, time.monotonic())}
        return {cmd: functools.partial(self._counted, cmd, handler) for cmd, handler in handlers.items()}

    def _counted(self, cmd: str, handler: Callable[[dict], Reply], req: dict) -> Reply:
        """A control request's exception is counted with the tick's (stage control), then
        answered as an error reply by control.answer, which logs control_failed."""
        try:
            reply = handler(req)
        except Exception as e:
            self.errors.record("control", e, time.monotonic(), cmd=cmd)
            raise
        return reply if isinstance(reply, dict) else self._counted_parts(cmd, reply)

    def _counted_parts(self, cmd: str, parts: Iterator[bytes]) -> Iterator[bytes]:
        """A streamed reply's exception (control.py drops the connection): counted the same."""
        try:
            yield from parts
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
        """Re-read the per-node keys, then the config file (commands.reload); a bad file changes nothing."""
        if self.cfg.node_keys is not None:
            try:
                keys = load_node_keys(self.cfg.identity_file, self.cfg.peer_keys_file)
            except KeyFileError as e:
                log.error("reload_failed", error=str(e))
                return {"ok": False, "error": str(e)}
            self.transport.set_keys(keys)
            self.sync.publish_key(keys.public)
            if self.cfg.reload is None:
                return {"ok": True, "added": [], "changed": [], "removed": [], "public_key": keys.public}
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
        changes = self.table.apply(confs, self.member_ids(), self.members.n_nodes)
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

    def tick(self, now: float) -> None:
        tick(self, now)
