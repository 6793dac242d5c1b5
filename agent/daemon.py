"""The agent's tick loop: kernel maps -> estimator -> allocator -> maps + gossip.

    run(build_config(opts))      # what `drl-agent up` does; returns the exit code

Every ``interval_s`` one tick reads the class counters and the flow table,
estimates demand (agent/estimator.py), hands a Snapshot to the pure allocator
and writes its Decision to the kernel, then gossips the published value and
sends the allocator's point-to-point messages.  Between ticks the loop waits
on the gossip socket (datagrams are validated and handed to membership as
they arrive, so liveness is exact and the socket buffer never fills), the
control socket (drlctl) and the signal pipe (SIGTERM/SIGINT).

Every tick rewrites the class config, stamped by the kernel clock: if this
process stops ticking (hung, killed -9) the datapath falls back to the safe
rate after ``failsafe_s`` (bpf/limiter.c).  Startup acquires the sockets
before it attaches, and every exit path detaches: nothing stays on the
interface after an error.  Logs are one line per state change (start, peer
alive/stale, mode, allocator warnings, stop), in key=value form.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from agent.config import Config
from agent.control import ControlError, ControlServer
from agent.datapath import Counters, Datapath, DatapathError, now_ns
from agent.estimator import Estimator
from agent.gossip import new_incarnation
from agent.membership import Membership
from agent.model import Decision, Local, Mode, Snapshot, Step, effective_limit
from agent.transport import TransportError, UdpTransport
from agent.units import format_rate, to_bps

log = logging.getLogger("drl.agent")

CLUSTER = "drl"     # one cluster per key; the header field keeps two keyed clusters apart on one port
CLASS_ID = 0        # every --class spec feeds one limited class (README: traffic classes)


class StartupError(Exception):
    """A resource could not be acquired; one line, nothing attached."""


def run(config: Config) -> int:
    """Run the agent until SIGTERM/SIGINT or `drl-agent down`; the process exit code."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s drl-agent %(message)s")
    # Until the loop runs, SIGTERM unwinds like Ctrl-C, so whatever startup attached is detached.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        agent = Agent(config)
    except StartupError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        log.info("event=stopped_during_startup")
        return 1
    with agent:
        return agent.serve()


def udp_transport(cfg: Config) -> UdpTransport:
    """The gossip transport the agent runs with: UDP on ``--listen``."""
    return UdpTransport.bind(cfg.listen, [p.addr for p in cfg.peers], node_id=cfg.node_id, cluster=CLUSTER,
                             key=cfg.key, branching=cfg.branching, incarnation=new_incarnation())


def kernel_datapath(cfg: Config, gossip_port: int) -> Datapath:
    """The datapath the agent runs with, on ``--iface``; our own gossip is never policed."""
    return Datapath(cfg.iface, cfg.classes, class_ids=[CLASS_ID] * len(cfg.classes), max_flows=cfg.max_flows,
                    exempt_udp_ports=(gossip_port,))


