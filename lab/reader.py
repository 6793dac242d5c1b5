"""Read an experiment file (TOML) into a :class:`~lab.spec.Experiment`, with located errors.

    >>> from drl.lab.reader import load
    >>> load("lab/experiments/baseline.toml").name
    'baseline'

A mistake in a file raises :class:`SpecError` with ``file:line: where: field
'x': what is wrong`` (tomllib's own syntax errors keep their line and
column).  Reading is pure: it needs no root, builds nothing and does not look
at the machine (lab/preflight.py does, before a run).
"""
from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path
from typing import Any, Callable

from drl.agent import allocators
from drl.agent.clients import rules as client_rules
from drl.agent.config.toml import key_line
from drl.agent.units import UnitError, parse_duration, parse_rate, parse_size

from .errors import LabError
from .spec import (AGENT_ACTIONS, ATTACK_AFTER_S, ATTACK_KINDS, ATTACK_WITHIN_S, CHECKS, DIRECTIONS, FAULT_ACTIONS, FAULT_HORIZON_S, KINDS, LOSS_ON, REPLAY_COUNT,
                   ROLES, RUN_CHECKS, Attack, Experiment, Fault, Link, LinkEvent, Matrix, Traffic)

SPLIT = re.compile(r"[0-9]+(:[0-9]+)*")
MAX_SPLIT_HOSTS, MAX_SPLIT_FLOWS = 8, 64
HOST_NAME = re.compile(r"[a-z][a-z0-9]{0,5}")  # <= 6 chars: interface names are <= 15 (lab/topology.py)
RESERVED = {"ctl"}  # the control-network namespace

# [agent] / [params.<allocator>] keys -> how to check the value; passed to `drl-agent up --<key>`.
AGENT_OPTIONS: dict[str, Callable[[str], Any]] = {
    "interval": parse_duration,
    "peer_timeout": parse_duration,
    "burst": parse_size,
    "burst_budget": parse_size,
    "ewma": lambda v: _in_range(float(v), 0.0, 1.0, hi_open=True),
    "flow_ewma": lambda v: _in_range(float(v), 0.0, 1.0, hi_open=True),
    "sample_probability": lambda v: _in_range(float(v), 0.0, 1.0, lo_open=True),
    "branching": lambda v: _in_range(int(v), 1, math.inf),
    "eta": lambda v: _in_range(float(v), 0.0, math.inf, lo_open=True),
    "enforce": lambda v: _one_of(v, ("police", "shape")),
    # the class's per-client rule (docs/clients.md): the attack experiment's clients phase
    "client_key": client_rules.parse_client_key,
    "client_measure": lambda v: _one_of(v, ("bytes", "packets", "conns")),
    "client_threshold": client_rules.parse_threshold,
    "client_exempt": client_rules.parse_prefix,
}


_REQUIRED = object()  # default of a getter whose field must be present


class SpecError(LabError):
    """A bad experiment file; the message names the file, line and field."""


def load(path: str | Path) -> Experiment:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"cannot read experiment file {path}: {e.strerror}") from None
    return loads(text, str(path))


