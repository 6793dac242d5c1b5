"""A gossip sender's incarnations, each with its own replay window (agent/gossip/core.py uses it).

    lives = Lives()
    lives.accept(incarnation, seq, now, timeout_s)   # SeqWindow's gap, or a Reason
"""
from __future__ import annotations

from drl.agent.gossip.wire import Reason

MAX_LIVES = 4           # incarnations remembered per sender, each with its replay window


class SeqWindow:
    """Anti-replay sliding window over one sender's sequence numbers (RFC 4303 §3.4.3).

    ``accept(seq)`` returns None for a replay (seen, or left of the window), else the
    change in the count of lost datagrams: the gap jumped over when ``seq`` is the
    newest yet ([Raghavan07] §4.2: the sequence number tells the
    receiver an update was lost), -1 when a datagram counted lost arrives late,
    0 otherwise.  The first seq seen starts the window: nothing before it is lost
    or accepted.
    """
    __slots__ = ("top", "bits")
    SIZE = 64

    def __init__(self) -> None:
        self.top = 0          # highest seq accepted; 0 = nothing yet (valid seqs start at 1)
        self.bits = 0         # bit i set = seq (top - i) seen

    def accept(self, seq: int) -> int | None:
        if self.top == 0:      # start here; anything older counts as seen (it is superseded)
            self.top, self.bits = seq, (1 << self.SIZE) - 1
            return 0
        if seq > self.top:
            shift = seq - self.top
            # a jump past the window leaves only seq in it; shifting by a key holder's 2^41
            # would build a 2^41-bit integer first (MemoryError: the agent died of one datagram)
            self.bits = 1 if shift >= self.SIZE else ((self.bits << shift) | 1) & ((1 << self.SIZE) - 1)
            self.top = seq
            return shift - 1
        offset = self.top - seq
        if offset >= self.SIZE or self.bits >> offset & 1:
            return None
        self.bits |= 1 << offset
        return -1


class _Life:
    """One incarnation of a sender: its replay window, and when a fresh datagram of it last came."""
    __slots__ = ("window", "heard")

    def __init__(self, now: float) -> None:
        self.window, self.heard = SeqWindow(), now


class Lives:
    """A sender's incarnations ("lives"), each with its own :class:`SeqWindow`.

    A restarted agent comes back with a higher incarnation (wall-clock ms), so a
    lower one is a previous life: ``old_incarnation`` while a higher life is heard.
    But a higher incarnation is only a claim: one datagram of a key holder (or a
    clock that jumped) would otherwise lock the real life out for good.  So a
    higher life *shouts down* a lower one only while it has been heard within
    ``timeout_s`` (the liveness timeout: after that it is as dead as a silent
    peer), and the lower life is accepted again at most ``timeout_s`` after the
    higher one went quiet.  Keeping both lives is what keeps this simple.

    Replays stay impossible: every datagram, accepted or shouted down, passes the
    window of its own (sender, incarnation) first, and a window is never reset
    while its life is remembered; so a datagram is accepted at most once, shouted
    down or not.  A fresh datagram of a shouted-down life still counts as "heard",
    so the real peer's life is never the one forgotten while it speaks.

    At most MAX_LIVES lives are remembered (a restart makes one, so old ones must
    go); room is made by forgetting the lowest silent life.  It raises ``floor``
    (an unknown incarnation at or below it is old, since its window may be the one
    forgotten) only when no life still speaking is below it: a floor above the
    real peer's running life would refuse its next restart for good, and only a
    key holder makes lives above the real one (the real lives, older, go first).
    With every life heard within the timeout a new one is refused: only a key
    holder keeps MAX_LIVES speaking, and room comes back once one falls silent.
    """
    __slots__ = ("lives", "floor", "current")

    def __init__(self) -> None:
        self.lives: dict[int, _Life] = {}
        self.floor = 0                       # incarnations <= floor not remembered are old
        self.current: int | None = None      # the incarnation last accepted (a change is a restart)

    def accept(self, incarnation: int, seq: int, now: float, timeout_s: float) -> int | Reason:
        """SeqWindow.accept's gap for a datagram of the current life, else why not."""
        life = self.lives.get(incarnation)
        if life is None:
            # making room may raise the floor, so it is checked again after
            if incarnation <= self.floor or (len(self.lives) >= MAX_LIVES and not self._forget(now, timeout_s)) \
                    or incarnation <= self.floor:
                return Reason.OLD_INCARNATION
            life = self.lives[incarnation] = _Life(now)
        shouted_down = any(inc > incarnation and now - other.heard <= timeout_s
                           for inc, other in self.lives.items())
        gap = life.window.accept(seq)
        if gap is not None:
            life.heard = max(life.heard, now)
        if shouted_down:
            return Reason.OLD_INCARNATION
        if gap is None:
            return Reason.REPLAYED
        self.current = incarnation
        return gap

    def _forget(self, now: float, timeout_s: float) -> bool:
        silent = [inc for inc, life in self.lives.items() if now - life.heard > timeout_s]
        if not silent:
            return False
        victim = min(silent)
        if len(silent) == len(self.lives) or victim < min(set(self.lives) - set(silent)):
            self.floor = max(self.floor, victim)
        del self.lives[victim]
        return True
