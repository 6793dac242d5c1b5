"""The control socket's commands that change or list something: a request dict in, a reply
dict out, ``{"ok": False, "error": ONE_LINE}`` when it cannot be done.

    set_limit(req, table, book, limits, sync, n_peers)    # drlctl set CLASS --global RATE
    reload(cfg, sync, apply_classes, table)               # drl-agent reload, SIGHUP
    list_clients(req, table, clients, now)                # drlctl clients [CLASS]
    unban(req, table, clients, now)                       # drlctl unban PREFIX [--class NAME]

The agent (service/daemon.py Agent.commands) maps the command names to these, with
``status`` and ``down``, which only read or flag the agent.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from drl.agent import logs
from drl.agent.clients.rules import ClientRuleError, parse_prefix
from drl.agent.cluster.limits import LimitBook
from drl.agent.config.build import ClassConf, Config, ConfigError
from drl.agent.service.class_table import Changes, ClassRun, ClassTable
from drl.agent.service.client_rules import ClientRules
from drl.agent.service.limit_gossip import LimitGossip
from drl.agent.service.registry_sync import RegistrySync
from drl.agent.units import UnitError, parse_rate, to_bps

log = logs.get_logger("drl.agent")


def set_limit(req: dict, table: ClassTable, book: LimitBook, limits: LimitGossip, sync: RegistrySync,
              n_peers: int) -> dict:
    """drlctl set CLASS --global RATE: a new version here, announced to every peer."""
    run = table.get(str(req.get("class")))
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
    if sync.registry is not None:
        return _set_in_registry(run, str(req.get("global")), rate, book, sync)
    limit = book.set(run.name, rate)
    book.save()
    limits.announce(run)
    log.info("limit_changed", class_=run.name, global_bps=round(to_bps(rate)), version=limit.version,
             from_="drlctl")
    return {"ok": True, "class": run.name, "global_limit_bps": to_bps(rate), "limit_version": limit.version,
            "peers": n_peers}


def _set_in_registry(run: ClassRun, text: str, rate: float, book: LimitBook, sync: RegistrySync) -> dict:
    """With a registry the class's table in etcd gets the new limit, and every agent (this
    one too) applies it from its watch; written when etcd is back if it is away now.  A
    class etcd does not have yet goes there whole (its rules and allocator), so an agent
    that has no such class of its own starts the same one, not one matching everything."""
    view = sync.registry.view()
    table = view.classes.get(run.name) or {"name": run.name, "allocator": run.conf.allocator.name,
                                            "match": [str(rule) for rule in run.conf.rules]}
    sync.registry.put_class({**table, "global": text})
    state = "queued" if view.reachable else "pending"      # pending: written once etcd is back
    log.info("limit_requested", class_=run.name, global_bps=round(to_bps(rate)), from_="drlctl", registry=state)
    return {"ok": True, "class": run.name, "global_limit_bps": to_bps(rate),
            "limit_version": book.get(run.name).version, "registry": state,
            "classes_refused": sync.classes_refused}


def reload(cfg: Config, sync: RegistrySync, apply_classes: Callable[[tuple[ClassConf, ...]], Changes],
           table: ClassTable) -> dict:
    """Re-read the config file: classes added, changed or removed in place.  A bad file
    changes nothing."""
    if cfg.reload is None:
        return {"ok": False, "error": "the agent was started without --config: nothing to reload"}
    try:
        changes = apply_classes(cfg.reload(sync.classes))
    except (ConfigError, ValueError) as e:      # ClassifyError is a ValueError
        log.error("reload_failed", error=str(e))
        return {"ok": False, "error": str(e)}
    log.info("reloaded", classes=len(table), added=list(changes.added), changed=list(changes.changed),
             removed=list(changes.removed))
    return {"ok": True, **dataclasses.asdict(changes)}


def list_clients(req: dict, table: ClassTable, clients: ClientRules, now: float) -> dict:
    """drlctl clients [CLASS]: each class's client rule and its top clients."""
    name = req.get("class")
    if name is not None and table.get(str(name)) is None:
        return {"ok": False, "error": f"no class {name!r} (see drlctl classes)"}
    limit = req.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        return {"ok": False, "error": f"limit {limit!r}: give a number of clients, 1 or more"}
    listing = clients.listing(name, now, limit)
    if name is not None and not listing:
        return {"ok": False, "error": f"class {name!r} has no client rule"}
    return {"ok": True, "classes": listing}


def unban(req: dict, table: ClassTable, clients: ClientRules, now: float) -> dict:
    """drlctl unban PREFIX [--class NAME]: lifted here, the tombstones go to every peer."""
    try:
        prefix = parse_prefix(str(req.get("prefix")))
    except ClientRuleError as e:
        return {"ok": False, "error": str(e)}
    name = req.get("class")
    if name is not None and table.get(str(name)) is None:
        return {"ok": False, "error": f"no class {name!r} (see drlctl classes)"}
    lifted = clients.unban(prefix, None if name is None else str(name), now)
    if not lifted:
        return {"ok": False, "error": f"no ban on {prefix}" + (f" in class {name!r}" if name else "")}
    return {"ok": True, "lifted": [{"class": c, "client": n} for c, n in lifted]}
