"""The status tree: what ``drlctl status --json`` prints and the metrics are made from.

    agent_status(agent, now)    # the agent, each class under "classes", the first class at the top
    status_parts(agent)         # the same made a part at a time: lists of classes, then the rest
    status_reply(agent)         # the control reply's JSON text, a part at a time

The keys are a contract (docs/agent.md "Status", docs/metrics.md): rates in bits/s
(``*_bps``), counters as the datapath counts them, one entry per class.
"""
from __future__ import annotations

import itertools
import json
import time
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from drl.agent.cluster.limits import Limit
from drl.agent.cluster.registry import Registry, RegistryConfig
from drl.agent.gossip.peers import format_addr
from drl.agent.kernel.datapath import Counters
from drl.agent.model import Decision, Local, Mode, effective_limit
from drl.agent.service.class_table import ClassRun
from drl.agent.service.client_rules import ClientRun
from drl.agent.service.rates import burst_budget, local_limit, safe_rate
from drl.agent.units import to_bps

if TYPE_CHECKING:
    from drl.agent.service.daemon import Agent

PART_CLASSES = 50       # classes a streamed part: ~40 KB of JSON, ~2 ms to make


def agent_status(agent: "Agent", now: float) -> dict:
    """drlctl status --json: the agent, each class under ``classes``, and at the top
    level the first class (``default`` when there is one) as before classes existed."""
    classes = list(class_statuses(agent))
    return {**agent_head(agent, _first(classes), now), "classes": classes}


def status_parts(agent: "Agent") -> Iterator[list[dict] | dict]:
    """The status a part at a time, each made as it is drawn: lists of PART_CLASSES classes,
    then, last, the rest (agent_head, read once the last class is made).  Drawn between
    ticks (service/slices.py), each class is as of the moment its part was made."""
    classes, first = class_statuses(agent), None
    while part := list(itertools.islice(classes, PART_CLASSES)):
        first = _first([c for c in (first, *part) if c is not None])
        yield part
    yield agent_head(agent, first, time.monotonic())


def status_reply(agent: "Agent") -> Iterator[bytes]:
    """The control reply ``{"ok": true, "status": ...}`` as JSON text, a part of status_parts
    at a time (control.py streams them): ``classes`` first, then the agent's keys."""
    yield b'{"ok": true, "status": {"classes": ['
    sep = b""
    for part in status_parts(agent):
        if isinstance(part, dict):
            yield b"], " + json.dumps(part)[1:].encode() + b"}"
        else:
            yield sep + json.dumps(part)[1:-1].encode()
            sep = b", "


def class_statuses(agent: "Agent") -> Iterator[dict]:
    """Each class's status, made one at a time; a class removed meanwhile (a reload) is left out."""
    shaped = agent.shaper.rates         # once: it is a copy; once a class, 20,000 classes took ~25 s
    for run in list(agent.table):
        if agent.table.get(run.name) is run:
            yield class_status(agent, run, shaped)


def _first(classes: list[dict]) -> dict:
    """The class shown at the top level: ``default`` when there is one, else the first."""
    return next((c for c in classes if c["name"] == "default"), classes[0])


def agent_head(agent: "Agent", first: dict, now: float) -> dict:
    """The status but its ``classes``: the agent's own keys and ``first``'s."""
    cfg = agent.cfg
    out = {"node_id": cfg.node_id, "interface": cfg.iface, "interval_s": cfg.interval_s,
           "uptime_s": now - agent.started, "ticks": agent.ticks, "listen": listen(agent.transport.address),
           "standalone": cfg.standalone, "authenticated": cfg.key is not None,
           "gossip": {**agent.transport.stats.as_dict(now), "client_entries_ignored": agent.clients.ignored},
           "peers": agent.members.status(now),
           "unseen_peers": agent.unseen.peers,
           "sum_tree": agent.tree.status(now) if agent.tree_on else None,
           "datapath": dict(agent.dp.attachment), "tick": {**agent.tick_stats.as_dict(), "errors": agent.errors.total,
                                                              "errors_by": agent.errors.rows()},
           "registry": registry_status(agent.registry, cfg.registry, agent.sync.classes_refused, now)}
    out.update({k: v for k, v in first.items() if k != "name"})
    return out


