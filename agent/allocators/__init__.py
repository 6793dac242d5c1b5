"""Allocators: the contract they share, and the registry that builds them by name.

    >>> from drl.agent.allocators import create
    >>> alloc = create("grd")
    >>> state = alloc.initial_state("n1", ("n1", "n2"))

An allocator is **pure**: ``step(state, snapshot) -> Step`` (the types are in
agent/model.py).  It never reads a clock, a socket or a BPF map; time,
measurements, the peer view and the messages received since the last tick all
arrive in the ``Snapshot``, and everything it wants done comes back in the
``Step``:

* ``decision``: what the datapath enforces until the next tick (mode, local
  limit, drop probability, byte allowance) plus ``publish``, the one number
  gossiped to peers as an Update (a rate for GRD/GTB, a weight for FPS, a
  performance indicator for GDRL ...);
* ``outbox``: point-to-point messages (pairwise transfers and their acks,
  lease requests and grants, quota reports) for the gossip layer to deliver;
* ``state``: the allocator's next state, handed back on the next call.

Write a new allocator as a frozen dataclass whose fields are its parameters,
with ``name``, ``initial_state`` and ``step``, and register it in ``_REGISTRY``
below.  One whose state depends on the members' ids (a graph, lease servers)
sets ``needs_member_ids = True``: the agent then requires every peer to be
named (``--peers ID@HOST:PORT``) before it starts.  Units: rates are bytes/s,
amounts of volume are bytes, times are seconds (see agent/units.py).

The agent (agent/service/daemon.py) and the simulator (sim/) both build allocators
only through ``create``, so they always run the same code.

Members change at run time (joins, leaves, restarts under an old id): an
allocator derives every change from ``snap.view.members`` and
``view.peers[...].incarnation`` against its own state; none needs a call of
its own.  docs/allocators.md says what each one does.

May import: the standard library and ``drl.agent.model`` (with what it imports).  Never
bcc, pyroute2, psutil, protobuf, click, sockets or another part of the agent: allocators
are pure, and the simulator runs them as they are.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import Any

from drl.agent.model import Allocator

_REGISTRY = {
    "static": "drl.agent.allocators.static:Static",
    "ctb": "drl.agent.allocators.ctb:CentralTokenBucket",
    "gtb": "drl.agent.allocators.gtb:GlobalTokenBucket",
    "grd": "drl.agent.allocators.grd:GlobalRandomDrop",
    "fps": "drl.agent.allocators.fps:FlowProportionalShare",
    "gdrl": "drl.agent.allocators.gdrl:Gdrl",
    "fillratio": "drl.agent.allocators.fillratio:FillRatio",
    "dqmp": "drl.agent.allocators.dqmp:Dqmp",
    "lease": "drl.agent.allocators.lease:Lease",
}


def names() -> list[str]:
    """Allocators whose module is present, in registry order."""
    out = []
    for name, target in _REGISTRY.items():
        if importlib.util.find_spec(target.split(":")[0]) is not None:
            out.append(name)
    return out


def allocator_class(name: str) -> type:
    try:
        module, cls = _REGISTRY[name].split(":")
    except KeyError:
        raise ValueError(f"unknown allocator {name!r} (choose from {', '.join(names())})") from None
    return getattr(importlib.import_module(module), cls)


def create(name: str, **params: Any) -> Allocator:
    """Build allocator ``name``; ``params`` it has no field for are ignored, so a CLI
    can pass all of its allocator options to whichever allocator was chosen."""
    cls = allocator_class(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in params.items() if k in fields and v is not None})
