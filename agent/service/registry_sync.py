"""Following etcd: its members become the gossip targets and N, its classes the classes in force.

    sync = RegistrySync(cfg, transport, members)
    classes = sync.start()          # --registry: register, wait for a first view; RegistryError
    sync.follow(apply_classes, book)    # every tick: what changed in etcd since the last one
    sync.close(leave=True)          # at a stop we leave; after a failure our lease expires

Never on the per-interval path: the registry's thread watches etcd and ``follow`` reads its
last view, so a tick never waits for etcd.  While etcd is unreachable the last members and
classes stay and gossip goes on.  Without --registry (``registry`` None) only --peers count.

etcd's data is the operator's, and its loss or a hand edit does not change a limit: a class
applied from etcd whose key goes without a tombstone (``drlctl class delete``) stays in
force at the newest limit this agent holds, and is written back; a member key deleted while
its agent lives is written again by that agent; a member that goes and was never heard by
gossip (a key written by hand, no agent behind it) is forgotten, not reserved for good.
"""
from __future__ import annotations

import dataclasses
import random
import time
from typing import Callable

from drl.agent import logs
from drl.agent.cluster.limits import LimitBook
from drl.agent.cluster.registry import Registry, RegistryError, RegistryView
from drl.agent.config.build import ClassConf, Config, ConfigError
from drl.agent.gossip.interface import TransportPort
from drl.agent.gossip.membership import Membership, liveness_timeout
from drl.agent.service.class_table import Changes
from drl.agent.service.rates import slack_s
from drl.agent.units import UnitError, parse_rate, to_bps

log = logs.get_logger("drl.agent")

# a class etcd lost is written back after a random delay of up to this, so that of N agents
# holding it one writes and the others find it there (Registry.restore_class)
RESTORE_DELAY_S = 1.0


