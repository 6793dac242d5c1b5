"""drlctl top: the agent's classes, live, like top(1).

    drlctl top                           # refreshed every second; q (or Ctrl-C) quits
    drlctl top --batch --iterations 3    # three plain-text frames a second apart, for scripts
    drlctl top --once                    # the same, one frame

A frame comes from two successive ``status`` reads on the control socket (the
request ``drlctl status`` makes): drops/s and the gossip rates are counter
differences over the agent's own time between the reads (its ``uptime_s``),
so a slow socket does not skew them; the counters are those of the agent's
last tick, so a rate can be off by up to one interval over the refresh.  :func:`frame` is the whole layout, pure
(two statuses and the time between them in, lines of text out); the curses
part only paints lines and reads keys.
"""
from __future__ import annotations

import curses
import sys
import time
from typing import Callable

import click

from drl.agent.service.control import ControlError, request
from drl.agent.units import format_rate, format_size

Status = dict
COLUMNS = ("CLASS", "GLOBAL", "LOCAL", "DEMAND", "RATE", "DROPS/S", "FLOWS", "SHADOW")


def frame(prev: Status | None, cur: Status, dt: float | None, width: int | None = None,
          height: int | None = None) -> list[str]:
    """The screen for status ``cur``, rates against ``prev`` read ``dt`` seconds earlier
    (None for either: rates show as "-"); cut to ``width`` x ``height`` when given."""
    if prev is None or not dt or dt <= 0:
        prev, dt = None, None
    lines = header(prev, cur, dt) + [""] + table(class_rows(prev, cur, dt))
    return fit(lines, width, height)


def interval(prev: Status | None, cur: Status) -> float | None:
    """Seconds between two reads by the agent's clock; None when it restarted in between."""
    if prev is None or cur["uptime_s"] <= prev["uptime_s"]:
        return None
    return cur["uptime_s"] - prev["uptime_s"]


def header(prev: Status | None, cur: Status, dt: float | None) -> list[str]:
    peers = cur.get("peers", [])
    alive = sum(p["state"] == "alive" for p in peers)
    first = (f"drl top - node {cur['node_id']} on {cur['interface']}  up {_duration(cur['uptime_s'])}  "
             f"peers {alive} alive, {len(peers) - alive} stale  classes {len(cur['classes'])}")
    if cur.get("standalone"):
        return [first, "gossip  off (running alone)"]
    g, p = cur["gossip"], prev and prev["gossip"]
    per_s = lambda key: _per_s(p and p.get(key), g.get(key), dt)  # noqa: E731
    sent, received = per_s("sent"), per_s("received")
    return [first, f"gossip  sent {_num(sent)}/s {_bytes(per_s('bytes_sent'))}/s   "
                   f"received {_num(received)}/s {_bytes(per_s('bytes_received'))}/s   lost {g.get('lost', 0)}"]


