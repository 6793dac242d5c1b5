"""Datapath's per-client maps (docs/clients.md; bpf/clients.h): client rules, throttled
clients' buckets, bans, exempt prefixes, and the sliding counts the program keeps.

The kernel keeps every client's sliding window (clients.h count_client) and flags a
client whose count reaches the line, so the agent reads the flagged ones and those it
follows, never all; in a class that holds, it also gives such a client a bucket at the
hold rate until the agent writes its own (clients.h hold_client).  Each ``set_client_*``
call replaces the class's whole set.
"""
from __future__ import annotations

import ctypes as ct
import functools
import math
import struct
from typing import Iterable, Mapping

from pyroute2.netlink.exceptions import NetlinkError

from drl.agent import abi
from drl.agent.clients.rules import Client, ClientRule
from drl.agent.clients.windows import sliding_count
from drl.agent.kernel.bucket import unit_times
from drl.agent.burst import POLICE_TIME_S
from drl.agent.kernel.class_maps import default_burst
from drl.agent.kernel.maps import DatapathError, lookup_batch, lib, next_gen, now_ns, put, words

# A throttled client's bucket depth (set_client_limits): in bytes a class's (default_burst:
# TCP needs rate x 300 ms of it); packets and connections get 300 ms of their rate too, and
# at least CLIENT_BURST_UNITS: a few at once after a pause, then the rate.
CLIENT_BURST_UNITS = 4
# A throttled client's bucket is written again only for a rate that moved more than this
# (set_client_limits): a share that wobbles with demand every tick keeps its bucket's state.
CLIENT_RATE_CHANGE = 0.01
# limiter.h client_key, as read_heavy unpacks it
_CLIENT_KEY = struct.Struct("=IB3x16s")
_EXEMPT_KEY = struct.Struct("=III16s")


