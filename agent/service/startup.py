"""Start-up: what the agent runs with, and the order it acquires it in.

    Agent(config, transport=udp_transport, datapath=kernel_datapath, shaper=kernel_shaper)
    acquire(agent, stack, transport, datapath, shaper)      # Agent.__init__

The factories build the real resources (UDP gossip, the tc-egress program, HTB); tests pass
in-memory ones instead (gossip.memory, kernel.fake).  A datapath or shaper is detached at a
stop and left enforcing after a failure (service/daemon.py Agent.failed).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from drl.agent.cluster.limits import LimitBook
from drl.agent.config.build import Config
from drl.agent.gossip.core import CLUSTER, new_incarnation
from drl.agent.gossip.dispatch import Dispatch
from drl.agent.gossip.membership import Membership
from drl.agent.gossip.transport import Standalone, UdpTransport
from drl.agent.gossip.tree import SumTree
from drl.agent.kernel.datapath import Datapath
from drl.agent.kernel.shaper import Shaper
from drl.agent.service.class_table import ClassTable
from drl.agent.service.client_rules import ClientRules
from drl.agent.service.control import ControlServer
from drl.agent.service.enforce import Enforcer
from drl.agent.service.limit_gossip import LimitGossip
from drl.agent.service.metrics import Board, MetricsServer
from drl.agent.service.rates import slack_s
from drl.agent.service.registry_sync import RegistrySync

if TYPE_CHECKING:
    from drl.agent.service.daemon import Agent

GC_YOUNG_THRESHOLD = 20_000     # allocations between young collections (Python's default: 700)


def tune_gc() -> None:
    """A tick at 1,000 classes allocates ~15,000 short-lived objects over a heap of
    long-lived per-class state; with the default thresholds (700, 10, 10) the collector
    ran ~57 times a second and took 10 % of a core (gc.callbacks timing the collections
    of the measured agent of bench/agent_cost.py: 2.5 s of 25; 0.04 s after this).  The
    loop makes few reference cycles, so collect the young generation 30x less often, and
    freeze what startup made (bcc, the program, every class) out of the full collections,
    after collecting startup's own garbage so that none of it is frozen for good."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


def udp_transport(cfg: Config) -> UdpTransport | Standalone:
    """The gossip transport the agent runs with: UDP on ``--listen``, or none without peers."""
    if cfg.standalone:
        return Standalone()
    return UdpTransport.bind(cfg.listen, [p.addr for p in cfg.peers], mark=cfg.gossip_mark, node_id=cfg.node_id,
                             cluster=CLUSTER,
                             key=cfg.key, branching=cfg.branching, incarnation=new_incarnation(),
                             names={p.addr: p.node_id for p in cfg.peers if p.node_id}, timeout_s=cfg.peer_timeout_s,
                             keys=cfg.node_keys)


def kernel_datapath(cfg: Config, gossip_port: int | None) -> Datapath:
    """The datapath the agent runs with, on ``--iface``; our own gossip (from the port, with
    the mark) and registry connections (to etcd's port, with the mark) are never policed;
    ``exclusive``: one agent per interface (agent/kernel/lock.py)."""
    return Datapath(cfg.iface, max_flows=cfg.max_flows, max_classes=cfg.max_classes, max_clients=cfg.max_clients,
                    gossip_port=gossip_port, gossip_mark=cfg.gossip_mark,
                    registry_port=cfg.registry.endpoints[0][1] if cfg.registry else None, exclusive=True,
                    filter_ahead=cfg.filter_ahead)


def kernel_shaper(cfg: Config) -> Shaper:
    """Shape mode's HTB tree on ``--iface`` (agent/kernel/shaper.py); it touches nothing until a class
    is shaped, and restores the root qdisc it replaced when the last one goes.  An agent that
    shapes nothing puts back at once what a killed shape agent's HTB replaced: nothing else
    would (an operator who turned shape mode off after the crash kept the HTB for good)."""
    shaper = Shaper(cfg.iface, state_dir=cfg.state_dir)
    if not any(c.shaped for c in cfg.classes):
        shaper.restore_leftover()
    return shaper


def acquire(agent: "Agent", stack: contextlib.ExitStack, transport: Callable[[Config], Any],
            datapath: Callable[[Config, int | None], Any], shaper: Callable[[Config], Any]) -> None:
    """The agent's sockets, state and BPF, in the order that leaves nothing attached if one
    fails; each with its closer on ``stack``, so closing it undoes what was acquired."""
    cfg = agent.cfg
    agent.control = ControlServer(cfg.socket_path)
    stack.callback(agent.control.close)
    agent.transport = transport(cfg)
    stack.callback(agent.transport.close)
    # a scrape (metrics thread) waits at most a few intervals for the next tick's status
    # a snapshot at most one interval old: an older one would shift Prometheus's samples by
    # up to its age (a CI run's rate over 10 s read 0.90 of iperf3's with a 1 s limit)
    agent.board = Board(timeout_s=min(5.0, max(1.0, 2 * cfg.interval_s)), max_age_s=cfg.interval_s)
    if cfg.metrics is not None:
        stack.callback(MetricsServer(cfg.metrics, agent.board).close)
    names = {agent.transport.resolved[p.addr]: p.node_id for p in cfg.peers if p.node_id}
    agent.members = Membership(cfg.node_id, agent.transport.peer_addrs, cfg.peer_timeout_s, names=names,
                               failsafe_s=cfg.failsafe_s, slack_s=slack_s(cfg, len(cfg.peers)))
    agent.sync = RegistrySync(cfg, agent.transport, agent.members)
    agent.tree = SumTree(cfg.node_id, cfg.interval_s, agent.members.timeout_s)
    agent.tree_on = False        # this tick's: tree_wanted (the peers and the classes may change)
    if cfg.registry is not None:
        stack.callback(lambda: agent.sync.close(leave=not agent.failed))     # after the datapath's: we leave last
        agent.cfg = cfg = dataclasses.replace(cfg, classes=agent.sync.start())
    agent.book = LimitBook(Path(cfg.state_dir) / f"limits-{cfg.node_id}.json")
    agent.dp = datapath(cfg, agent.transport.address[1] if agent.transport.address else None)
    stack.callback(lambda: agent.dp.close(detach=not agent.failed))
    agent.shaper = shaper(cfg)
    stack.callback(lambda: agent.shaper.close(detach=not agent.failed))    # before dp's: the root qdisc first
    agent.enforce = Enforcer(agent.dp, agent.shaper, agent.book, failsafe_s=cfg.failsafe_s)
    agent.table = ClassTable(agent.dp, agent.enforce, agent.book, node_id=cfg.node_id, state_dir=cfg.state_dir,
                             max_classes=cfg.max_classes, founders=agent.registry and agent.registry.founders)
    agent.transport.set_signed(agent.table.signed)      # peers' negative values: per class
    agent.table.apply(cfg.classes, agent.member_ids(), agent.members.n_nodes)
    agent.clients = ClientRules(agent.dp, cfg.node_id)
    agent.clients.apply(agent.table, time.monotonic(), agent.members.timeout_s, agent.members.n_nodes)
    agent.limits = LimitGossip(agent.book, agent.table, agent.transport)
    agent.dispatch = Dispatch(agent.members.observe)
    for consumer in (agent.limits, agent.tree, agent.clients, agent.table):
        consumer.subscribe(agent.dispatch)
    for run in agent.table:      # peers whose file says otherwise, or who missed a change, learn ours
        agent.limits.announce(run)
    agent.dp.set_sample_probability(cfg.sample_probability)
    agent.dp.attach()
