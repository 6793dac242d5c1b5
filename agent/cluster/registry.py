"""Members and classes of a cluster from etcd (``drl-agent up --registry etcd://... --cluster NAME``).

    reg = Registry(RegistryConfig(parse_registry("etcd://10.0.0.9:2379"), "prod"), "a", ("10.0.0.1", 7470), 1)
    reg.start()                       # returns at once; a thread registers, reads and watches
    if reg.changed() != seen:         # every tick: cheap
        view = reg.view()             # members, classes, reachable
    reg.put_class({"name": "gold", "global": "100mbit"})   # written now, or when etcd is back
    reg.restore_class(table, delay_s=0.4)   # etcd lost a class we hold: put it back unless someone did
    reg.close()                       # revokes the lease: the others see us leave at once

etcd is where agents find each other and read their limits, never on the
per-interval path: the tick reads the last snapshot, and while etcd is away
that snapshot stays (``reachable`` false) and gossip goes on.  The key layout,
the failure behaviour and the choice of client are in docs/registry.md.
"""
from __future__ import annotations

import dataclasses
import json
import re
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from drl.agent.cluster.etcd import EtcdError, Gateway, Watch, make_ssl_context
from drl.agent.gossip.peers import AddressError, HostPort, format_addr, parse_hostport

SCHEME = "etcd://"
NAME = re.compile(r"(?!\.+$)[A-Za-z0-9_.-]{1,64}")     # cluster and class names: one path segment of a key
                                                      # (not . or ..: /drl/../ would read as a path)
CALL_TIMEOUT_S = 1.0        # one request; a hung etcd counts as unreachable after this
BACKOFF_S = (0.1, 1.0)      # first and longest wait between attempts


class IdTaken(EtcdError):
    """Our node id is another live agent's (its key, another address)."""


class RegistryError(Exception):
    """A bad --registry/--cluster, unreadable TLS files, or (import) etcd unreachable; one line."""


@dataclass(frozen=True)
class RegistryConfig:
    endpoints: tuple[HostPort, ...]
    cluster: str
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    ttl_s: float = 5.0
    mark: int | None = None      # SO_MARK of the agent's connections (its gossip mark: never policed)
    start_timeout_s: float = 30.0   # --registry-timeout: a starting agent's wait for its first view

    @property
    def prefix(self) -> str:
        return f"/drl/{self.cluster}/"

    @property
    def tls(self) -> bool:
        return bool(self.ca or self.cert)

    def gateways(self) -> list[Gateway]:
        """One client per endpoint (https when TLS files are given); raises RegistryError."""
        try:
            ctx = make_ssl_context(self.ca, self.cert, self.key) if self.tls else None
        except EtcdError as e:
            raise RegistryError(str(e)) from None
        return [Gateway(ep, ctx, CALL_TIMEOUT_S, self.mark) for ep in self.endpoints]


def parse_registry(text: str) -> tuple[HostPort, ...]:
    """``"etcd://h1:2379,[fd00::9]:2379"`` -> (("h1", 2379), ("fd00::9", 2379)); raises RegistryError."""
    text = (text or "").strip()
    if not text.startswith(SCHEME):
        raise RegistryError(f"--registry: expected etcd://HOST:PORT[,HOST:PORT...], got {text!r}")
    items = [i.strip().removeprefix(SCHEME) for i in text[len(SCHEME):].split(",")]   # a list may repeat it
    if not all(items):
        raise RegistryError(f"--registry: empty endpoint in {text!r}")
    try:
        endpoints = tuple(parse_hostport(i) for i in items)
    except AddressError as e:
        raise RegistryError(f"--registry: {e}") from None
    dups = sorted({format_addr(e) for e in endpoints if endpoints.count(e) > 1})
    if dups:
        raise RegistryError(f"--registry: endpoint listed twice: {', '.join(dups)}")
    if len({port for _, port in endpoints}) > 1:
        # the datapath lets the agent's etcd connections pass by their port (bpf/classify.h exempt)
        raise RegistryError(f"--registry: give every endpoint the same port, got {text!r}")
    return endpoints