def class_rows(prev: Status | None, cur: Status, dt: float | None) -> list[tuple[str, ...]]:
    """One row of cells per class, fastest first."""
    before = {c["name"]: c for c in prev["classes"]} if prev else {}
    rows = []
    for c in sorted(cur["classes"], key=lambda c: (-c["rate_bps"], c["name"])):
        old = before.get(c["name"])
        drops = _per_s(old and old["dropped_packets"], c["dropped_packets"], dt)
        rows.append((c["name"], _rate(c["global_limit_bps"]), _rate(c["local_limit_bps"]), _rate(c["demand_bps"]),
                     _rate(c["rate_bps"]), _num(drops), str(c["flows"]), "yes" if c.get("shadow") else ""))
    return rows


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Aligned columns under COLUMNS; a shadow class's drops are the ones it would have made."""
    cells = [COLUMNS, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def fit(lines: list[str], width: int | None, height: int | None) -> list[str]:
    """Cut to the terminal: what does not fit is left out, never wrapped."""
    if height is not None:
        lines = lines[:max(0, height)]
    if width is not None:
        lines = [line[:max(0, width)] for line in lines]
    return lines


def _per_s(before: float | None, now: float | None, dt: float | None) -> float | None:
    """A counter's rate; None when unknown, or when it went back (reset under us)."""
    if before is None or now is None or dt is None or now < before:
        return None
    return (now - before) / dt


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _bytes(x: float | None) -> str:
    return "-" if x is None else format_size(x)


def _rate(bps: float) -> str:
    return format_rate(bps / 8)


def _duration(s: float) -> str:
    s = int(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
    return f"{s // 86400}d{s // 3600 % 24:02d}h" if s >= 86400 else f"{s // 3600}h{s // 60 % 60:02d}m"


# -- the command -------------------------------------------------------------------------


@click.command()
@click.option("--delay", "-d", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between frames.")
@click.option("--batch", "-b", is_flag=True, help="Plain text frames on stdout, no curses (as top -b).")
@click.option("--iterations", "-n", type=click.IntRange(min=1), help="Frames to show, then exit [default: until q].")
@click.option("--once", is_flag=True, help="One plain-text frame: --batch --iterations 1.")
@click.pass_obj
def top(socket_path: str, delay: float, batch: bool, iterations: int | None, once: bool) -> None:
    """A live view of the agent, refreshed every second: peers, gossip rates, and one row
    per class, fastest first (limits, demand, rate, drops/s, flows, shadow).  q quits.

    \b
    Examples:
      drlctl top
      drlctl top --batch --iterations 5 > top.txt
    """
    read = lambda: _read(socket_path)  # noqa: E731
    first = read()          # no agent: one line and exit 1 here, before the terminal is touched
    try:
        if batch or once:
            _batch(read, first, delay, 1 if once else iterations)
        else:
            _interactive(read, first, delay, iterations)
    except KeyboardInterrupt:
        pass                # Ctrl-C is how a batch run ends, and curses.wrapper restored the terminal


def _read(socket_path: str) -> Status:
    try:
        return request(socket_path, "status")["status"]
    except ControlError as e:
        raise click.ClickException(str(e)) from None


def _batch(read: Callable[[], Status], prev: Status, delay: float, iterations: int | None) -> None:
    shown = 0
    while iterations is None or shown < iterations:
        time.sleep(delay)
        cur = read()
        click.echo(("\n" if shown else "") + "\n".join(frame(prev, cur, interval(prev, cur))))
        sys.stdout.flush()
        prev, shown = cur, shown + 1


def _interactive(read: Callable[[], Status], first: Status, delay: float, iterations: int | None) -> None:
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        raise click.ClickException("not a terminal: use drlctl top --batch")
    try:
        curses.wrapper(_Screen(read, first, delay, iterations).run)
    except curses.error as e:
        raise click.ClickException(f"cannot drive this terminal ({e}): use drlctl top --batch") from None


class _Screen:
    """The curses loop: paint a frame, wait ``delay`` for keys, read the next status."""

    def __init__(self, read: Callable[[], Status], first: Status, delay: float, iterations: int | None):
        self.read, self.delay, self.iterations = read, delay, iterations
        self.prev: Status | None = None
        self.cur = first
        self.error: str | None = None

    def run(self, scr) -> None:
        try:
            curses.curs_set(0)
        except curses.error:
            pass            # a terminal without an invisible cursor
        scr.timeout(100)    # getch waits at most 100 ms, so q is seen at once
        shown = 0
        while True:
            self.paint(scr)
            shown += 1
            if (self.iterations and shown >= self.iterations) or self.wait_keys(scr):
                return
            self.refresh()

    def wait_keys(self, scr) -> bool:
        """Until the next frame is due; True when q was pressed."""
        due = time.monotonic() + self.delay
        while time.monotonic() < due:
            key = scr.getch()
            if key in (ord("q"), ord("Q")):
                return True
            if key == curses.KEY_RESIZE:
                self.paint(scr)
        return False

    def refresh(self) -> None:
        try:
            cur = self.read()
        except click.ClickException as e:      # the agent went away: keep the last frame, say so
            self.error = e.message
            return
        self.prev, self.cur, self.error = self.cur, cur, None

    def paint(self, scr) -> None:
        height, width = scr.getmaxyx()
        lines = frame(self.prev, self.cur, interval(self.prev, self.cur))
        if self.error:
            lines.insert(0, f"agent not answering: {self.error}")
        scr.erase()
        # width - 1: curses raises when a write ends in the bottom-right cell
        for y, line in enumerate(fit(lines, width - 1, height)):
            try:
                scr.addstr(y, 0, line, curses.A_REVERSE if line.startswith(COLUMNS[0] + " ") else 0)
            except curses.error:
                pass
        scr.refresh()
