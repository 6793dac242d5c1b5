"""Classes (tenants) at run time: each with its datapath slot, allocator, estimator and state.

    table = ClassTable(dp, enforcer, book, node_id="a", state_dir="/var/lib/drl", max_classes=4096)
    table.apply(config.classes, members)    # at start and on every reload: add, change, remove
    for run in table: ...                   # what the tick loop steps, one allocator per class

A class keeps its datapath slot (``class_id``) for as long as it exists, so a
reload never touches an unchanged class: its classification entries, bucket
and counters stay as they are (agent/kernel/datapath.py set_rules writes only what
changed).  A removed class's slot is reset only after no rule points at it
any more, and a new class's slot is reset and given a bucket at its 1/N
share before its rules are installed, so it is policed from its first packet.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from drl.agent.classes.spec import ClassRule
from drl.agent.kernel.classify import compile_rules
from drl.agent.estimator import Estimator
from drl.agent import logs, units
from drl.agent.cluster.limits import LimitBook
from drl.agent.gossip.core import Received
from drl.agent.gossip.dispatch import Dispatch
from drl.agent.model import Snapshot, Step

if TYPE_CHECKING:
    from drl.agent.config.build import ClassConf
    from drl.agent.service.enforce import Enforcer

log = logs.get_logger("drl.agent")


@dataclass(slots=True)
class ClassRun:
    """One class while it runs; ``last`` is the latest tick's (snapshot, step, counters)."""
    conf: "ClassConf"
    class_id: int
    state: Any
    estimator: Estimator
    statefile: "StateFile | None"
    inbox: list = field(default_factory=list)
    last: tuple[Snapshot, Step, Any] | None = None
    said: tuple[str, Any] | None = None      # (mode, warning) last logged
    written: tuple | None = None             # the config last written to the datapath (agent/service/enforce.py)

    @property
    def name(self) -> str:
        return self.conf.name


@dataclass(frozen=True)
class Changes:
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


class ClassTable:
    def __init__(self, dp, enforce: "Enforcer", book: LimitBook, *, node_id: str, state_dir: str, max_classes: int,
                 founders: Callable[[str, tuple[str, ...]], tuple[str, ...]] | None = None):
        self.dp, self.enforce, self.book = dp, enforce, book     # dp: the rules; enforce: the class configs
        self.founders = founders          # with a registry: Registry.founders
        self.node_id, self.state_dir, self.max_classes = node_id, state_dir, max_classes
        self._runs: dict[str, ClassRun] = {}
        self._by_key: dict[int, ClassRun] = {}

    def __iter__(self) -> Iterator[ClassRun]:
        return iter(self._runs.values())

    def __len__(self) -> int:
        return len(self._runs)

    def subscribe(self, dispatch: Dispatch) -> None:
        """Point-to-point bodies (whatever no other consumer takes) go to their class's inbox."""
        dispatch.otherwise(self._to_inbox)

    def _to_inbox(self, rx: Received, now: float) -> None:
        if (run := self._by_key.get(rx.header.class_id)) is not None:
            run.inbox.append(rx.envelope)

    def by_key(self, key: int) -> ClassRun | None:
        return self._by_key.get(key)

    def signed(self, key: int) -> bool:
        """Whether class ``key``'s peers may publish a value below 0 (the gossip core drops any
        other negative value): only the GDRL family's, whose value is an indicator (spare
        capacity, fill ratio) compared with ours, never summed as a weight or rate is."""
        run = self._by_key.get(key)
        return run is not None and hasattr(run.conf.allocator, "indicator")

    def reads_sum(self, key: int) -> bool:
        """Whether class ``key``'s allocator reads only the sum of its peers' values (FPS, GRD),
        which the sum tree can bring (agent/gossip/tree.py)."""
        run = self._by_key.get(key)
        return run is not None and getattr(run.conf.allocator, "reads_sum", False)

    def get(self, name: str) -> ClassRun | None:
        return self._runs.get(name)

    def apply(self, confs: tuple["ClassConf", ...], members: tuple[str, ...], n_nodes: int) -> Changes:
        """Make the running classes those of ``confs``; the datapath follows in one rule change."""
        if len(confs) > self.max_classes:
            raise ValueError(f"{len(confs)} classes, at most {self.max_classes} (--max-classes)")
        wanted = {c.name: c for c in confs}
        removed = [name for name in self._runs if name not in wanted]
        changed = [c.name for c in confs if c.name in self._runs and self._runs[c.name].conf != c]
        free = sorted(set(range(self.max_classes)) - {r.class_id for r in self._runs.values()})
        added = [c.name for c in confs if c.name not in self._runs]
        slots = {name: run.class_id for name, run in self._runs.items()} | dict(zip(added, free))
        compile_rules(_rules(confs, slots))     # ClassifyError (one line) before anything changes
        for name, class_id in zip(added, free):
            self._start(wanted[name], class_id, members, n_nodes)
        for name in changed:
            self._change(self._runs[name], wanted[name], members)
        freed = [self._runs.pop(name).class_id for name in removed]
        for name in removed:
            self.book.forget(name)
        self._order(confs)
        self.dp.set_rules(_rules(confs, slots))
        for class_id in freed:
            self.enforce.free(class_id)
        self.book.save()
        return Changes(tuple(added), tuple(changed), tuple(removed))

    def _start(self, conf: "ClassConf", class_id: int, members: tuple[str, ...], n_nodes: int) -> None:
        self.book.configure(conf.name, conf.global_Bps)
        statefile = StateFile.for_class(conf, self.node_id, self.state_dir)
        state = statefile.load() if statefile else None
        if state is None:
            state = conf.allocator.initial_state(self.node_id, self._genesis(conf, members))
        self.enforce.start(conf, class_id, n_nodes)
        self._runs[conf.name] = ClassRun(conf, class_id, state, Estimator(conf.ewma, conf.flow_ewma), statefile)

    def _change(self, run: ClassRun, conf: "ClassConf", members: tuple[str, ...]) -> None:
        self.book.configure(conf.name, conf.global_Bps)
        if conf.allocator != run.conf.allocator:
            run.statefile = StateFile.for_class(conf, self.node_id, self.state_dir)
            run.state = conf.allocator.initial_state(self.node_id, self._genesis(conf, members))
        if (conf.ewma, conf.flow_ewma) != (run.conf.ewma, run.conf.flow_ewma):
            run.estimator = Estimator(conf.ewma, conf.flow_ewma)
        # shadow on or off is nothing more: the next tick writes it with the rest of the
        # config; bucket, counters and allocator state carry on
        run.conf = conf

    def _genesis(self, conf: "ClassConf", members: tuple[str, ...]) -> tuple[str, ...]:
        """The members a class's allocator starts from: with a registry, a diffusion
        allocator gets its founders, the same on every agent (genesis shares add up to
        the limit); otherwise the members now."""
        if self.founders is not None and getattr(conf.allocator, "genesis_shares", False):
            return self.founders(conf.name, members)
        return members

    def _order(self, confs: tuple["ClassConf", ...]) -> None:
        """Iteration in config order (status lists classes as the file does)."""
        self._runs = {c.name: self._runs[c.name] for c in confs}
        self._by_key = {run.conf.key: run for run in self._runs.values()}


