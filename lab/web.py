"""A web-like workload: many short transfers, heavy-tailed sizes, Poisson arrivals.

    python -m drl.lab.web serve --port 5300
    python -m drl.lab.web fetch --server 10.1.1.1:5300 --arrivals 15 --mean-size 20000 \\
        --duration 60 --out web.json

iperf3 cannot do this, and §5.3 of [Raghavan07] needs it: requests
arrive as a Poisson process (mean ``--arrivals`` per second), each fetches one
object over its own TCP connection (HTTP/1.0 style, ``GET /<bytes>``), object
sizes are Pareto (shape ``--shape``, mean ``--mean-size``, capped at
``--max-size``) like the CAIDA web trace the paper used.  The client writes
one JSON report: every transfer (size, start, end, completed) and the bytes
received per 100 ms, which is how the lab measures this group's rate.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time

CHUNK = bytes(64 * 1024)
BIN_S = 0.1
GRACE_S = 2.0  # transfers still running this long after --duration are cut off


def pareto_size(rng: random.Random, mean: int, shape: float, cap: int) -> int:
    """Pareto with the given mean: x_m = mean (a - 1) / a ([Raghavan07] §5.3's heavy tail)."""
    x_m = mean * (shape - 1) / shape
    return max(1, min(cap, int(x_m * rng.paretovariate(shape))))


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        line = await reader.readline()
        size = int(line.split()[1].lstrip(b"/"))
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        while size > 0:
            n = min(size, len(CHUNK))
            writer.write(CHUNK[:n])
            await writer.drain()
            size -= n
    except (ValueError, IndexError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(port: int) -> None:
    server = await asyncio.start_server(_serve_one, "0.0.0.0", port, backlog=1024)
    async with server:
        await server.serve_forever()


class Fetcher:
    def __init__(self, host: str, port: int, duration_s: float):
        self.host, self.port, self.duration_s = host, port, duration_s
        self.t0 = time.monotonic()
        self.bins = [0] * (int((duration_s + GRACE_S) / BIN_S) + 1)
        self.transfers: list[dict] = []

    def _count(self, n: int) -> None:
        k = int((time.monotonic() - self.t0) / BIN_S)
        if k < len(self.bins):
            self.bins[k] += n

    async def fetch(self, size: int) -> None:
        rec = {"size": size, "start_s": time.monotonic() - self.t0, "end_s": None, "completed": False}
        self.transfers.append(rec)
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write(b"GET /%d HTTP/1.0\r\n\r\n" % size)
            await reader.readuntil(b"\r\n\r\n")
            got = 0
            while chunk := await reader.read(65536):
                got += len(chunk)
                self._count(len(chunk))
            writer.close()
            rec["completed"] = got == size
        except (OSError, asyncio.IncompleteReadError):
            pass
        rec["end_s"] = time.monotonic() - self.t0

    async def run(self, rng: random.Random, arrivals: float, mean: int, shape: float, cap: int) -> None:
        tasks = set()
        next_s = rng.expovariate(arrivals)
        while next_s < self.duration_s:
            await asyncio.sleep(max(0.0, next_s - (time.monotonic() - self.t0)))
            task = asyncio.create_task(self.fetch(pareto_size(rng, mean, shape, cap)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_s += rng.expovariate(arrivals)
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, self.duration_s + GRACE_S - (time.monotonic() - self.t0)))

    def report(self) -> dict:
        return {"bin_s": BIN_S, "bins": self.bins, "transfers": self.transfers}


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m drl.lab.web", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--server", required=True, help="HOST:PORT")
    f.add_argument("--arrivals", type=float, required=True, help="mean requests per second")
    f.add_argument("--mean-size", type=int, required=True)
    f.add_argument("--shape", type=float, default=1.2)
    f.add_argument("--max-size", type=int, default=2_000_000)
    f.add_argument("--duration", type=float, required=True)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # the lab stops us with SIGTERM: still write the report
    if args.cmd == "serve":
        try:
            asyncio.run(serve(args.port))
        except KeyboardInterrupt:
            pass
        return
    host, _, port = args.server.rpartition(":")
    fetcher = Fetcher(host, int(port), args.duration)
    try:
        asyncio.run(fetcher.run(random.Random(args.seed), args.arrivals, args.mean_size, args.shape, args.max_size))
    except KeyboardInterrupt:
        pass  # stopped early: report what was fetched
    with open(args.out, "w") as fh:
        json.dump(fetcher.report(), fh)


if __name__ == "__main__":
    main()