class ClientMaps:
    """Datapath's part for the client maps; keeps ``_client_rules``, ``_client_limits``,
    ``_client_bans``, ``_client_lines`` (line, hold) and ``_client_gen`` (settings.client_gen).  Turns
    the ingress filter on and off through the attach part."""

    def set_client_rule(self, class_id: int, rule: ClientRule | None, line: float = 0.0,
                        hold: float = 0.0) -> None:
        """Give a class its client rule (None: none); ``line``: a client whose sliding count
        reaches it is flagged for read_heavy (0: none is); ``hold``: and from then on held at
        this count per window until set_client_limits lists it or drop_holds lets it go
        (0: not held).  A rule with another key, measure, window or action than the class's
        last one drops its limits, holds, bans and counts (they were for other clients, units
        or actions), the old rule neither flagging nor holding meanwhile; None drops them and
        the exempt prefixes.  The ingress filter
        goes on with the first rule whose action is ban and off after the last (when attached)."""
        self._check_class(class_id)
        old = self._client_rules.get(class_id)
        if rule is None and old is None:
            return
        if rule is not None and not 0 < round(rule.window_s * 1e9) <= abi.MAX_CLIENT_WINDOW_NS:
            raise DatapathError(f"class {class_id}: a client window of {rule.window_s:g} s is not in "
                                f"(0, {abi.MAX_CLIENT_WINDOW_NS / 1e9 / 3600:.0f} h]")
        lines = (line, _check_hold(class_id, hold))
        if rule == old:
            self._client_lines[class_id] = lines
            self._write_client_config(class_id)
            return
        if rule is None or old is None or _identity(rule) != _identity(old):
            if old is not None:                     # first: no new flag or hold of the old rule
                self._client_lines[class_id] = (0.0, 0.0)
                self._write_client_config(class_id)
            self.set_client_limits(class_id, {})
            self.set_client_bans(class_id, {})
            if old is not None:
                self._forget_class_clients(class_id)
        self._client_lines[class_id] = lines
        banning = self._bans_anywhere()
        table = self._bpf[b"client_exempt"]
        before = {_exempt_key(class_id, net) for net in (old.exempt if old else ())}
        after = {_exempt_key(class_id, net) for net in (rule.exempt if rule else ())}
        for key in after - before:          # new prefixes first: no packet of the class misses one
            put(table, "client_exempt", table.Key.from_buffer_copy(key), table.Leaf(1))
        if rule is None:
            del self._client_rules[class_id]
            del self._client_lines[class_id]
        else:
            self._client_rules[class_id] = rule
        self._write_client_config(class_id)
        for key in before - after:
            del table[table.Key.from_buffer_copy(key)]
        if self._attached and self._bans_anywhere() != banning:
            try:
                self._set_ingress(not banning)
            except NetlinkError as e:
                raise DatapathError(f"cannot {'detach from' if banning else 'attach to'} {self.iface} ingress: "
                                    f"{e.args[-1]}") from None

    def set_client_limits(self, class_id: int, limits: Mapping[Client, tuple[float, float]]) -> list[Client]:
        """The class's held and throttled clients, in place of the last set: client -> (rate,
        safe rate) in the rule's unit per second (bytes, packets, connections).  The kernel charges each
        packet of a listed client to the client's bucket (clients.h throttle), at the safe
        rate once the class's config is stale; depth: default_burst for bytes, 300 ms of the
        rate and at least CLIENT_BURST_UNITS otherwise.  A new client's bucket starts empty,
        or where the kernel holds it already, as the hold left it; a listed one is written
        again only when a rate moved by more than CLIENT_RATE_CHANGE, keeping its credit or
        debt (the kernel converts it to the new price).  The clients no longer listed go
        first; when the map is full (MAX_CLIENT_LIMITS, the kernel's holds included) the new
        clients it has no room for are left out, in the order given, and returned: a flood
        of heavy clients must not stop the agent."""
        rule = self._rule_for(class_id, limits)
        table, old = self._bpf[b"client_limits"], self._client_limits.get(class_id, {})
        for client in limits:                       # all checked before anything changes
            _check_client(class_id, client, rule)
        checked = {client: _rates(class_id, client, rates) for client, rates in limits.items()}
        self._unlist(class_id, old, limits.keys(), table)
        written, fresh, full = {}, False, []
        for client, rates in checked.items():
            was = old.get(client)
            if was is not None and all(abs(r - w) <= CLIENT_RATE_CHANGE * w for r, w in zip(rates, was)):
                written[client] = was
                continue
            key = table.Key.from_buffer_copy(_client_key(class_id, client))
            leaf = table.get(key)
            if leaf is None and full:
                full.append(client)
                continue
            new, leaf = leaf is None, leaf or table.Leaf()
            if new:
                leaf.gcra.tat = now_ns()           # empty: the client is over its share already
            leaf.ns_per_unit, leaf.depth_ns = _client_bucket(rule.measure, rates[0])
            leaf.safe_ns_per_unit, leaf.safe_depth_ns = _client_bucket(rule.measure, rates[1])
            if not _put_if_room(table, "client_limits", key, leaf, new):
                full.append(client)
                continue
            fresh |= was is None
            written[client] = rates
        self._replace_clients(class_id, self._client_limits, written, table)
        if fresh:
            self._new_client_gen()
        return full

    def set_client_bans(self, class_id: int, bans: Mapping[Client, int]) -> list[Client]:
        """The class's banned clients, in place of the last set: client -> until_ns
        (CLOCK_MONOTONIC, now_ns()'s clock).  The kernel drops every packet to or from one
        (egress, and ingress while attached) until then, by itself: a ban ends on time with
        no agent running.  When the map is full (MAX_CLIENT_BANS) the new bans it has no
        room for are left out and returned, as set_client_limits does."""
        rule = self._rule_for(class_id, bans)
        table, old = self._bpf[b"client_bans"], self._client_bans.get(class_id, {})
        for client, until_ns in bans.items():       # all checked before anything changes
            _check_client(class_id, client, rule)
            if not 0 <= until_ns < 2**64:
                raise DatapathError(f"class {class_id}: ban until {until_ns!r} is not a CLOCK_MONOTONIC time in ns")
        self._unlist(class_id, old, bans.keys(), table)
        written, full, changed = {}, [], False
        for client, until_ns in bans.items():
            if old.get(client) != until_ns:
                key = table.Key.from_buffer_copy(_client_key(class_id, client))
                if not _put_if_room(table, "client_bans", key, table.Leaf(until_ns), client not in old):
                    full.append(client)
                    continue
                changed = True
            written[client] = until_ns
        self._replace_clients(class_id, self._client_bans, written, table)
        if changed:
            self._new_client_gen()
        return full

    def set_client_line(self, class_id: int, line: float, hold: float = 0.0) -> None:
        """The class's heavy line and hold (set_client_rule), when the number of hosts changed."""
        if class_id not in self._client_rules:
            raise DatapathError(f"class {class_id} has no client rule (set_client_rule first)")
        self._client_lines[class_id] = (line, _check_hold(class_id, hold))
        self._write_client_config(class_id)

    def drop_holds(self, class_id: int, clients: Iterable[Client]) -> None:
        """The kernel's holds (set_client_rule's hold) of these clients go, where
        set_client_limits does not list them: flagged clients the agent let go."""
        listed = self._client_limits.get(class_id, {})
        self._delete_clients(class_id, [c for c in clients if c not in listed], self._bpf[b"client_limits"])

    def read_heavy(self) -> dict[int, set[Client]]:
        """Per class, the clients the program flagged since the last call: their count reached
        the class's line (once a window each), read and emptied in one batch syscall."""
        table = self._bpf[b"client_heavy"]
        if self._heavy_bufs is None:
            self._heavy_bufs = ((table.Key * table.max_entries)(), (table.Leaf * table.max_entries)())
        keys, values = self._heavy_bufs
        n = lookup_batch(table, keys, values, table.max_entries, delete=True)
        out: dict[int, set[Client]] = {}
        for class_id, client in _client_keys(keys, n):
            if class_id in self._client_rules:       # else flagged before the class's rule went
                out.setdefault(class_id, set()).add(client)
        return out

    def client_counts(self, class_id: int, clients: Iterable[Client]) -> dict[Client, float]:
        """The sliding counts now of those of ``clients`` the kernel has a window for, in the
        rule's unit (agent/clients/table.py sliding_count on the entry's two windows): one lookup
        each, for the few the agent follows."""
        rule = self._client_rules.get(class_id)
        if rule is None:
            raise DatapathError(f"class {class_id} has no client rule (set_client_rule first)")
        table, window_ns, now = self._bpf[b"client_windows"], round(rule.window_s * 1e9), now_ns()
        index, out = now // window_ns, {}
        key, w = table.Key(), table.Leaf()            # one of each, refilled: ~1 us a client
        fd, lookup, key_p, w_p = table.map_fd, lib.bpf_lookup_elem, ct.byref(key), ct.byref(w)
        for client in clients:
            _CLIENT_KEY.pack_into(key, 0, class_id, 4 if len(client) == 4 else 6, client)
            if lookup(fd, key_p, w_p) < 0:
                continue                              # no window: nothing counted, or aged out
            prev, cur = (w.prev, w.cur) if w.index == index else (w.cur, 0) if w.index + 1 == index else (0, 0)
            out[client] = sliding_count(prev, cur, (now - index * window_ns) / 1e9, rule.window_s)
        return out

    def forget_clients(self, class_id: int, clients: Iterable[Client]) -> None:
        """Their windows go: the next packet of each starts its count from 0."""
        self._delete_clients(class_id, clients, self._bpf[b"client_windows"])

    def _forget_class_clients(self, class_id: int) -> None:
        """Every window and hold of the class (its rule changed or went: a slot's next class
        starts from nothing); one batch read of each map, rare."""
        self.forget_clients(class_id, self._class_entries(class_id, b"client_windows"))
        self.drop_holds(class_id, self._class_entries(class_id, b"client_limits"))

    def _class_entries(self, class_id: int, name: bytes) -> list[Client]:
        table = self._bpf[name]
        keys, values = (table.Key * table.max_entries)(), (table.Leaf * table.max_entries)()
        n = lookup_batch(table, keys, values, table.max_entries)
        return [client for owner, client in _client_keys(keys, n) if owner == class_id]

    def _new_client_gen(self) -> None:
        """After new bans or throttled clients: every client is checked against them again
        (a client's count remembers the generation it was found clear in: clients.h clients)."""
        self._client_gen = next_gen(self._client_gen)
        self._write_settings(client_gen=self._client_gen)

    def _rule_for(self, class_id: int, entries: Mapping) -> ClientRule | None:
        self._check_class(class_id)
        rule = self._client_rules.get(class_id)
        if rule is None and entries:
            raise DatapathError(f"class {class_id} has no client rule (set_client_rule first)")
        return rule

    def _unlist(self, class_id: int, old: dict, listed, table) -> None:
        """Before a new set's writes: the clients of the class's ``old`` set that it no
        longer lists go first, so that a full map has room for its new ones.  An empty set
        leaves them to _replace_clients, which clears the class's flag before they go."""
        if listed:
            self._delete_clients(class_id, old.keys() - listed, table)

    def _replace_clients(self, class_id: int, sets: dict, new: dict, table) -> None:
        """Make ``new`` (written already, after _unlist) the class's set in ``sets``: the
        class's flag in its config follows (set after new entries, cleared before the last
        go), then, when none is left, the clients are deleted (_unlist deleted the others')."""
        had, gone = class_id in sets, sets.get(class_id, {}).keys() - new.keys()
        if new:
            sets[class_id] = new
        else:
            sets.pop(class_id, None)
        if bool(new) != had:
            self._write_client_config(class_id)
        if not new:
            self._delete_clients(class_id, gone, table)

    def _delete_clients(self, class_id: int, clients: Iterable[Client], table) -> None:
        for client in clients:
            try:
                del table[table.Key.from_buffer_copy(_client_key(class_id, client))]
            except KeyError:
                pass                                # gone already (or never counted)

    def _fill_client(self, cfg, class_id: int) -> None:
        """The class's client fields of a config (limiter.h class_config.client_*)."""
        rule = self._client_rules.get(class_id)
        if rule is None:
            cfg.client_side = cfg.client_measure = cfg.client_flags = cfg.client_mask4 = 0
            cfg.client_mask6[:] = [0] * 4
            cfg.client_window_ns = cfg.client_line = cfg.client_hold_ns_per_unit = cfg.client_hold_depth_ns = 0
            return
        line, hold = self._client_lines.get(class_id, (0.0, 0.0))
        cfg.client_side = abi.CLIENT_SIDES[rule.key.side]
        cfg.client_measure = abi.MEASURES[rule.measure]
        cfg.client_flags = (abi.CLIENT_HAS_LIMITS * (class_id in self._client_limits or hold > 0)
                            | abi.CLIENT_HAS_BANS * (class_id in self._client_bans)
                            | abi.CLIENT_HAS_EXEMPT * bool(rule.exempt))
        cfg.client_mask4 = words(_mask(rule.key.v4_len, 4) + bytes(12))[0]
        cfg.client_mask6[:] = words(_mask(rule.key.v6_len, 16))
        cfg.client_window_ns = round(rule.window_s * 1e9)
        cfg.client_line = math.ceil(line)
        cfg.client_hold_ns_per_unit, cfg.client_hold_depth_ns = (
            _client_bucket(rule.measure, hold / rule.window_s) if hold > 0 else (0, 0))

    def _write_client_config(self, class_id: int) -> None:
        """The class's client fields into its config as it is (its own fields and stamp
        unchanged); inside batch(), into the slot set_class staged too."""
        table = self._bpf[b"config"]
        if self._pending is not None and class_id in self._pending:
            self._fill_client(self._staged[1][self._pending[class_id]], class_id)
        cfg = table[ct.c_int(class_id)]
        self._fill_client(cfg, class_id)
        table[ct.c_int(class_id)] = cfg

    def _bans_anywhere(self) -> bool:
        """Some class has a ban rule: the ingress filter is wanted."""
        return any(rule.action == "ban" for rule in self._client_rules.values())