def registry_status(registry: Registry | None, reg: RegistryConfig | None, refused: str | None,
                    now: float) -> dict | None:
    """etcd's state as this agent sees it; None without --registry."""
    if registry is None:
        return None
    view = registry.view()
    return {"endpoints": [f"etcd://{format_addr(e)}" for e in reg.endpoints], "cluster": reg.cluster,
            "state": "reachable" if view.reachable else "unreachable", "error": view.error or None,
            "for_s": now - view.since, "members": sorted(view.members), "classes": sorted(view.classes),
            "classes_refused": refused, "bad_keys": list(view.bad_keys)}


def class_status(agent: "Agent", run: ClassRun, shaped: Mapping[int, float]) -> dict:
    """One class: its limits, mode, demand, counters, client rule and allocator state;
    ``shaped``: the shaper's rates by class id."""
    limit = agent.book.get(run.name)
    n_nodes = agent.members.n_nodes
    if run.last is None:      # before its first tick: the 1/N share ClassTable.apply wrote
        snap, c, local = None, Counters(), Local(0.0)
        d = Decision(Mode.BUCKET, limit.global_Bps / n_nodes)
    else:
        snap, step, c = run.last
        d, local = step.decision, snap.local
    return {
        **_limits(run, limit, d, local, snap, n_nodes),
        "shaped": run.class_id in shaped,     # enforce shape, and its HTB class holds
        "drop_probability": d.drop_probability,
        "demand_bps": to_bps(local.demand_Bps), "rate_bps": to_bps(local.sent_Bps),
        "flows": len(local.flow_rates_Bps), "max_flow_bps": to_bps(max(local.flow_rates_Bps, default=0.0)),
        "passed_bytes": c.passed_bytes, "passed_packets": c.passed_packets,
        "dropped_bytes": c.dropped_bytes, "dropped_packets": c.dropped_packets,
        **agent.drops.by_reason(run, c),
        "throttled_bytes": c.throttled_bytes, "throttled_packets": c.throttled_packets,
        "banned_bytes": c.banned_bytes, "banned_packets": c.banned_packets,
        "clients": client_summary(agent.clients.get(run.name), time.monotonic()),
        "quota_bytes_left": d.quota_bytes, "gossip_lost": agent.members.class_lost[run.conf.key],
        "errors": agent.errors.of(run.name),
        "hint": agent.unmatched.hint(run),     # its spec matched nothing while the interface was busy (unmatched.py)
        "allocator_state": allocator_state(d.info)}


def _limits(run: ClassRun, limit: Limit, d: Decision, local: Local, snap, n_nodes: int) -> dict:
    """The class's name, allocator, limits and how it enforces them."""
    return {
        "name": run.name, "allocator": run.conf.allocator.name,
        "global_limit_bps": to_bps(limit.global_Bps), "limit_version": limit.version,
        "effective_limit_bps": to_bps(effective_limit(snap) if snap else limit.global_Bps),
        "local_limit_bps": to_bps(local_limit(d, local)),
        "safe_rate_bps": to_bps(safe_rate(run.conf, limit, n_nodes)),
        "burst_budget_bytes": burst_budget(run.conf, limit, n_nodes),     # D: the promise is G x T + D
        "mode": d.mode.name.lower(), "shadow": run.conf.shadow, "enforce": run.conf.enforce,
        "enforce_reason": run.conf.policed_by_default}     # why the default policed it; "" = not so


def client_summary(cr: ClientRun | None, now: float) -> dict | None:
    """The class's client rule and its clients tracked, throttled, banned and waiting (flagged,
    held by the kernel, not yet adopted: client_rules.ADOPT_PER_TICK); None without one."""
    if cr is None:
        return None
    return {"key": str(cr.rule.key), "measure": cr.rule.measure, "threshold": str(cr.rule.threshold),
            "action": cr.rule.action, **cr.table.summary(now), "waiting": len(cr.waiting)}


def listen(address) -> str | None:
    return None if address is None else "%s:%d" % address[:2]


def allocator_state(info: Any) -> Any:
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
