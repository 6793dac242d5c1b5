"""The delay line: link delay, jitter and loss on kernels without sch_netem.

    python -m drl.lab.delay --ports lb3fa2dl0a lb3fa2dl0b --names l1 sw \\
        --delay 20ms --loss 1% --stats /run/drl-lab/lb3fa2/delay-0.json

A link ``a - b`` that asks for delay, jitter or loss is built (lab/topology.py)
as ``a <-> [port A | relay namespace <run>-dl-<i> | port B] <-> b``: two veth
pairs, the ends keep their names and addresses, and one relay process per link
(this module, started and stopped by lab/netns.py's Lab) moves the Ethernet
frames between the two ports through AF_PACKET sockets.  Each direction is
one :class:`Direction`: a frame read at monotonic time ``t`` is sent on at
``t + delay`` (``+ uniform(-jitter, +jitter)`` when jitter is asked, which
may reorder, as netem's does); without jitter the queue is FIFO, so frames
never overtake each other.  ``loss`` drops each frame independently with
that probability, in each direction.

The relay counts its own drops, per direction: ``lost`` (the loss asked),
``overflow`` (more than ``limit`` frames waiting), ``socket_drops`` (the
kernel's AF_PACKET receive queue was full: the relay fell behind),
``send_errors`` (sending failed) and ``tx_dropped`` (the kernel's count on
the port a direction leaves by: the far end's input backlog was full).  It
writes them with its CPU time to ``--stats`` (JSON, replaced atomically every
0.5 s and at exit); the stats file appearing means the relay is forwarding.
``Lab.delay_stats()`` adds ``end_tx_dropped``: what the ends' veths could not
hand to the relay's namespace.

Timing: the relay waits in select() (microsecond timeouts, 1-us timer slack)
for the next due frame or a readable port, runs SCHED_FIFO at the lowest
priority (``--rt``) so a busy CPU does not make it late, and stays on one
CPU with RPS steering its ports' input there, so the kernel cannot reorder
frames on the way in or out either.  docs/lab.md "Delay and loss" has the
measured accuracy and CPU.  The standard library only (and drl.agent.units
to read ``20ms``), so the process starts in tens of milliseconds.
"""
from __future__ import annotations

import argparse
import collections
import heapq
import json
import os
import random
import resource
import select
import signal
import socket
import struct
import time
from pathlib import Path

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_IGNORE_OUTGOING = 23      # Linux >= 4.20: do not read back the frames we send
RCVBUF = 8 << 20                 # ~40 ms of 100 Mbit/s in skb truesize: room for a descheduled relay
FRAME_MAX = 65536                # offloads are off on the ports: frames are <= MTU + 14
BATCH = 64                       # frames read per socket per wake-up before releasing due ones
LIMIT = 10_000                   # frames waiting per direction (netem's default limit is 1,000)
STATS_PERIOD_S = 0.5
PR_SET_TIMERSLACK = 29


class Direction:
    """One direction of a delay line: when each frame is released, and what was dropped (pure).

    >>> d = Direction(delay_s=0.02)
    >>> d.push(b"x", now=1.0), d.next_at(), d.due(1.019), d.due(1.02)
    (True, 1.02, [], [b'x'])
    """

    def __init__(self, delay_s: float, jitter_s: float = 0.0, loss_pct: float = 0.0, limit: int = LIMIT,
                 rng: random.Random | None = None):
        self.delay_s, self.jitter_s, self.loss = delay_s, jitter_s, loss_pct / 100.0
        self.limit, self.rng = limit, rng or random.Random()
        self.fifo: collections.deque = collections.deque()   # (release_at, frame): constant delay
        self.heap: list = []                                  # (release_at, seq, frame): with jitter
        self.seq = 0
        self.received = self.sent = self.lost = self.overflow = self.send_errors = self.socket_drops = 0
        self.tx_dropped = 0      # the kernel's count on the port it leaves by: the far end's backlog was full

    def __len__(self) -> int:
        return len(self.heap) if self.jitter_s else len(self.fifo)

    def push(self, frame: bytes, now: float) -> bool:
        """Queue ``frame`` read at ``now``; False when it is dropped (loss or a full queue)."""
        self.received += 1
        if self.loss and self.rng.random() < self.loss:
            self.lost += 1
            return False
        if len(self) >= self.limit:
            self.overflow += 1
            return False
        if self.jitter_s:
            at = now + max(0.0, self.delay_s + self.rng.uniform(-self.jitter_s, self.jitter_s))
            heapq.heappush(self.heap, (at, self.seq, frame))
            self.seq += 1
        else:
            self.fifo.append((now + self.delay_s, frame))
        return True

    def next_at(self) -> float | None:
        """When the next frame is due (None: nothing waits)."""
        q = self.heap if self.jitter_s else self.fifo
        return q[0][0] if q else None

    def due(self, now: float) -> list[bytes]:
        """The frames due at ``now``, in release order, taken off the queue."""
        out = []
        if self.jitter_s:
            while self.heap and self.heap[0][0] <= now:
                out.append(heapq.heappop(self.heap)[2])
        else:
            fifo = self.fifo
            while fifo and fifo[0][0] <= now:
                out.append(fifo.popleft()[1])
        return out

    def stats(self) -> dict:
        return {"received": self.received, "sent": self.sent, "queued": len(self), "lost": self.lost,
                "overflow": self.overflow, "socket_drops": self.socket_drops, "send_errors": self.send_errors,
                "tx_dropped": self.tx_dropped}