def loads(text: str, path: str = "<string>") -> Experiment:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: {e}") from None
    src = _Source(text, path)
    top = _Table(src, doc, "top level", None, None)
    exp_t = top.sub("experiment")
    name = exp_t.text("name", Path(path).stem)
    duration = exp_t.positive(exp_t.duration("duration"), "duration")
    checks_t = top.sub("checks", required=False)
    checks = _checks(checks_t.data, lambda key, msg: checks_t.error(key, msg))
    checks_t.data.clear()
    exp = Experiment(
        name=name,
        description=exp_t.text("description", ""),
        global_Bps=exp_t.rate("global"),
        duration_s=duration,
        warmup_s=exp_t.duration("warmup", duration / 6),
        allocators=tuple(exp_t.allocator_list("allocators")),
        repeat=exp_t.integer("repeat", 1, lo=1),
        hosts=_hosts(top.sub("hosts")),
        links=tuple(_link(t) for t in top.array("link")),
        traffic=tuple(_traffic(t, duration) for t in top.array("traffic")),
        events=tuple(_event(t, duration) for t in top.array("event")),
        agent=_agent_options(top.sub("agent", required=False)),
        params={a: _agent_options(t) for a, t in top.sub("params", required=False).subtables(allocator=True)},
        rto_min_s=_rto_min(exp_t),
        congestion_control=_congestion_control(exp_t),
        faults=tuple(_fault(t, duration, checks) for t in top.array("fault")),
        checks={k: v for k, v in checks.items() if k in RUN_CHECKS},
        matrix=_matrix(top.sub("matrix", required=False)),
        attacks=tuple(_attack(t, duration) for t in top.array("attack")),
        path=path,
    )
    exp_t.finish()
    top.finish()
    _check_graph(exp, src)
    if exp.matrix and not exp.of_role("router"):
        raise SpecError(f"{path}: [matrix] needs a host of role 'router': each cell's limiters link to it")
    _check_attacks(exp, src)
    return dataclasses.replace(exp, faults=_check_faults(exp, src))


def _attack(t: "_Table", duration: float) -> Attack:
    """One [[attack]] (lab/attacks.py): a kind, when, how long, on which agent."""
    kind = t.text("kind", choices=ATTACK_KINDS)
    at, span = t.duration("at"), t.positive(t.duration("duration"), "duration")
    after = t.positive(t.duration("after", ATTACK_AFTER_S), "after")
    if at < 0 or at + span + after > duration:
        raise t.error("at", f"the attack and its 'after' must lie within the experiment "
                            f"({at:g} + {span:g} + {after:g} s > {duration:g} s)")
    fields: dict[str, Any] = {}
    if kind == "flood":
        fields["rate_pps"] = t.integer("rate", 150_000, lo=1)
    if kind == "clients":
        fields["clients"] = t.integer("clients", 200_000, lo=1)
    a = Attack(at, kind, span, t.text("agent"), after_s=after,
               within_s=t.positive(t.duration("within", ATTACK_WITHIN_S), "within"), index=t.index, **fields)
    t.finish()
    return a


def _check_attacks(exp: Experiment, src: "_Source") -> None:
    """Each names a limiter, one at a time (an attack's aftermath ends before the next starts:
    each window is charged to one attack), and the kinds that speak as a peer have one."""
    ends = -1.0
    for a in sorted(exp.attacks, key=lambda a: a.at_s):
        where = _Table(src, {}, f"[[attack]] #{a.index + 1}", "attack", a.index)
        if a.agent not in exp.limiters:
            raise where.error("agent", f"{a.agent!r} is not a limiter ({', '.join(exp.limiters)})")
        if a.at_s < ends:
            raise where.error("at", f"{a.at_s:g} s is before the previous attack's aftermath ends ({ends:g} s)")
        if a.kind in ("lying_summer", "huge_partial", "forged_limit", "flood") and len(exp.limiters) < 3:
            raise where.error("kind", f"{a.kind} speaks as a peer of {a.agent}: it needs at least 3 limiters")
        if a.kind == "clients" and "client_key" not in exp.agent:
            raise where.error("kind", "clients needs a per-client rule: client_key in [agent]")
        ends = a.at_s + a.duration_s + a.after_s


def _matrix(t: "_Table") -> Matrix | None:
    """``[matrix]`` (lab/matrix.py): splits like "1:3:6", 1-8 limiters of 1-64 flows each."""
    if not t.data:
        return None
    splits = []
    for text in t.text_list("splits", "splits like '1:3:6'"):
        split = tuple(int(n) for n in text.split(":")) if SPLIT.fullmatch(text) else ()
        if not (1 <= len(split) <= MAX_SPLIT_HOSTS and all(1 <= n <= MAX_SPLIT_FLOWS for n in split)):
            raise t.error("splits", f"{text!r}: expected flows per limiter like '1:3:6', "
                                    f"1-{MAX_SPLIT_HOSTS} limiters of 1-{MAX_SPLIT_FLOWS} flows")
        splits.append(split)
    bounds = {k: t.number(k, lo=0, hi=1) for k in ("max_share_error", "min_jain") if k in t.data}
    m = Matrix(tuple(splits), tuple(t.text_list("congestion_control", "congestion control names")),
               tuple(t.text_list("enforce", choices=("default", "shape", "police"))), **bounds)
    t.finish()
    return m