class RegistrySync:
    """The registry, and what of it this agent has applied."""

    def __init__(self, cfg: Config, transport: TransportPort, members: Membership):
        self.cfg, self.transport, self.members = cfg, transport, members
        self.registry: Registry | None = None
        self.classes_refused: str | None = None    # why etcd's classes do not check, while they do not
        self._peers_applied = ({p.addr: p.node_id for p in cfg.peers}, {})      # (members, lost)
        self._bad_keys: tuple[str, ...] = ()
        self._seen: tuple[int, dict | None] = (-1, None)   # (Registry.changed(), the classes applied)
        self._applied: dict[str, dict] = {}     # etcd's tables last applied without a refusal
        self._kept: dict[str, dict] = {}        # of those, the ones etcd lost: in force until it has them again
        self._up = True

    @property
    def classes(self) -> dict | None:
        """etcd's class tables last applied (a reload puts them on top of the file's); None
        without a registry or before its first view."""
        return self._seen[1]

    def start(self) -> tuple[ClassConf, ...]:
        """Register in etcd and wait (--registry-timeout at most) for its first view: the
        members to start with and the classes in force.  Without one the agent cannot know
        its peers, so it does not start (a 1/N share of a cluster it cannot see would be
        the whole limit), unless --peers names them."""
        cfg = self.cfg
        self.registry = Registry(dataclasses.replace(cfg.registry, mark=cfg.gossip_mark), cfg.node_id,
                                 self.transport.address, self.transport.incarnation,
                                 public_key=cfg.node_keys.public if cfg.node_keys else "")
        self.registry.start()
        deadline = time.monotonic() + cfg.registry.start_timeout_s
        while not self.registry.view().reachable and time.monotonic() < deadline:
            time.sleep(0.01)
        seen, view = self.registry.snapshot()
        self._up = view.reachable
        if not view.reachable:
            if not cfg.peers or not cfg.classes:
                raise RegistryError(f"no view of the cluster from etcd in {cfg.registry.start_timeout_s:g} s "
                                    f"(--registry-timeout; {view.error}): without it this agent "
                                    f"knows neither its peers nor, if it has none of its own, its classes")
            log.warning("registry", state="unreachable", error=view.error)
            return cfg.classes
        self._follow_members(view)
        self._seen = (seen, view.classes)
        try:
            confs = cfg.live_classes(view.classes)
            self._applied = dict(view.classes)
        except (ConfigError, ValueError) as e:      # one bad table in etcd must not keep every agent down
            if not cfg.classes:
                raise RegistryError(f"etcd's classes do not check and this agent has none of its own: {e}") from None
            self._refuse_classes(e)
            return cfg.classes
        if not confs:
            raise RegistryError(f"no class to limit: none given (--global, --config) and none in etcd under "
                                f"{cfg.registry.prefix}classes/")
        return confs

    def publish_key(self, public: str) -> None:
        """A reloaded identity's public key, in our member record (none without a registry)."""
        if self.registry is not None:
            self.registry.publish_key(public)

    def close(self, leave: bool) -> None:
        if self.registry is not None:
            self.registry.close(leave=leave)

    def follow(self, apply_classes: Callable[[tuple[ClassConf, ...]], Changes], book: LimitBook) -> None:
        """What changed in etcd since the last tick: members, then classes (``apply_classes``
        makes them the classes in force, raising like ClassTable.apply, having changed nothing;
        ``book`` holds the limits in force, which a class etcd lost is written back with)."""
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
        live = self._live_tables(view, book)
        if live != self._seen[1]:
            self._seen = (seen, live)
            self._follow_classes(live, apply_classes)

    def _live_tables(self, view: RegistryView, book: LimitBook) -> dict[str, dict]:
        """etcd's tables, and the ones it lost: a table applied from etcd whose key went without
        a tombstone (a wipe, an etcd restored empty, an ``etcdctl del``) stays in force, as it was
        applied, and is written back with the newest limit this agent holds, so the operator's
        last limit outlives etcd's copy of it.  A tombstone (``drlctl class delete``) is a
        delete: the class is dropped here, and an agent with a class of that name of its own
        goes back to it."""
        lost = {name: table for name, table in self._applied.items()
                if name not in view.classes and name not in view.deleted and name not in self._kept}
        for name, table in lost.items():
            restored = self._with_newest_limit(name, table, book)
            self.registry.restore_class(restored, random.uniform(0.0, RESTORE_DELAY_S))
            log.warning("registry_class_lost", class_=name, written_back=restored.get("global"))
        self._kept = {name: table for name, table in {**self._kept, **lost}.items()
                      if name not in view.classes and name not in view.deleted}
        return {**self._kept, **view.classes}

    def _with_newest_limit(self, name: str, table: dict, book: LimitBook) -> dict:
        """``table`` as applied, its ``global`` the newest limit the book holds for the class
        when that is not what the table gives (gossip brought a newer one)."""
        try:
            limit = book.get(name)
            conf = next(c for c in self.cfg.live_classes(self._applied) if c.name == name)
        except (KeyError, StopIteration, ConfigError, ValueError):
            return dict(table)
        if conf.global_Bps == limit.global_Bps:
            return dict(table)
        return {**table, "global": rate_text(limit.global_Bps)}

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
        self._applied = dict(tables)
        self.classes_refused = None
        log.info("registry_classes", classes=len(confs), added=list(changes.added),
                 changed=list(changes.changed), removed=list(changes.removed))

    def _refuse_classes(self, e: Exception) -> None:
        """etcd's classes do not check: the agent keeps its own, says why, and shows it in status."""
        self.classes_refused = str(e)
        log.error("registry_classes_refused", error=str(e))

    def _follow_members(self, view: RegistryView) -> None:
        """The registry's members (and --peers) become the gossip targets and N; a lost one
        (killed: its lease expired) stays a target, in N and reserved (Membership.set_peers)."""
        cfg = self.cfg
        if cfg.node_keys is not None:       # members' published keys: per-node signatures (core.keys_of)
            self.transport.set_registry_keys({m.node_id: m.keys for m in view.members.values()})
        wanted = {m.addr: m.node_id for m in view.members.values() if m.node_id != cfg.node_id}
        wanted.update({p.addr: p.node_id for p in cfg.peers})
        # a lost member gossip never heard (a key written by hand, no agent behind it) has no
        # datapath we know of to reserve for: forgotten, not reserved until its id registers
        # again, which may be never.  A heard one (killed: its datapath enforces its fail-safe)
        # stays lost and reserved.
        heard = {row["node_id"] for row in self.members.status(time.monotonic()) if row["last_seen_s"] is not None}
        lost = {m.addr: m.node_id for m in view.lost.values() if m.addr not in wanted and m.node_id in heard}
        if (wanted, lost) == self._peers_applied:
            return
        (before, _), self._peers_applied = self._peers_applied, (wanted, lost)
        n = len({**wanted, **lost})         # the peers we gossip to, and whose datapaths count
        timeout_s = None if cfg.peer_timeout_fixed else liveness_timeout(cfg.interval_s, n, cfg.branching)
        heard_from = self.transport.set_peers({**wanted, **lost}, timeout_s=timeout_s)
        self.members.set_peers(heard_from, timeout_s=timeout_s, slack_s=slack_s(cfg, n),
                               lost=[a for a, node in heard_from.items() if node in lost.values()])
        log.info("members", n=1 + n, joined=sorted(str(wanted[a]) for a in wanted.keys() - before.keys()) or None,
                 left=sorted(str(before[a]) for a in before.keys() - wanted.keys() - lost.keys()) or None,
                 lost=sorted(lost.values()) or None)
        for addr, why in self.transport.unresolved.items():
            log.warning("peer_unresolved", peer=f"{({**wanted, **lost})[addr]}@{addr[0]}:{addr[1]}", error=why)


def rate_text(rate_Bps: float) -> str:
    """bytes/s as a rate of the config file that parses back to exactly ``rate_Bps``:
    '24mbit' where it is a whole number of a unit, else in bit/s."""
    bits = to_bps(rate_Bps)
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        text = f"{int(bits // scale)}{unit}"
        try:
            if bits % scale == 0 and parse_rate(text) == rate_Bps:
                return text
        except UnitError:
            pass
    return f"{bits!r}bit"
