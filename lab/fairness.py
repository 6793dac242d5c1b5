"""Jain's fairness index, the one definition the agent, the lab, the simulator and the tests share.

    >>> jain([1.0, 1.0, 1.0, 0.0])
    0.75
    >>> jain([0.0, 0.0])
    1.0

Pure Python on purpose: sim/ and lab/ both import it, and neither may pull
the other (or numpy) in through it.
"""
from __future__ import annotations

from typing import Iterable


def jain(values: Iterable[float]) -> float:
    """(sum x)^2 / (k sum x^2), [Raghavan07] §4.1 and [Stanojevic09] eq. (16): 1 when all k members get the
    same, 1/k when one gets everything.

    NaN values (a simulated node that is down) are left out.  Empty or all-zero input
    gives 1.0: every member got the same, nothing, and an idle system is not unfair.
    """
    xs = [float(v) for v in values]
    xs = [x for x in xs if x == x]
    top = max(xs, default=0.0)
    if top <= 0.0:
        return 1.0
    xs = [x / top for x in xs]       # the index ignores scale; squares of tiny rates would underflow
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