def _rto_min(t: "_Table") -> float | None:
    """``rto_min``: ip-route's per-route floor of TCP's retransmission timeout.
    Linux's 200 ms is a few RTTs on the paper's 40-ms paths but thousands on a
    veth, where TCP flows sharing one bucket then take turns by timeouts."""
    value = t.duration("rto_min", None)
    if value is not None and not 0.001 <= value <= 0.2:
        raise t.error("rto_min", "must be between 1ms and 200ms (Linux's default)")
    return value


def _congestion_control(t: "_Table") -> str | None:
    """``congestion_control``: the TCP groups' algorithm (iperf3 -C), in
    [experiment] or per tcp [[traffic]] group (which wins).  Unset,
    flows use the machine's default, which differs between machines (bbr on
    the project's VM, cubic on most); whether this machine has it is
    lab/preflight.py's question."""
    return t.text("congestion_control") if "congestion_control" in t.data else None


def _hosts(t: "_Table") -> dict[str, str]:
    hosts = {}
    for name in list(t.data):
        role = t.text(name, choices=ROLES)
        if not HOST_NAME.fullmatch(name) or name in RESERVED:
            raise t.error(name, "host names are 1-6 characters [a-z0-9] starting with a letter, not 'ctl'")
        hosts[name] = role
    if len([r for r in hosts.values() if r == "sink"]) != 1:
        raise t.error(None, "exactly one host must have role 'sink'")
    if "limiter" not in hosts.values():
        raise t.error(None, "at least one host must have role 'limiter'")
    return hosts


def _link(t: "_Table") -> Link:
    ends = t.names("ends", 2)
    link = Link(ends[0], ends[1], rate_Bps=t.rate("rate", None),
                **link_impairment(t._get("delay", None), t._get("jitter", None), t._get("loss", None), t.error))
    t.finish()
    return link


MAX_DELAY_S = 1.0   # one way; more is likelier a unit slip ("40" for 40 ms) than a wish


