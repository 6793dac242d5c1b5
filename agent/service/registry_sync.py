"""Following etcd: its members become the gossip targets and N, its classes the classes in force.

    sync = RegistrySync(cfg, transport, members)
    classes = sync.start()          # --registry: register, wait for a first view; RegistryError
    sync.follow(apply_classes)      # every tick: what changed in etcd since the last one
    sync.close(leave=True)          # at a stop we leave; after a failure our lease expires

Never on the per-interval path: the registry's thread watches etcd and ``follow`` reads its
last view, so a tick never waits for etcd.  While etcd is unreachable the last members and
classes stay and gossip goes on.  Without --registry (``registry`` None) only --peers count.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

from drl.agent import logs
from drl.agent.cluster.registry import Registry, RegistryError, RegistryView
from drl.agent.config.build import ClassConf, Config, ConfigError
from drl.agent.gossip.interface import TransportPort
from drl.agent.gossip.membership import Membership, liveness_timeout
from drl.agent.service.class_table import Changes
from drl.agent.service.rates import slack_s

log = logs.get_logger("drl.agent")

# a first view of etcd takes milliseconds; more than this and the agent starts without it
REGISTRY_START_S = 3.0


class RegistrySync:
    """The registry, and what of it this agent has applied."""

    def __init__(self, cfg: Config, transport: TransportPort, members: Membership):
        self.cfg, self.transport, self.members = cfg, transport, members
        self.registry: Registry | None = None
        self.classes_refused: str | None = None    # why etcd's classes do not check, while they do not
        self._peers_applied = ({p.addr: p.node_id for p in cfg.peers}, {})      # (members, lost)
        self._bad_keys: tuple[str, ...] = ()
        self._seen: tuple[int, dict | None] = (-1, None)   # (Registry.changed(), the classes applied)
        self._up = True

    @property
    def classes(self) -> dict | None:
        """etcd's class tables last applied (a reload puts them on top of the file's); None
        without a registry or before its first view."""
        return self._seen[1]

    def start(self) -> tuple[ClassConf, ...]:
        """Register in etcd and wait (REGISTRY_START_S at most) for its first view: the
        members to start with and the classes in force.  Without one the agent cannot know
        its peers, so it does not start (a 1/N share of a cluster it cannot see would be
        the whole limit), unless --peers names them."""
        cfg = self.cfg
        self.registry = Registry(dataclasses.replace(cfg.registry, mark=cfg.gossip_mark), cfg.node_id,
                                 self.transport.address, self.transport.core.incarnation)
        self.registry.start()
        deadline = time.monotonic() + REGISTRY_START_S
        while not self.registry.view().reachable and time.monotonic() < deadline:
            time.sleep(0.01)
        seen, view = self.registry.snapshot()
        self._up = view.reachable
        if not view.reachable:
            if not cfg.peers or not cfg.classes:
                raise RegistryError(f"no view of the cluster from etcd ({view.error}): without it this agent "
                                    f"knows neither its peers nor, if it has none of its own, its classes")
            log.warning("registry", state="unreachable", error=view.error)
            return cfg.classes
        self._follow_members(view)
        self._seen = (seen, view.classes)
        try:
            confs = cfg.live_classes(view.classes)
        except (ConfigError, ValueError) as e:      # one bad table in etcd must not keep every agent down
            if not cfg.classes:
                raise RegistryError(f"etcd's classes do not check and this agent has none of its own: {e}") from None
            self._refuse_classes(e)
            return cfg.classes
        if not confs:
            raise RegistryError(f"no class to limit: none given (--global, --config) and none in etcd under "
                                f"{cfg.registry.prefix}classes/")
        return confs

    def close(self, leave: bool) -> None:
        if self.registry is not None:
            self.registry.close(leave=leave)

    def follow(self, apply_classes: Callable[[tuple[ClassConf, ...]], Changes]) -> None:
        """What changed in etcd since the last tick: members, then classes (``apply_classes``
        makes them the classes in force, raising like ClassTable.apply, having changed nothing)."""
        if self.registry is None:
            return
        seen, view = self.registry.snapshot()
        if seen == self._seen[0]:
            return
        self._seen = (seen, self._seen[1])
        self._log_reachable(view)
        if not view.reachable:
            return
        if view.bad_keys != self._bad_keys:
            self._bad_keys = view.bad_keys
            if view.bad_keys:
                log.warning("registry_bad_keys", keys=list(view.bad_keys))     # an etcdctl typo, say
        self._follow_members(view)
        if view.classes != self._seen[1]:
            self._seen = (seen, view.classes)
            self._follow_classes(view.classes, apply_classes)

    def _log_reachable(self, view: RegistryView) -> None:
        if view.reachable != self._up:
            self._up = view.reachable
            if view.reachable:
                log.info("registry", state="reachable")
            else:
                log.warning("registry", state="unreachable", error=view.error)

    def _follow_classes(self, tables: dict[str, dict],
                        apply_classes: Callable[[tuple[ClassConf, ...]], Changes]) -> None:
        """etcd's classes on top of ours; a set that does not check changes nothing."""
        try:
            confs = self.cfg.live_classes(tables)
            if not confs:
                raise ConfigError("no class left: the agent keeps the ones it has")
            changes = apply_classes(confs)
        except (ConfigError, ValueError) as e:
            self._refuse_classes(e)
            return
        self.classes_refused = None
        log.info("registry_classes", classes=len(confs), added=list(changes.added),
                 changed=list(changes.changed), removed=list(changes.removed))

    def _refuse_classes(self, e: Exception) -> None:
        """etcd's classes do not check: the agent keeps its own, says why, and shows it in status."""
        self.classes_refused = str(e)
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
        self.members.set_peers(heard_from, timeout_s=timeout_s, slack_s=slack_s(cfg, n),
                               lost=[a for a, node in heard_from.items() if node in lost.values()])
        log.info("members", n=1 + n, joined=sorted(str(wanted[a]) for a in wanted.keys() - before.keys()) or None,
                 left=sorted(str(before[a]) for a in before.keys() - wanted.keys() - lost.keys()) or None,
                 lost=sorted(lost.values()) or None)
        for addr, why in self.transport.unresolved.items():
            log.warning("peer_unresolved", peer=f"{({**wanted, **lost})[addr]}@{addr[0]}:{addr[1]}", error=why)
