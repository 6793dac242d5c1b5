"""Steps more than one allocator takes, written once.

    >>> drop_probability(demand_Bps=12e6, limit_Bps=10e6)   # GRD, Fig. 1 line 4
    0.16666666666666666
    >>> round(kept_share(ewma_per_s=0.1, elapsed_s=0.05), 3)  # the paper's "1-second EWMA" per 50 ms tick
    0.891
    >>> view = peer_view(["a", "b", "c"], [PeerState("b", 3e6, alive=True, age_s=0.05),
    ...                                    PeerState("c", 2e6, alive=False, age_s=9.0)])
    >>> view.remote_sum, view.n_alive, view.n_stale
    (3000000.0, 1, 1)
    >>> idle_split(demand_Bps=0.0, others=0.0, limit_Bps=3e6, n_sharing=3)    # an idle cluster
    1000000.0

Parameters are checked when an allocator is built (``check_range``); a bad one
raises :class:`ParameterError`, whose message is one line a CLI can print as is.
"""
from __future__ import annotations

from typing import Iterable

from drl.agent.model import SLOW_START_Bps, Decision, Mode, PeerState, PeerView, Snapshot, Step


class ParameterError(ValueError):
    """An allocator parameter outside its range; the message names it and the range."""


def check_range(name: str, value: float, low: float, high: float, *,
                low_open: bool = False, high_open: bool = False) -> None:
    """Raise ParameterError unless ``value`` lies in the interval; ``*_open`` excludes an end."""
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above or value != value:  # value != value: NaN
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ParameterError(f"{name} must be in {interval}, got {value!r}")


def peer_view(members: Iterable[str], peers: Iterable[PeerState]) -> PeerView:
    """A PeerView from the peers' states with the stale policy of [Raghavan07]
    §5.6 applied: a stale peer's value counts zero in ``remote_sum``.

    For callers that hold one PeerState per peer (the daemon's membership
    table, tests); the simulator keeps the sums incrementally instead (sim/views.py).
    """
    by_id = {peer.node_id: peer for peer in peers}
    alive = [peer for peer in by_id.values() if peer.alive]
    return PeerView(members=tuple(sorted(members)), peers=by_id,
                    remote_sum=sum(peer.value for peer in alive), n_alive=len(alive))


def idle_split(demand_Bps: float, others: float, limit_Bps: float, n_sharing: int) -> float | None:
    """The static split ``limit_Bps / n_sharing`` for a node with (next to) no demand whose
    peers report nothing (``others``, their weights or rates, <= 0); None otherwise.

    An allocator that gives a node "the limit less what the others report" (GTB) or "its
    weight over all weights" (FPS line 10) hands every node of an idle cluster the whole
    limit, and when traffic comes back on all of them at once they pass N times it until
    the next reports arrive.  An idle cluster holds the static split instead, which adds up
    to the limit.  "Next to no demand": below the datapath's slow-start floor (what passes
    at a zero limit anyway) and below the split itself.
    """
    split = limit_Bps / max(1, n_sharing)
    if others <= 0.0 and demand_Bps < min(SLOW_START_Bps, split):
        return split
    return None


def drop_probability(demand_Bps: float, limit_Bps: float) -> float:
    """Share of arrivals to drop so that ``demand`` is cut to ``limit``.

    GRD-HANDLE-PACKET lines 3-4, [Raghavan07] Fig. 1: dropping
    (demand - limit) / demand of every packet forwards demand * (1 - p) = limit.
    """
    if demand_Bps <= limit_Bps or demand_Bps <= 0.0:
        return 0.0
    return (demand_Bps - limit_Bps) / demand_Bps


def kept_share(ewma_per_s: float, elapsed_s: float) -> float:
    """The EWMA weight kept from the past over ``elapsed_s`` for a per-second parameter.

    [Raghavan07] §5.1 and footnote 4 quote a "1-second EWMA
    parameter" of 0.1: after one second 10 % of the old value is left.  Keeping
    ``ewma_per_s ** elapsed_s`` every tick gives exactly that whatever the
    estimate interval, so changing the interval does not change the smoothing.
    """
    return ewma_per_s ** max(0.0, elapsed_s)


def bucket_step(limit_Bps: float, snap: Snapshot, **info: float) -> Step:
    """A stateless token bucket at ``limit_Bps`` (clamped at 0) that publishes the
    local arrival rate, so peers and ``drlctl status`` see what this node wants."""
    decision = Decision(mode=Mode.BUCKET, limit_Bps=max(0.0, limit_Bps),
                        publish=snap.local.demand_Bps, info=info)
    return Step(state=None, decision=decision)