def open_port(ifname: str) -> socket.socket:
    """A raw AF_PACKET socket on ``ifname`` that reads what arrives there and sends out of it."""
    # protocol 0 at creation: the socket hears nothing until bind() names the interface
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    s.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)   # SO_RCVBUFFORCE (root): past net.core.rmem_max
    s.bind((ifname, ETH_P_ALL))
    s.setblocking(False)
    return s


def _realtime(priority: int) -> None:
    """SCHED_FIFO at ``priority``: a due frame leaves when it is due even when iperf3 and the
    agents keep both CPUs busy.  The relay sleeps between frames (~12 % of a CPU at 100 Mbit/s),
    and the kernel's RT throttling leaves 5 % to the rest even if it did not."""
    if priority:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        except OSError:
            pass


def _pin(ports: tuple[str, str]) -> None:
    """Keep every frame of the line on the CPU the relay started on.  A veth hands each frame to
    the backlog of the CPU that sent it, and two CPUs' backlogs drain independently: a relay that
    moved between CPUs, or a TCP sender transmitting from its process on one CPU and from its
    ACK processing on the other, could have frames overtake each other.  So the relay stays on
    one CPU, and RPS steers what arrives on its ports to that CPU's backlog, in send order."""
    try:
        cpu = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[36])   # field 39: processor
        os.sched_setaffinity(0, {cpu})
    except (OSError, ValueError, IndexError):
        return
    for port in ports:   # /sys is this namespace's (ip netns exec mounts it)
        for queue in Path(f"/sys/class/net/{port}/queues").glob("rx-*"):
            try:
                (queue / "rps_cpus").write_text(f"{1 << cpu:x}\n")
            except OSError:
                pass


