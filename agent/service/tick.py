"""The tick: kernel maps -> estimator -> the class step -> enforcement + gossip.

    tick(agent, now)        # what the loop (service/daemon.py) runs every interval

One tick reads every class's counters and the flow table, estimates each class's demand
(agent/estimator.py), runs the class step the simulator runs too (agent/step.py: peer view,
tree sums, allocator, heard cap), hands the decision to enforcement (service/enforce.py, the
one writer of kernel config), then gossips all classes' published values together
(agent/gossip/core.py batches them), the sum tree's round, the allocators' point-to-point
messages and the per-client reports.  A class whose step fails is held to its safe rate and
counted by stage; the others go on.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from drl.agent import logs
from drl.agent.gossip.core import Outgoing
from drl.agent.gossip.tree import tree_wanted
from drl.agent.kernel.datapath import Counters, now_ns
from drl.agent.model import SLOW_START_Bps, Mode
from drl.agent.service.class_table import ClassRun
from drl.agent.service.rates import local_limit, safe_rate, send_gap_s
from drl.agent.service.unmatched import gossip_wire_bytes
from drl.agent.step import ClassInput, class_step

if TYPE_CHECKING:
    from drl.agent.service.daemon import Agent

log = logs.get_logger("drl.agent")


class _Enforcing(Exception):
    """A class's write failed (its __cause__): the tick counts it as stage ``enforce``."""


def tick(agent: "Agent", now: float) -> None:
    agent.dp.ensure_attached()      # our filter removed or replaced behind our back: attach again
    agent.shaper.ensure_attached()  # the same for shape mode's HTB root (no-op without shaped classes)
    runs = list(agent.table)
    counters = agent.dp.read_counters([run.class_id for run in runs])
    flows = agent.dp.read_flows()
    kernel_now = now_ns()
    unsent = _unsent(agent, now)
    out = {}
    with agent.dp.batch():
        for run in runs:
            try:
                out[run.conf.key] = _step(agent, run, now, counters[run.class_id], flows.get(run.class_id, []),
                                          kernel_now, unsent)
            except Exception as e:      # one class's failure is that class's: the others go on
                stage, e = ("enforce", e.__cause__) if isinstance(e, _Enforcing) else ("allocate", e)
                agent.errors.record(stage, e, now, class_=run.name)
                _fall_back(agent, run)
    agent.dp.heartbeat()     # every config stays fresh, the ones not written again too
    agent.unmatched.observe(now, runs, counters, agent.dp.read_bypass(), gossip_wire_bytes(agent.transport.stats))
    if agent.unseen.due(now):
        agent.unseen.observe(now, agent.members.status(now))
    agent.transport.publish(out, now)
    try:
        _sum_round(agent, out, now)
    except Exception as e:      # the classes read per-peer gossip's sums instead (tree_on)
        agent.tree_on = False
        agent.errors.record("sum_tree", e, now)
    if agent.clients:
        n_hosts = 1 + agent.members.view(0, now).n_alive      # the hosts whose reports count
        reports = agent.clients.tick(now, n_hosts, agent.members.timeout_s)
        if reports:
            agent.transport.report_clients(reports, now)
    agent.changes.log(now, agent.transport.stats.rejected, agent.members.status(now), agent.table)
    agent.ticks += 1


def _unsent(agent: "Agent", now: float) -> int:
    """Peers this loop left without a datagram for longer than the stale rule allows (a tick
    held up: thousands of new clients, a starved CPU).  They may count us stale and reserve
    no more than our safe rate once our fail-safe would have started, while our kernel,
    heartbeat by heartbeat, still passes our limit: so every class is held to its safe
    rate, as when a peer says it no longer hears us (model.heard_cap)."""
    gap_s = send_gap_s(agent.cfg, len(agent.transport.peer_addrs))
    unsent = agent.transport.overdue(now, gap_s)
    if agent.tick_stats.unsent(unsent):
        log.warning("gossip_late", peers=unsent, gap_ms=round(gap_s * 1000), held="safe_rate")
    return unsent


def _step(agent: "Agent", run: ClassRun, now: float, counters: Counters, flows: list, kernel_now: int,
          unsent: int) -> Outgoing:
    """One class's estimate -> class step -> enforce; what it gossips this round."""
    cfg, n_nodes = agent.cfg, agent.members.n_nodes
    local = run.estimator.update(now, counters, flows, kernel_now)
    limit = agent.book.get(run.name)
    safe_Bps = safe_rate(run.conf, limit, n_nodes)
    view = agent.members.view(run.conf.key, now, safe_Bps)
    if unsent:
        view = view._replace(unheard_by=view.unheard_by + unsent)
    sums = agent.tree if agent.tree_on and agent.table.reads_sum(run.conf.key) else None
    given = ClassInput(now, cfg.node_id, cfg.interval_s, limit.global_Bps, local, view, run.inbox, safe_Bps,
                       run.conf.key)
    snap, step = class_step(run.conf.allocator, run.state, given, sums)
    run.inbox = []
    run.state = step.state
    try:
        agent.enforce.decision(run, step.decision, safe_Bps, n_nodes)
    except Exception as e:          # told apart from the allocator's in the count (tick_errors.py)
        raise _Enforcing() from e
    if run.statefile:
        run.statefile.save(run.state)   # before the outbox: a restored node sent nothing it forgot
    for env in step.outbox:
        agent.transport.send(env, run.conf.key, now)
    agent.drops.count(run, counters)
    run.last = (snap, step, counters)
    d = step.decision
    may_pass = local_limit(d, local)
    if d.mode == Mode.BUCKET:       # a bucket never refills slower than the slow-start floor
        may_pass = max(may_pass, SLOW_START_Bps)
    return Outgoing(d.publish, limit.version, local.demand_Bps > 0, may_pass)


def _fall_back(agent: "Agent", run: ClassRun) -> None:
    """A class whose step failed says nothing this round and is held to its safe rate."""
    try:
        agent.enforce.fall_back(run, agent.members.n_nodes)
    except Exception as e:
        agent.errors.record("fallback", e, time.monotonic(), class_=run.name)


def _sum_round(agent: "Agent", out: dict[int, Outgoing], now: float) -> None:
    """The sum tree's messages (agent/gossip/tree.py), when per-peer gossip is slower than one
    interval and some class's allocator reads only the sum of its peers' values."""
    summed = {key: o.value for key, o in out.items() if agent.table.reads_sum(key)}
    agent.tree_on = tree_wanted(len(agent.transport.peer_addrs), agent.cfg.branching, bool(summed))
    if agent.tree_on:
        agent.tree.timeout_s = agent.members.timeout_s
        for node, sums in agent.tree.round(agent.members.view(0, now).members, summed, now, agent.transport.knows):
            agent.transport.send_sums(node, sums, now)
