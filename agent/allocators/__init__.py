"""Allocator registry: name -> class, imported on first use.

    >>> from agent.allocators import create
    >>> alloc = create("grd")
    >>> state = alloc.initial_state("n1", ("n1", "n2"))

Every allocator follows the contract in agent/allocators/base.py.  The agent
(agent/daemon.py) and the simulator (sim/) both build allocators only through
``create``, so they always run the same code.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import Any

from .base import Allocator

_REGISTRY = {
    "static": "agent.allocators.static:Static",
    "ctb": "agent.allocators.ctb:CentralTokenBucket",
    "gtb": "agent.allocators.gtb:GlobalTokenBucket",
    "grd": "agent.allocators.grd:GlobalRandomDrop",
    "fps": "agent.allocators.fps:FlowProportionalShare",
    "gdrl": "agent.allocators.gdrl:Gdrl",
    "fillratio": "agent.allocators.fillratio:FillRatio",
    "dqmp": "agent.allocators.dqmp:Dqmp",
    "lease": "agent.allocators.lease:Lease",
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