def _tight_timers() -> None:
    """Timer slack 1 us (default 50 us): select() wakes the relay when a frame is due, not later."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def kernel_drops(s: socket.socket) -> int:
    """Frames the kernel dropped at this socket since the last call (PACKET_STATISTICS resets)."""
    _packets, drops = struct.unpack("II", s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    return drops


def port_tx_dropped(ifname: str) -> int:
    try:
        return int(Path(f"/sys/class/net/{ifname}/statistics/tx_dropped").read_text())
    except (OSError, ValueError):
        return 0


def relay(ports: tuple[str, str], names: tuple[str, str], directions: tuple[Direction, Direction],
          stats_path: Path, priority: int = 0) -> None:
    """Forward frames between the two ports until SIGTERM/SIGINT; ``directions[0]`` carries
    what arrives on ``ports[0]`` out of ``ports[1]``."""
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    _tight_timers()
    _pin(ports)
    _realtime(priority)
    socks = [open_port(p) for p in ports]
    route = {socks[0].fileno(): (socks[0], directions[0]), socks[1].fileno(): (socks[1], directions[1])}
    out = ((socks[1], directions[0]), (socks[0], directions[1]))
    labels = (f"{names[0]}->{names[1]}", f"{names[1]}->{names[0]}")
    started = time.monotonic()
    base = {p: port_tx_dropped(p) for p in ports}

    def write_stats() -> None:
        for s, d in zip(socks, directions):
            d.socket_drops += kernel_drops(s)
        for port, d in zip(ports[::-1], directions):   # /sys is this namespace's (ip netns exec)
            d.tx_dropped = port_tx_dropped(port) - base[port]
        use = resource.getrusage(resource.RUSAGE_SELF)
        doc = {"pid": os.getpid(), "ports": list(ports), "uptime_s": round(time.monotonic() - started, 3),
               "cpu_s": round(use.ru_utime + use.ru_stime, 3),
               "directions": {label: d.stats() for label, d in zip(labels, directions)}}
        tmp = stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc) + "\n")
        os.replace(tmp, stats_path)

    write_stats()                       # the Lab waits for this file: the relay is forwarding
    next_stats = time.monotonic() + STATS_PERIOD_S
    fds = list(route)
    mono = time.monotonic
    while not stop:
        now = mono()
        wake = next_stats
        for _, d in out:
            at = d.next_at()
            if at is not None and at < wake:
                wake = at
        try:
            readable = select.select(fds, (), (), max(0.0, wake - now))[0] if wake > now else fds
        except InterruptedError:
            continue
        for fd in readable:
            s, d = route[fd]
            for _ in range(BATCH):
                try:
                    frame = s.recv(FRAME_MAX)
                except BlockingIOError:
                    break
                d.push(frame, mono())
        now = mono()
        for s, d in out:
            for frame in d.due(now):
                try:
                    s.send(frame)
                    d.sent += 1
                except OSError:
                    d.send_errors += 1
        if now >= next_stats:
            write_stats()
            next_stats = now + STATS_PERIOD_S
    write_stats()


DROPS = ("lost", "overflow", "socket_drops", "send_errors", "tx_dropped", "end_tx_dropped")


def link_rows(plan, stats: list[dict]) -> list[dict]:
    """result.json's ``links[]``: every data link of ``plan`` (a built Lab's: netem decided) with
    its shaping and impairment and, on a delay line, the relay's counters (``Lab.delay_stats()``)."""
    by_link = {row["link"]: row for row in stats}
    rows = []
    for i, v in enumerate(plan.veths):
        link = v.link
        row = {"ends": [v.a.host, v.b.host], "rate_bps": link.rate_Bps * 8 if link and link.rate_Bps else None,
               "delay_ms": _ms(link.delay_s) if link else None, "jitter_ms": _ms(link.jitter_s) if link else None,
               "loss_pct": link.loss_pct if link else None,
               "impaired_by": None if not (link and link.impaired) else "netem" if plan.netem else "delay line"}
        if i in by_link:
            doc = by_link[i]
            row["delay_line"] = {"cpu_s": doc.get("cpu_s"), "uptime_s": doc.get("uptime_s"),
                                 "directions": doc.get("directions", {})}
        rows.append(row)
    return rows


def drops_summary(rows: list[dict]) -> list[str]:
    """One line per delay line that dropped frames of its own accord (not the loss asked)."""
    out = []
    for row in rows:
        for label, d in row.get("delay_line", {}).get("directions", {}).items():
            own = {k: d[k] for k in DROPS[1:] if d.get(k)}
            if own:
                out.append(f"delay line {label}: " + ", ".join(f"{k} {v}" for k, v in own.items())
                           + f" of {d['received']} frames")
    return out


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1e3, 3) if seconds else None


def read_stats(path: Path) -> dict | None:
    """A relay's last stats document, None when it has not written one."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> None:
    from drl.agent.units import parse_duration   # stdlib-only module, but shares the lab's units

    ap = argparse.ArgumentParser(prog="python -m drl.lab.delay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ports", nargs=2, required=True, metavar=("A", "B"), help="the relay's two interfaces")
    ap.add_argument("--names", nargs=2, default=("a", "b"), metavar=("A", "B"), help="the ends' host names (stats)")
    ap.add_argument("--delay", default="0s", help="one-way delay, each direction (e.g. 20ms)")
    ap.add_argument("--jitter", default="0s", help="uniform +- jitter on each frame's delay (may reorder)")
    ap.add_argument("--loss", default="0%", help="independent drop probability, each direction (e.g. 1%%)")
    ap.add_argument("--limit", type=int, default=LIMIT, help="frames waiting per direction before overflow drops")
    ap.add_argument("--seed", type=int, default=None, help="seed of the loss and jitter draws")
    ap.add_argument("--rt", type=int, default=1, metavar="PRIO",
                    help="SCHED_FIFO priority [default 1, the lowest]; 0: normal scheduling")
    ap.add_argument("--stats", required=True, type=Path, help="the JSON stats file (written every 0.5 s)")
    args = ap.parse_args(argv)
    delay, jitter = parse_duration(args.delay), parse_duration(args.jitter)
    loss = float(args.loss.rstrip("%"))
    rng = random.Random(args.seed)
    relay(tuple(args.ports), tuple(args.names),
          (Direction(delay, jitter, loss, args.limit, rng), Direction(delay, jitter, loss, args.limit, rng)),
          args.stats, args.rt)


if __name__ == "__main__":
    main()