class Agent:
    """The agent's state and tick.  ``transport(config)`` and ``datapath(config, gossip_port)``
    build its two resources; tests pass in-memory ones (tests/unit/test_daemon.py).  A
    datapath needs attach, close, set_class, set_sample_probability, read_counters and
    read_flows; a transport address, resolved, peer_addrs, stats, poll, publish, send,
    close (and sock, for ``serve``)."""

    def __init__(self, config: Config, transport: Callable[[Config], Any] = udp_transport,
                 datapath: Callable[[Config, int], Any] = kernel_datapath):
        self.cfg = config
        self.alloc = config.allocator
        self._stack = contextlib.ExitStack()
        try:
            self._acquire(transport, datapath)
        except (ControlError, TransportError, DatapathError, StateFileError) as e:
            self._stack.close()
            raise StartupError(str(e)) from None
        except BaseException:
            self._stack.close()
            raise
        self.estimator = Estimator(ewma=config.ewma, flow_ewma=config.flow_ewma)
        self.inbox: list = []
        self.stopping = False
        self.started = time.monotonic()
        self.last: tuple[Snapshot, Step, Counters] | None = None
        self._facts: dict[str, Any] = {}

    def _acquire(self, transport: Callable[[Config], Any], datapath: Callable[[Config, int], Any]) -> None:
        """Sockets, state and BPF, in the order that leaves nothing attached if one fails."""
        cfg = self.cfg
        self.control = ControlServer(cfg.socket_path)
        self._stack.callback(self.control.close)
        self.transport = transport(cfg)
        self._stack.callback(self.transport.close)
        names = {self.transport.resolved[p.addr]: p.node_id for p in cfg.peers if p.node_id}
        self.members = Membership(cfg.node_id, self.transport.peer_addrs, cfg.peer_timeout_s, names=names)
        self.statefile = StateFile.for_allocator(self.alloc, cfg)
        members = self.members.view(CLASS_ID, time.monotonic()).members
        self.state = self.statefile.load() if self.statefile else None
        if self.state is None:
            self.state = self.alloc.initial_state(cfg.node_id, members)
        self.dp = datapath(cfg, self.transport.address[1])
        self._stack.callback(self.dp.close)
        self.dp.set_sample_probability(cfg.sample_probability)
        self.dp.attach()

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._stack.close()
            log.info("event=stopped iface=%s detached=yes", self.cfg.iface)
        except DatapathError as e:
            log.error("event=stop_failed error=%r", str(e))

    # -- the loop ---------------------------------------------------------------------------

    def serve(self) -> int:
        cfg = self.cfg
        log.info("event=started node=%s iface=%s allocator=%s global=%s peers=%d listen=%s:%d interval_ms=%g auth=%s",
                 cfg.node_id, cfg.iface, self.alloc.name, format_rate(cfg.global_Bps), len(cfg.peers),
                 *self.transport.address, cfg.interval_s * 1000, "hmac-sha256" if cfg.key else "none")
        sel, wakeup = self._selector()
        next_tick = time.monotonic()
        try:
            while not self.stopping:
                now = time.monotonic()
                if now >= next_tick:
                    self.tick(now)
                    # a late tick is not made up: the next one is a whole interval away
                    next_tick = max(next_tick + cfg.interval_s, now + cfg.interval_s / 2)
                for key, _ in sel.select(max(0.0, next_tick - time.monotonic())):
                    key.data()
        except DatapathError as e:
            log.error("event=datapath_error error=%r", str(e))
            return 1
        finally:
            sel.close()
            wakeup.close()
        return 0

    def _selector(self) -> tuple[selectors.BaseSelector, socket.socket]:
        sel = selectors.DefaultSelector()
        sel.register(self.transport.sock, selectors.EVENT_READ, self.receive)
        sel.register(self.control, selectors.EVENT_READ, self._serve_control)
        rx, tx = socket.socketpair()
        rx.setblocking(False)
        tx.setblocking(False)
        signal.set_wakeup_fd(tx.fileno())
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        sel.register(rx, selectors.EVENT_READ, lambda: rx.recv(64))
        self._stack.callback(tx.close)
        self._stack.callback(signal.set_wakeup_fd, -1)
        return sel, rx

    def _on_signal(self, signum, frame) -> None:
        log.info("event=signal name=%s", signal.Signals(signum).name)
        self.stopping = True

    def receive(self) -> None:
        """Hand every datagram that arrived to membership, and point-to-point ones to the inbox."""
        now = time.monotonic()
        for rx in self.transport.poll(now):
            self.members.observe(rx, now)
            env = rx.envelope
            if env is not None and rx.header.class_id == CLASS_ID:
                self.inbox.append(env)

    def _serve_control(self) -> None:
        self.control.handle_one({"status": lambda: {"ok": True, "status": self.status()},
                                 "down": self._down})

    def _down(self) -> dict:
        log.info("event=down_requested")
        self.stopping = True
        return {"ok": True}

    def tick(self, now: float) -> None:
        cfg = self.cfg
        counters = self.dp.read_counters()[CLASS_ID]
        local = self.estimator.update(now, counters, self.dp.read_flows(), now_ns())
        snap = Snapshot(now=now, node_id=cfg.node_id, interval_s=cfg.interval_s, global_Bps=cfg.global_Bps,
                        local=local, view=self.members.view(CLASS_ID, now), inbox=tuple(self.inbox))
        self.inbox = []
        step = self.alloc.step(self.state, snap)
        self.state = step.state
        self._enforce(step.decision)
        if self.statefile:
            self.statefile.save(self.state)   # before the outbox: a restored node sent nothing it forgot
        self.transport.publish({CLASS_ID: step.decision.publish}, now)
        for env in step.outbox:
            self.transport.send(env, CLASS_ID, now)
        self.last = (snap, step, counters)
        self._log_changes(now, step.decision)

    def _enforce(self, d: Decision) -> None:
        self.dp.set_class(CLASS_ID, d.mode, rate_Bps=d.limit_Bps, burst_bytes=self.cfg.burst_bytes,
                          drop_probability=d.drop_probability, safe_rate_Bps=self.cfg.safe_Bps,
                          timeout_s=self.cfg.failsafe_s, quota_bytes=d.quota_bytes)

    def _log_changes(self, now: float, d: Decision) -> None:
        facts = {f"peer {p['node_id']} ({p['address']})": p["state"] for p in self.members.status(now)}
        facts["mode"] = Mode(d.mode).name.lower()
        facts["warning"] = d.info.get("warning")
        for what, value in facts.items():
            if what in self._facts and self._facts[what] != value:
                log.info("event=change what=%r now=%r", what, value)
        self._facts = facts

    # -- status -----------------------------------------------------------------------------

    def status(self) -> dict:
        now = time.monotonic()
        cfg = self.cfg
        out = {"node_id": cfg.node_id, "interface": cfg.iface, "allocator": self.alloc.name,
               "interval_s": cfg.interval_s, "uptime_s": now - self.started,
               "listen": "%s:%d" % self.transport.address[:2], "authenticated": cfg.key is not None,
               "global_limit_bps": to_bps(cfg.global_Bps), "safe_rate_bps": to_bps(cfg.safe_Bps),
               "gossip": self.transport.stats.as_dict(now), "peers": self.members.status(now)}
        if self.last is None:
            snap, d, c, local = None, Decision(Mode.PASS, 0.0), Counters(), Local(0.0)
        else:
            snap, step, c = self.last
            d, local = step.decision, snap.local
        out.update({
            "effective_limit_bps": to_bps(effective_limit(snap) if snap else cfg.global_Bps),
            "local_limit_bps": to_bps(_local_limit(d, local)), "mode": Mode(d.mode).name.lower(),
            "drop_probability": d.drop_probability, "demand_bps": to_bps(local.demand_Bps),
            "rate_bps": to_bps(local.sent_Bps), "flows": len(local.flow_rates_Bps),
            "max_flow_bps": to_bps(max(local.flow_rates_Bps, default=0.0)),
            "passed_bytes": c.passed_bytes, "passed_packets": c.passed_packets,
            "dropped_bytes": c.dropped_bytes, "dropped_packets": c.dropped_packets,
            "quota_bytes_left": d.quota_bytes, "allocator_state": _allocator_state(d.info)})
        return out