def _client_keys(keys, n: int) -> Iterable[tuple[int, Client]]:
    """(class id, client) of the first n limiter.h client_key structs of a batch read."""
    for class_id, family, addr in _CLIENT_KEY.iter_unpack(ct.string_at(keys, n * _CLIENT_KEY.size)):
        yield class_id, addr[:4] if family == 4 else addr


def _client_key(class_id: int, client: Client) -> bytes:
    """limiter.h client_key of a class's client."""
    return _CLIENT_KEY.pack(class_id, 4 if len(client) == 4 else 6, client)


def _exempt_key(class_id: int, net) -> bytes:
    """limiter.h exempt_key of an exempt prefix: class id and family are the first 64 bits compared."""
    return _EXEMPT_KEY.pack(64 + net.prefixlen, class_id, net.version, net.network_address.packed)


def _mask(length: int, size: int) -> bytes:
    """The first ``length`` bits of ``size`` bytes set: a prefix's netmask, packed."""
    return (((1 << length) - 1) << (8 * size - length)).to_bytes(size, "big")


def _check_client(class_id: int, client: Client, rule: ClientRule) -> None:
    if not isinstance(client, bytes) or not rule.key.owns(client):
        raise DatapathError(f"class {class_id}: {client!r} is not a client of key {rule.key} "
                            "(4 or 16 packed bytes, host bits zero)")