def registry_config(registry: str, cluster: str | None, ca: str | None = None, cert: str | None = None,
                    key: str | None = None, start_timeout_s: float = 30.0) -> RegistryConfig:
    """The options as given -> RegistryConfig, checked (TLS files loaded once); raises RegistryError."""
    endpoints = parse_registry(registry)
    if not cluster:
        raise RegistryError("--registry needs --cluster NAME: the agents of one cluster share it")
    if not NAME.fullmatch(cluster):
        raise RegistryError(f"--cluster {cluster!r}: use 1-64 of A-Z a-z 0-9 _ . -, not dots alone")
    if bool(cert) != bool(key):
        raise RegistryError("--registry-cert and --registry-key go together (the client certificate and its key)")
    cfg = RegistryConfig(endpoints, cluster, ca, cert, key, start_timeout_s=start_timeout_s)
    cfg.gateways()
    return cfg


@dataclass(frozen=True)
class Member:
    node_id: str
    addr: HostPort              # its gossip address
    incarnation: int = 0
    left: bool = False          # it said so before revoking its lease (Registry.close)
    keys: tuple[str, ...] = ()  # its per-node public keys, base64 (agent/gossip/signing.py)


@dataclass(frozen=True)
class RegistryView:
    members: dict[str, Member]          # node id -> Member, this agent included
    classes: dict[str, dict]            # class name -> its [[class]] table
    reachable: bool
    since: float                        # Registry's clock() when `reachable` last changed
    error: str = ""                     # why etcd is unreachable
    bad_keys: tuple[str, ...] = ()      # keys under the prefix whose value is not of the layout (ignored)
    # members whose key went without their leaving (an expired lease: killed, hung, cut off
    # from etcd), until their id registers again: their datapath may still pass traffic
    lost: dict[str, Member] = field(default_factory=dict)
    genesis: dict[str, tuple[str, ...]] = field(default_factory=dict)   # class -> its founders
    # classes deleted on purpose (delete_class: a tombstone under deleted/<class>); a class whose
    # key goes without one was lost, and the agents put back what they hold (docs/registry.md)
    deleted: frozenset[str] = frozenset()