def link_impairment(delay: Any, jitter: Any, loss: Any, fail: Callable[[str, str], Exception]) -> dict:
    """A link's ``delay``, ``jitter`` (durations, each direction) and ``loss`` (``"1%"``, each
    direction) as written in a file or given to lab/topology.py's pair()/star(): keyword
    arguments of spec.Link; ``fail(field, message)`` makes the error."""
    out: dict[str, float] = {}
    for key, value in (("delay", delay), ("jitter", jitter)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise fail(key, f"expected a duration like '20ms', got {value!r}")
        try:
            seconds = parse_duration(str(value))   # a bare number is seconds, as everywhere in the file
        except UnitError as e:
            raise fail(key, str(e)) from None
        if seconds > MAX_DELAY_S:
            raise fail(key, f"at most {MAX_DELAY_S:g}s one way, got {value!r}")
        out[f"{key}_s"] = seconds
    if loss is not None:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", loss) if isinstance(loss, str) else None
        if not m or float(m.group(1)) >= 100:
            raise fail("loss", f"expected a percentage below 100 like '1%' or '0.5%', got {loss!r}")
        out["loss_pct"] = float(m.group(1))
    if out.get("jitter_s", 0) > out.get("delay_s", 0):
        raise fail("jitter", f"must not exceed the delay ({out.get('delay_s', 0) * 1e3:g}ms): "
                             "a frame cannot leave before it arrived")
    return out


def _traffic(t: "_Table", duration: float) -> Traffic:
    kind = t.text("kind", choices=KINDS)
    start = t.duration("start", 0.0)
    stop = t.duration("stop", duration)
    if not 0 <= start < stop <= duration:
        raise t.error("stop", f"need 0 <= start < stop <= the experiment's duration ({duration:g} s)")
    common = dict(kind=kind, src=t.text("from"), start_s=start, stop_s=stop)
    if kind == "web":
        mean, cap = t.size("mean_size", 30_000), t.size("max_size", 2_000_000)
        tr = Traffic(**common, arrivals_per_s=t.number("arrivals", lo=0, lo_open=True),
                     mean_size=mean, max_size=cap, shape=t.number("shape", 1.2, lo=1, lo_open=True))
    else:
        tr = Traffic(**common, flows=t.integer("flows", 1, lo=1),
                     rate_Bps=t.rate("rate") if kind == "udp" else None,
                     congestion_control=_congestion_control(t) if kind == "tcp" else None)
    t.finish()
    return tr


def _event(t: "_Table", duration: float) -> LinkEvent:
    at = t.duration("at")
    if not 0 <= at < duration:
        raise t.error("at", f"must lie within the experiment (0 .. {duration:g} s)")
    ev = LinkEvent(at, tuple(t.names("link", 2)), t.rate("rate"))
    t.finish()
    return ev


def _fault(t: "_Table", duration: float, default_checks: dict[str, float]) -> Fault:
    """One [[fault]]: ``at`` and an ``action`` with its fields; names are checked in _check_faults."""
    at = t.duration("at")
    if not 0 <= at < duration:
        raise t.error("at", f"must lie within the experiment (0 .. {duration:g} s)")
    action = t.text("action", choices=FAULT_ACTIONS)
    fields: dict[str, Any] = {}
    horizon_default = FAULT_HORIZON_S
    if action in AGENT_ACTIONS:
        fields["agent"] = t.text("agent")
    if action == "kill-loop":
        every, span = t.positive(t.duration("every"), "every"), t.positive(t.duration("for"), "for")
        if every > span:
            raise t.error("every", f"{every:g} s is longer than the loop ('for' = {span:g} s)")
        if at + span > duration:
            raise t.error("for", f"the loop must end within the experiment ({at:g} + {span:g} s > {duration:g} s)")
        fields.update(every_s=every, for_s=span)
        horizon_default = span + FAULT_HORIZON_S   # the whole loop, and what its last start does
    elif action == "replay":
        fields["count"] = t.integer("count", REPLAY_COUNT, lo=1)
    elif action == "loss":
        direction = t.text("direction", choices=DIRECTIONS) if "direction" in t.data else None
        percent = t.number("percent", 100 if direction else _REQUIRED, integer=True)
        if not 1 <= percent <= 100:
            raise t.error("percent", f"a whole percentage 1..100, got {percent}")
        fields.update(percent=percent, on=t.text("on", "gossip" if direction else _REQUIRED, choices=LOSS_ON))
        if direction:
            if fields["on"] != "gossip":
                raise t.error("direction", "only gossip loss has a direction (one agent's datagrams in or out)")
            if "hosts" in t.data:
                raise t.error("hosts", "a one-way loss names one `agent`, not hosts")
            fields.update(direction=direction, agent=t.text("agent"))
        elif "hosts" in t.data:
            fields["hosts"] = tuple(t.host_list("hosts"))
    elif action == "partition":
        groups = t._get("groups", _REQUIRED)
        if not (isinstance(groups, list) and groups and all(
                isinstance(g, list) and g and all(isinstance(h, str) for h in g) for g in groups)):
            raise t.error("groups", f"expected a list of lists of limiter names, like [[\"l1\", \"l2\"], [\"l3\"]], "
                                    f"got {groups!r}")
        fields["groups"] = tuple(tuple(g) for g in groups)
    horizon = t.positive(t.duration("horizon", horizon_default), "horizon")
    own = t._get("checks", {})
    if not isinstance(own, dict):
        raise t.error("checks", f"expected an inline table like {{ max_window_ratio = 1.05, recovery_s = 3 }}, got {own!r}")
    checks = {**default_checks, **_checks(own, lambda key, msg: t.error("checks", f"{key!r}: {msg}" if key else msg))}
    t.finish()
    return Fault(at, action, horizon_s=horizon, checks=checks, index=t.index, **fields)


def _checks(data: dict, fail: Callable[[str | None, str], SpecError]) -> dict[str, float]:
    """``max_window_ratio`` and ``max_envelope_ratio`` (> 0) and ``recovery_s`` (>= 0, seconds): what every
    fault (or one) must meet; ``max_envelope_ratio`` in [checks] also bounds the whole run."""
    out = {}
    for key, value in data.items():
        if key not in CHECKS:
            raise fail(key, f"unknown check (expected one of {', '.join(CHECKS)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(key, f"expected a number, got {value!r}")
        if value < 0 or (key != "recovery_s" and value == 0):
            raise fail(key, f"{value} is out of range")
        out[key] = float(value)
    return out


def _check_faults(exp: Experiment, src: "_Source") -> tuple[Fault, ...]:
    """Names exist, agents' signals come in an order that makes sense (restart after kill, cont
    after stop), and partitions are completed with the limiters they leave out; time-ordered."""
    limiters = exp.limiters
    out, state = [], {h: "running" for h in limiters}
    looping: dict[str, float] = {}   # agent -> when its kill-loop ends
    for f in sorted(exp.faults, key=lambda f: f.at_s):
        where = _Table(src, {}, f"[[fault]] #{f.index + 1}", "fault", f.index)
        if f.agent is not None and f.agent not in limiters:
            raise where.error("agent", f"{f.agent!r} is not a limiter (agents run on {', '.join(limiters)})")
        if f.action in AGENT_ACTIONS:
            if f.at_s < looping.get(f.agent, -1.0):
                raise where.error("action", f"cannot {f.action} {f.agent} at {f.at_s:g} s: its kill-loop runs "
                                            f"until {looping[f.agent]:g} s")
            alive = ("running", "stopped", "dead")
            need, after = {"kill": (("running", "stopped"), "dead"), "stop": (("running",), "stopped"),
                           "cont": (("stopped",), "running"), "restart": (("dead",), "running"),
                           "recreate": (alive, state[f.agent]), "replay": (("running",), "running"),
                           "kill-loop": (("running",), "running")}[f.action]
            if state[f.agent] not in need:
                raise where.error("action", f"cannot {f.action} {f.agent} at {f.at_s:g} s: it is {state[f.agent]} "
                                            f"then (restart follows a kill, cont a stop; replay and kill-loop "
                                            f"need it running)")
            state[f.agent] = after
            if f.action == "kill-loop":
                looping[f.agent] = f.at_s + f.for_s
        if f.action in ("partition",) or (f.action == "loss" and f.on == "gossip"):
            if len(limiters) < 2:
                raise where.error("action", f"{f.action} on the control network needs at least two limiters")
        if f.action == "loss":
            allowed = limiters if f.on == "gossip" else list(exp.hosts)
            for h in f.hosts:
                if h not in allowed:
                    raise where.error("hosts", f"{h!r} is not one of {', '.join(allowed)}"
                                               + (" (gossip loss is on agents' links)" if f.on == "gossip" else ""))
            if len(set(f.hosts)) != len(f.hosts):
                raise where.error("hosts", "a host is named twice")
        if f.action == "partition":
            named = [h for g in f.groups for h in g]
            for h in named:
                if h not in limiters:
                    raise where.error("groups", f"{h!r} is not a limiter ({', '.join(limiters)})")
            if len(set(named)) != len(named):
                raise where.error("groups", "the groups must be disjoint")
            rest = tuple(h for h in limiters if h not in named)
            groups = f.groups + ((rest,) if rest else ())
            if len(groups) < 2:
                raise where.error("groups", "a partition needs at least two groups")
            f = dataclasses.replace(f, groups=groups)
        out.append(f)
    return tuple(out)


def _agent_options(t: "_Table") -> dict[str, str]:
    out = {}
    for key in list(t.data):
        if key not in AGENT_OPTIONS:
            raise t.error(key, f"unknown agent option (expected one of {', '.join(AGENT_OPTIONS)})")
        value = str(t.data.pop(key))
        try:
            AGENT_OPTIONS[key](value)
        except (UnitError, ValueError) as e:
            raise t.error(key, str(e)) from None
        out[key] = value
    return out


def _check_graph(exp: Experiment, src: "_Source") -> None:
    """Links join known hosts; the sink hangs off one link; every flow crosses exactly one limiter."""
    seen = set()
    for i, link in enumerate(exp.links):
        where = _Table(src, {}, f"[[link]] #{i + 1}", "link", i)
        for end in link.ends:
            if end not in exp.hosts:
                raise where.error("ends", f"unknown host {end!r} (hosts: {', '.join(exp.hosts)})")
        if link.a == link.b or frozenset(link.ends) in seen:
            raise where.error("ends", "a link joins two different hosts, once")
        seen.add(frozenset(link.ends))
    if len(exp.neighbours(exp.sink)) != 1:
        raise _Table(src, {}, "[hosts]", "hosts", 0).error(
            exp.sink, "the sink needs exactly one link (the CTB reference limits that link's far end)")
    for i, tr in enumerate(exp.traffic):
        where = _Table(src, {}, f"[[traffic]] #{i + 1}", "traffic", i)
        if exp.hosts.get(tr.src) not in ("limiter", "source"):
            raise where.error("from", f"{tr.src!r} is not a limiter or source host")
        crossed = [h for h in exp.route(tr.src, exp.sink) if exp.hosts[h] == "limiter"]
        if len(crossed) != 1:
            raise where.error("from", f"the path {tr.src} -> {exp.sink} must cross exactly one limiter, "
                                      f"it crosses {len(crossed)}")
    for i, ev in enumerate(exp.events):
        if frozenset(ev.link) not in seen:
            raise _Table(src, {}, f"[[event]] #{i + 1}", "event", i).error("link", f"no link joins {ev.link[0]} and {ev.link[1]}")


def field_error(exp: Experiment, where: str, table: str, index: int, key: str, msg: str) -> SpecError:
    """The located error of a field of a loaded experiment (lab/preflight.py's checks), its
    line found again in the file it came from (none when it came from a string)."""
    try:
        text = Path(exp.path).read_text()
    except OSError:
        text = ""
    return _Table(_Source(text, exp.path), {}, where, table, index).error(key, msg)


def _in_range(v, lo, hi, lo_open=False, hi_open=False):
    if v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
        raise ValueError(f"{v} is out of range")
    return v


def _one_of(v, choices):
    if v not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
    return v


# -- reading tables with errors that point at the line -------------------------------

class _Source:
    def __init__(self, text: str, path: str):
        self.lines = text.splitlines()
        self.path = path

    def line(self, table: str | None, index: int | None, key: str | None) -> int | None:
        """Line of ``key`` in the ``index``-th ``[table]``/``[[table]]`` (or of the header itself)."""
        return key_line(self.lines, table, index, key)


class _Table:
    """A TOML table being read: typed getters, each failing with a located message."""

    def __init__(self, src: _Source, data: Any, where: str, table: str | None, index: int | None):
        if not isinstance(data, dict):
            raise SpecError(f"{src.path}:{src.line(table, index, None) or '?'}: {where} must be a table")
        self.src, self.data, self.where, self.table, self.index = src, dict(data), where, table, index

    def error(self, key: str | None, msg: str) -> SpecError:
        line = self.src.line(self.table, self.index, key)
        loc = f"{self.src.path}:{line}" if line else self.src.path
        return SpecError(f"{loc}: {self.where}: " + (f"field '{key}': " if key else "") + msg)

    def _get(self, key: str, default: Any) -> Any:
        if key not in self.data:
            if default is _REQUIRED:
                raise self.error(None, f"missing field '{key}'")
            return default
        return self.data.pop(key)

    def _parsed(self, key, default, parser):
        if key not in self.data:
            return self._get(key, default)
        value = self.data.pop(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and parser is not parse_rate:
            value = str(value)  # a bare number is seconds or bytes; a rate always needs its unit
        if not isinstance(value, str):
            raise self.error(key, f"expected a string like '10mbit', '50ms' or '75KB', got {value!r}")
        try:
            return parser(value)
        except UnitError as e:
            raise self.error(key, str(e)) from None

    def text(self, key, default=_REQUIRED, choices=None) -> str:
        value = self._get(key, default)
        if not isinstance(value, str) or (choices and value not in choices):
            want = f"one of {', '.join(choices)}" if choices else "a string"
            raise self.error(key, f"expected {want}, got {value!r}")
        return value

    def rate(self, key, default=_REQUIRED):
        """A rate above 0: a global of 0 ran to an iperf3 error, a link's 0 meant no shaping
        and a UDP group's 0 iperf3's unlimited."""
        rate = self._parsed(key, default, parse_rate)
        if rate == 0:
            raise self.error(key, "must be above 0")
        return rate

    def duration(self, key, default=_REQUIRED):
        return self._parsed(key, default, parse_duration)

    def size(self, key, default=_REQUIRED):
        return self._parsed(key, default, parse_size)

    def number(self, key, default=_REQUIRED, lo=-math.inf, hi=math.inf, lo_open=False, integer=False):
        value = self._get(key, default)
        ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type:
            raise self.error(key, f"expected {'an integer' if integer else 'a number'}, got {value!r}")
        try:
            return _in_range(value, lo, hi, lo_open=lo_open)
        except ValueError:
            raise self.error(key, f"{value} is out of range ({'>' if lo_open else '>='} {lo:g})") from None

    def integer(self, key, default=_REQUIRED, lo=-math.inf):
        return self.number(key, default, lo=lo, integer=True)

    def names(self, key, count) -> list[str]:
        value = self._get(key, _REQUIRED)
        if not (isinstance(value, list) and len(value) == count and all(isinstance(v, str) for v in value)):
            raise self.error(key, f"expected a list of {count} host names, got {value!r}")
        return value

    def host_list(self, key) -> list[str]:
        return self.text_list(key, "host names")

    def text_list(self, key, what="strings", choices=None) -> list[str]:
        """A non-empty list of strings (of ``choices`` only, when given)."""
        value = self._get(key, _REQUIRED)
        if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)
                and (not choices or set(value) <= set(choices))):
            want = ", ".join(choices) if choices else what
            raise self.error(key, f"expected a non-empty list of {want}, got {value!r}")
        return value

    def allocator_list(self, key) -> list[str]:
        value = self.text_list(key, "allocator names")
        for name in value:
            check_allocator(name, lambda msg: self.error(key, msg))
        return value

    def sub(self, key, required=True) -> "_Table":
        value = self._get(key, _REQUIRED if required else {})
        return _Table(self.src, value, f"[{key}]", key, 0)

    def array(self, key) -> list["_Table"]:
        value = self._get(key, [])
        if not isinstance(value, list):
            raise self.error(key, f"write [[{key}]] tables")
        return [_Table(self.src, v, f"[[{key}]] #{i + 1}", key, i) for i, v in enumerate(value)]

    def subtables(self, allocator=False) -> list[tuple[str, "_Table"]]:
        out = []
        for name in list(self.data):
            if allocator:
                check_allocator(name, lambda msg: self.error(name, msg))
            out.append((name, _Table(self.src, self.data.pop(name), f"[{self.table}.{name}]", f"{self.table}.{name}", 0)))
        return out

    def positive(self, value, key):
        if value <= 0:
            raise self.error(key, "must be positive")
        return value

    def finish(self) -> None:
        if self.data:
            key = next(iter(self.data))
            raise self.error(key, "unknown field (docs/lab.md lists the fields)")


def check_allocator(name: str, fail: Callable[[str], Exception]) -> None:
    """Known to the registry (agent/allocators); whether its module exists yet is checked at run time."""
    try:
        allocators.allocator_class(name)
    except ValueError:
        raise fail(f"unknown allocator {name!r}") from None
    except ImportError:
        pass