def _local_limit(d: Decision, local: Local) -> float:
    """What this host may send now: the bucket rate, or for random drop what survives it."""
    if d.mode == Mode.BUCKET:
        return d.limit_Bps
    if d.mode == Mode.DROP:
        return local.demand_Bps * (1.0 - d.drop_probability)
    return local.demand_Bps


def _allocator_state(info: Any) -> Any:
    """Decision.info as drlctl shows it: JSON values, and rates in bits/s like the rest of
    the status.  Allocators keep bytes/s (``*_Bps``); each such key, nested ones too,
    becomes ``*_bps`` with 8x the value."""
    return json.loads(json.dumps(info, default=str), object_hook=_in_bits)


def _in_bits(d: dict) -> dict:
    out = {}
    for key, value in d.items():
        if key.endswith("_Bps"):
            key, value = key.removesuffix("_Bps") + "_bps", None if value is None else to_bps(value)
        out[key] = value
    return out


class StateFileError(Exception):
    """The allocator's saved state cannot be read; one line."""


class StateFile:
    """An allocator's state on disk, for allocators with dump_state/load_state (dqmp).

    Written every tick with write-to-temp + rename, so a crash leaves the old
    or the new snapshot, never half of one."""

    def __init__(self, alloc, path: Path):
        self.alloc, self.path = alloc, path

    @classmethod
    def for_allocator(cls, alloc, cfg: Config) -> "StateFile | None":
        if not hasattr(alloc, "dump_state"):
            return None
        return cls(alloc, Path(cfg.state_dir) / f"{alloc.name}-{cfg.node_id}.json")

    def load(self) -> Any:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise StateFileError(f"state file {self.path} is unreadable ({e}); remove it to start afresh") from None
        try:
            state = self.alloc.load_state(data)
        except (KeyError, TypeError, ValueError) as e:
            raise StateFileError(f"state file {self.path} does not hold {self.alloc.name} state ({e}); "
                                 "remove it to start afresh") from None
        log.info("event=state_restored file=%s", self.path)
        return state

    def save(self, state: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.alloc.dump_state(state)))
        os.replace(tmp, self.path)