def _identity(rule: ClientRule) -> tuple:
    """What a rule's kernel state is for: another one starts from nothing."""
    return rule.key, rule.measure, rule.window_s, rule.action


def _put_if_room(table, name: str, key, leaf, new: bool) -> bool:
    """put; False when a new entry finds the map full (an update needs no room)."""
    try:
        put(table, name, key, leaf)
    except DatapathError:
        if not new:
            raise
        return False
    return True


def _check_hold(class_id: int, hold: float) -> float:
    if not 0.0 <= hold < math.inf:
        raise DatapathError(f"class {class_id}: a hold of {hold!r} is not a finite count >= 0")
    return float(hold)


def _rates(class_id: int, client: Client, rates) -> tuple[float, float]:
    rate, safe = (float(r) for r in rates)
    if not (0.0 <= rate < math.inf and 0.0 <= safe < math.inf):
        raise DatapathError(f"class {class_id}: client {client.hex()} rates {rates!r} are not two finite rates >= 0")
    return rate, safe


@functools.lru_cache(maxsize=4096)      # held clients share few rates (T/N, T less the floors): exact
def _client_bucket(measure: str, rate: float) -> tuple[int, int]:
    """(ns_per_unit, depth_ns) of a throttled client's bucket (set_client_limits)."""
    depth = default_burst(rate) if measure == "bytes" else max(CLIENT_BURST_UNITS, rate * POLICE_TIME_S)
    return unit_times(rate, depth, abi.MAX_NS_PER_UNIT[measure])