def _rules(confs: tuple["ClassConf", ...], slots: dict[str, int]) -> list[tuple[ClassRule, int]]:
    """Every class's match specs with its datapath slot; no spec = every IP packet."""
    return [(rule, slots[c.name]) for c in confs for rule in c.match_rules]


class StateFileError(Exception):
    """An allocator's saved state cannot be read; one line."""


def _out_of_bounds(data: Any, key: str = "") -> str | None:
    """``key: why`` for the first number in a saved state outside 0..MAX_AMOUNT (agent/units.py;
    every number an allocator saves is a counter, an amount, a time or a gain), else None."""
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            try:
                units.check_amount(data, key or "the state")
            except units.UnitError as e:
                return str(e)
        return None
    for k, v in items:
        bad = _out_of_bounds(v, f"{key}.{k}" if key else str(k))
        if bad is not None:
            return bad
    return None


class StateFile:
    """A class's allocator state on disk, for allocators with dump_state/load_state (dqmp).

    Written on every tick that changed it, with write-to-temp + rename, so a
    crash leaves the old or the new snapshot, never half of one."""

    def __init__(self, alloc, path: Path):
        self.alloc, self.path = alloc, path
        self._saved: str | None = None      # what the file holds: an unchanged state is not written

    @classmethod
    def for_class(cls, conf: "ClassConf", node_id: str, state_dir: str) -> "StateFile | None":
        alloc = conf.allocator
        if not hasattr(alloc, "dump_state"):
            return None
        # the class "default" keeps the file name of the single-class agent it replaces
        suffix = "" if conf.name == "default" else f"-{conf.name}"
        return cls(alloc, Path(state_dir) / f"{alloc.name}-{node_id}{suffix}.json")

    def load(self) -> Any:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as e:
            raise StateFileError(f"state file {self.path} is unreadable ({e}); remove it to start afresh") from None
        try:
            bad = _out_of_bounds(data)
        except RecursionError:
            bad = "nested too deep"
        if bad is not None:       # a NaN holding, a negative counter: what it held is lost, not trusted
            log.warning("state_refused", allocator=self.alloc.name, file=self.path, error=bad,
                        action="starting afresh")
            return None
        try:
            state = self.alloc.load_state(data)
        except (KeyError, TypeError, ValueError) as e:
            raise StateFileError(f"state file {self.path} does not hold {self.alloc.name} state ({e}); "
                                 "remove it to start afresh") from None
        log.info("state_restored", allocator=self.alloc.name, file=self.path)
        return state

    def save(self, state: Any) -> None:
        text = json.dumps(self.alloc.dump_state(state))
        if text == self._saved:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        self._saved = text
