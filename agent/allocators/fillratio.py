"""Fill ratio: GDRL with the fill ratio S_i/D_i as indicator, on a ring of d = 2
([Ramsden]).

    >>> from drl.agent.allocators import create
    >>> alloc = create("fillratio")                       # eta = 1/4, ring
    >>> joiner = create("fillratio", join=True, seed=3)   # starts at zero supply

Supply is passed, never estimated ([Ramsden] §2.3: S_i += delta on one side, S_j -=
delta on the other), through the same acknowledged transfers as GDRL, so the
sum of supplies plus what is in flight is R at every step.  [Ramsden] eq. 2 adds
``eta * (S_i/D_i - S_j/D_j)`` to S_i, which would move supply towards the
node that already has the most per unit of demand and mixes a ratio with a
rate; we follow GDRL instead: the node with the higher fill ratio gives
``eta * D_i * (S_i/D_i - S_j/D_j)`` B/s (gdrl.py, indicator ``fillratio``).

Faults ([Ramsden] §3):

* node failure / removal: after ``dead_after_s`` the next node in ring order,
  the *best buddy*, inherits the failed node's share and each neighbour takes
  back its link counter (transfer.py);
* netsplit: a link to a node that is silent for less than ``dead_after_s`` is
  left alone; supply on both sides stays where it is and transfers waiting
  for an ack are resent after the split heals, so no supply is created.  A
  split longer than ``dead_after_s`` cannot be told from a crash: the far side
  is inherited while it may still hold its supply, so choose ``dead_after_s``
  above the longest partition you expect;
* joining: ``join=True`` starts with zero supply and two random neighbours
  (seeded by ``seed``), which learn of it from its first (empty) transfer;
* leaving and rejoining under the old id: as in GDRL (gdrl.py, "Membership
  follows the PeerView"): a leaver's best buddy inherits at once, a node
  restarted from its saved state holds nothing until its best buddy returns
  its share.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .gdrl import Gdrl


@dataclass(frozen=True)
class FillRatio(Gdrl):
    name: ClassVar[str] = "fillratio"
    indicator: str = "fillratio"
    equal_bias: float = 0.0     # [Ramsden] eq. 1 exactly: S_i/D_i equal, no tie-break (gdrl.py "Indicators")