class Registry:
    """This agent's lease-bound entry, and a watched copy of its cluster's prefix."""

    def __init__(self, cfg: RegistryConfig, node_id: str, gossip_addr: HostPort, incarnation: int, *,
                 clock: Callable[[], float] = time.monotonic, public_key: str = ""):
        self.cfg, self.node_id, self.clock = cfg, node_id, clock
        # public_key: this agent's per-node key (agent/gossip/signing.py), for the others to verify with
        self._me = json.dumps({"addr": format_addr(gossip_addr), "incarnation": incarnation,
                               **({"keys": [public_key]} if public_key else {})}).encode()
        self._gateways = cfg.gateways()
        self._lock = threading.Lock()
        self._wake = threading.Event()          # a pending write, a dead watch, close()
        self._stopping = threading.Event()
        self._kvs: dict[str, bytes] = {}
        self._pending: dict[str, dict] = {}     # class name -> table not yet written
        self._restores: dict[str, tuple[float, dict]] = {}    # class name -> (due, table): restore_class
        self._reregister = False        # the watch saw our member key deleted while we hold the lease
        self._lease = 0
        self._registered = False        # our member key is ours (not another agent's under our id)
        self._watch: Watch | None = None
        self._watch_error: str | None = None
        self._changes = 0
        self._left: set[str] = set()            # ids that said they leave (close()): not lost
        self._view = RegistryView({}, {}, False, clock(), "not connected yet")
        self._thread = threading.Thread(target=self._run, name="drl-registry", daemon=True)

    # --- the agent's side: all cheap, never blocking on etcd -----------------

    def start(self) -> None:
        self._thread.start()

    def view(self) -> RegistryView:
        return self._view

    def changed(self) -> int:
        return self._changes

    def snapshot(self) -> tuple[int, RegistryView]:
        """(changed(), view()) of one instant: read apart, a change published in between
        would be counted as seen and never applied."""
        with self._lock:
            return self._changes, self._view

    def put_class(self, table: dict) -> None:
        name = table.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise RegistryError(f"class name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
        with self._lock:
            self._pending[name] = dict(table)
            self._restores.pop(name, None)          # a newer word on the class than what we held
        self._wake.set()

    def restore_class(self, table: dict, delay_s: float) -> None:
        """Put back a class etcd lost (a wipe, a key deleted by hand): ``table`` is written
        ``delay_s`` from now (a random delay of each agent's, so that not all of them write at
        once) only if etcd still has no such class and no tombstone for it (delete_class), in
        one transaction: of N agents the first writes it, and nothing written meanwhile (an
        operator's, another agent's) is replaced.  Kept across an outage, like put_class."""
        name = table.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise RegistryError(f"class name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
        with self._lock:
            if name not in self._pending:
                self._restores[name] = (time.monotonic() + max(0.0, delay_s), dict(table))
        self._wake.set()

    def founders(self, class_name: str, members: tuple[str, ...]) -> tuple[str, ...]:
        """The members a class was founded with, the same on every agent: the first agent to
        start the class writes ``members`` (its view then) under genesis/<class> in one
        transaction, and every later one reads them.  A genesis none of whose members is
        registered any more (the whole cluster was replaced) is founded again.  Diffusion
        allocators take shares only as founders; the others join (docs/allocators.md).
        Blocks for one or two etcd calls, at a class's start only; ``members`` when etcd
        does not answer (RegistryError is not raised: a class must start)."""
        view = self._view
        known = view.genesis.get(class_name)
        if known is not None and (set(known) & set(view.members) or not view.reachable):
            return known                        # the watched copy: no etcd call
        key = self.cfg.prefix + "genesis/" + class_name
        for gw in self._gateways:
            try:
                for _ in range(3):              # lost a race: read the winner's
                    found = gw.get(key)
                    if found is not None:
                        genesis = tuple(json.loads(found[0])["members"])
                        # refound only what no registered member founded, as etcd says now
                        if set(genesis) & set(_registered(gw, self.cfg.prefix)):
                            return genesis
                    if gw.put_if(key, json.dumps({"members": sorted(members)}).encode(), found[1] if found else 0):
                        return tuple(sorted(members))
            except (EtcdError, ValueError, KeyError, TypeError):
                continue
        return known or tuple(sorted(members))

    def publish_key(self, public_key: str) -> None:
        """A new per-node public key (a reload after a rotation) in our member record, before the
        previous one (kept: peers that have not seen the record yet still verify what we signed
        before), written by the registry thread at once."""
        with self._lock:
            me = json.loads(self._me)
            keys = [public_key, *[k for k in me.get("keys", ()) if k != public_key][:1]]
            self._me = json.dumps({**me, "keys": keys}).encode()
            self._reregister = True
        self._wake.set()

    def close(self, leave: bool = True) -> None:
        """Stop the threads, then say we leave and revoke the lease, so that our key goes
        now, not after the TTL, and the others know it went on purpose (not ``lost``).
        ``leave=False`` (an agent that failed, its datapath left enforcing) says nothing:
        the key goes with the lease, and the others count us lost, at what our datapath
        may still pass, as after a SIGKILL."""
        self._stopping.set()
        self._wake.set()
        self._close_watch()
        if self._thread.is_alive():
            self._thread.join(timeout=3 * CALL_TIMEOUT_S)
        if self._lease and (leave or not self._registered):
            # an agent refused for a taken id leaves the owner's key alone: written under our
            # lease and revoked, it went, and the live owner with it (left, not even lost)
            leaving = json.dumps({**json.loads(self._me), "left": True}).encode()
            for gw in self._gateways:
                try:
                    if self._registered:
                        gw.put(self._member_key(self.node_id), leaving, self._lease)
                    gw.revoke(self._lease)
                    break
                except EtcdError:
                    continue
        self._lease = 0

    # --- the registry thread --------------------------------------------------

    def _run(self) -> None:
        endpoint, failures = 0, 0           # failures: in a row, since etcd last answered a whole session start
        while not self._stopping.is_set():
            try:
                self._session(self._gateways[endpoint])
            except EtcdError as e:
                failures = 1 if self._view.reachable else failures + 1
                self._publish(reachable=False, error=str(e))
                endpoint = (endpoint + 1) % len(self._gateways)          # fail over in turn
                # jittered: agents started together (a fleet's boot) must not retry in step
                self._stopping.wait(min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (failures - 1)) * random.uniform(0.5, 1.0))

    def _session(self, gw: Gateway) -> None:
        """Register, flush, read everything, then keep alive and follow the watch until a failure."""
        if self._stopping.is_set():         # close() is waiting: no new lease behind its back
            return
        self._register(gw)
        self._flush(gw)
        revision, kvs = gw.range_prefix(self.cfg.prefix)
        with self._lock:
            self._kvs = kvs
        self._publish(reachable=True, error="")
        self._start_watch(gw, revision + 1)
        try:
            self._keep_alive(gw)
        finally:
            self._close_watch()

    def _register(self, gw: Gateway) -> None:
        """Our key, bound to a lease: the old one if it still lives (a short outage), else a new
        one.  Created only if absent, or ours (same gossip address: a previous life of this
        agent); another agent's is an IdTaken, retried like an outage: two agents under one
        id would each count the other's share as their own."""
        if not (self._lease and gw.keepalive(self._lease) > 0):
            self._lease = gw.grant(self.cfg.ttl_s)
        key = self._member_key(self.node_id)
        self._registered = gw.put_if(key, self._me, 0, self._lease)
        if self._registered:
            return
        found = gw.get(key)
        theirs = json.loads(found[0]).get("addr") if found else None
        if theirs is not None and theirs != json.loads(self._me)["addr"]:
            raise IdTaken(f"node id {self.node_id!r} is registered by another agent at {theirs}: "
                          "give each agent its own --node-id")
        gw.put(key, self._me, self._lease)
        self._registered = True

    def _keep_alive(self, gw: Gateway) -> None:
        """Renew the lease, write what put_class leaves, until the watch or a call fails (or close())."""
        period = self.cfg.ttl_s / 3              # two keepalives may fail before the lease expires
        next_keepalive = time.monotonic() + period
        while not self._stopping.is_set():
            with self._lock:
                due = min([next_keepalive, *(when for when, _ in self._restores.values())])
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._watch_error is not None:
                raise EtcdError(self._watch_error)
            if self._reregister:
                # deleted by hand (or a wipe) while our lease lives: nothing else would write it
                # again, and the others would count us lost until the lease ran out
                self._reregister = False
                self._register(gw)
            self._flush(gw)
            if time.monotonic() >= next_keepalive:
                if gw.keepalive(self._lease) <= 0:        # expired while we were slow: register again
                    self._register(gw)
                next_keepalive = time.monotonic() + period

    def _flush(self, gw: Gateway) -> None:
        """Write pending classes; one written is dropped from pending unless replaced meanwhile.
        Then the restores that are due, each once (written or found there already)."""
        with self._lock:
            pending = dict(self._pending)
        for name, table in pending.items():
            _put_class(gw, self.cfg.prefix, table)
            with self._lock:
                if self._pending.get(name) is table:
                    del self._pending[name]
        now = time.monotonic()
        with self._lock:
            due = {name: entry for name, entry in self._restores.items() if entry[0] <= now}
        for name, entry in due.items():
            key = self.cfg.prefix + "classes/" + name
            gw.txn(absent=[key, self.cfg.prefix + "deleted/" + name],
                   present=[], puts={key: _class_value(entry[1])}, deletes=[])
            with self._lock:
                if self._restores.get(name) is entry:
                    del self._restores[name]

    def _start_watch(self, gw: Gateway, revision: int) -> None:
        self._watch_error = None
        self._watch = gw.watch_prefix(self.cfg.prefix, revision)
        threading.Thread(target=self._follow, args=(self._watch,), name="drl-registry-watch", daemon=True).start()

    def _follow(self, watch: Watch) -> None:
        try:
            for events in watch:
                with self._lock:
                    if watch is not self._watch:     # replaced after a failure: the resync has it all
                        return
                    for key, value in events:
                        if value is not None and _says_left(self.cfg.prefix, key, value):
                            self._left.add(key.rsplit("/", 1)[1])     # its delete may come in this batch
                        if value is None and key == self._member_key(self.node_id) and self._registered:
                            self._reregister = True
                            self._wake.set()
                        if value is None:
                            self._kvs.pop(key, None)
                        else:
                            self._kvs[key] = value
                self._publish(reachable=True, error="")
        except EtcdError as e:
            if watch is self._watch:             # not one we closed ourselves
                self._watch_error = str(e)
                self._wake.set()

    def _close_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    # --- the snapshot ----------------------------------------------------------

    def _member_key(self, node_id: str) -> str:
        return self.cfg.prefix + "members/" + node_id

    def _publish(self, reachable: bool, error: str) -> None:
        """Derive a new view from the raw values; bump the counter only if it differs."""
        with self._lock:
            members, classes, bad, genesis, deleted = decode(self.cfg.prefix, self._kvs)
            old = self._view
            for m, member in members.items():
                (self._left.add if member.left else self._left.discard)(m)
            members = {m: member for m, member in members.items() if not member.left}
            lost = {m: member for m, member in {**old.lost, **old.members}.items()
                    if m not in members and m not in self._left and m != self.node_id}
            since = old.since if old.reachable == reachable else self.clock()
            view = RegistryView(members, classes, reachable, since, error, bad, lost, genesis, deleted)
            if view != dataclasses.replace(old, since=since):
                self._view = view
                self._changes += 1


def decode(prefix: str, kvs: dict[str, bytes]) -> tuple[dict[str, Member], dict[str, dict], tuple[str, ...],
                                                         dict[str, tuple[str, ...]], frozenset[str]]:
    """The prefix's raw keys -> (members, classes, keys that are not of the layout, genesis,
    classes deleted on purpose)."""
    members: dict[str, Member] = {}
    classes: dict[str, dict] = {}
    genesis: dict[str, tuple[str, ...]] = {}
    deleted: set[str] = set()
    bad = []
    for key, raw in sorted(kvs.items()):
        kind, _, name = key[len(prefix):].partition("/")
        try:
            value = json.loads(raw)
            if kind == "members":
                members[name] = Member(name, parse_hostport(value["addr"]), int(value.get("incarnation", 0)),
                                       value.get("left") is True, tuple(str(k) for k in value.get("keys", ())))
            elif kind == "classes" and isinstance(value, dict) and value.get("name") == name:
                classes[name] = value
            elif kind == "genesis":
                genesis[name] = tuple(str(m) for m in value["members"])
            elif kind == "deleted" and NAME.fullmatch(name):
                deleted.add(name)           # whatever it holds: the key says it
            else:
                bad.append(key)
        except (ValueError, KeyError, TypeError, AttributeError, AddressError):
            bad.append(key)
    return members, classes, tuple(bad), genesis, frozenset(deleted)


def _says_left(prefix: str, key: str, value: bytes) -> bool:
    if not key.startswith(prefix + "members/"):
        return False
    try:
        return json.loads(value).get("left") is True
    except (ValueError, AttributeError):
        return False


def _registered(gw: Gateway, prefix: str) -> set[str]:
    """The node ids with a member key now (one range read)."""
    _, kvs = gw.range_prefix(prefix + "members/")
    return {key.rsplit("/", 1)[1] for key in kvs}


def _class_value(table: dict) -> bytes:
    return json.dumps(table, sort_keys=True).encode()


def _put_class(gw: Gateway, prefix: str, table: dict) -> None:
    """A [[class]] table under classes/<its name>, as JSON; a tombstone of its name goes in the
    same transaction (written again, the class is live again)."""
    name = table["name"]
    gw.txn(absent=[], present=[], puts={prefix + "classes/" + name: _class_value(table)},
           deletes=[prefix + "deleted/" + name])


def import_classes(cfg: RegistryConfig, tables: list[dict]) -> int:
    """Write each [[class]] table to etcd (replacing a class of the same name); how many.
    Raises RegistryError when no endpoint takes them."""
    errors = []
    for gw in cfg.gateways():
        try:
            for table in tables:
                _put_class(gw, cfg.prefix, table)
            return len(tables)
        except EtcdError as e:
            errors.append(str(e))
    raise RegistryError("etcd unreachable: " + "; ".join(errors))


def delete_class(cfg: RegistryConfig, name: str) -> bool:
    """``drlctl class delete NAME``: the class's key goes and a tombstone (deleted/NAME) comes, in
    one transaction, so every agent sees both at once and drops etcd's table instead of
    putting it back (a key that goes without one was lost: restore_class).  False when etcd
    has no such class (nothing written); raises RegistryError when no endpoint answers."""
    if not NAME.fullmatch(name or ""):
        raise RegistryError(f"class name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
    key = cfg.prefix + "classes/" + name
    errors = []
    for gw in cfg.gateways():
        try:
            return gw.txn(absent=[], present=[key], puts={cfg.prefix + "deleted/" + name: json.dumps(
                {"name": name}).encode()}, deletes=[key])
        except EtcdError as e:
            errors.append(str(e))
    raise RegistryError("etcd unreachable: " + "; ".join(errors))
