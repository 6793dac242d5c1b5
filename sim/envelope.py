"""``drl-sim run envelope``: the promise G x T + D at 1,000 limiters while demand comes and goes.

    drl-sim run envelope --limiters 1000 --out out/envelope

The promise (docs/agent.md "The promise"): in every window of T >= 1 s all limiters together
pass at most G x T + D, D the class's burst budget (agent/burst.py).  Of N FPS limiters
(50 ms intervals, gossip branching 3 and the agent's sum tree, fluid TCP at 40 ms RTT, sim/tcp.py), a third are busy
all the time, a third never have traffic and the rest are busy, all stop at once, stay idle
for 7 s and all start again at the same moment: their buckets are full and FPS has moved their
share to the others.  The simulated limiters police (sim/tcp.py's token bucket drops), so D is
agent/burst.py's budget for ``police`` and N hosts, and every bucket is ``host_depth`` of it at
an equal share of G (the depths sum to D, as the agent keeps them).  G is 10 Gbit/s so that D
is the policer's 300 ms of G rather than N floors of 128 KiB (at 50 Mbit/s and 1,000 hosts the
floors alone are 21 s of G, and no window could break the envelope).

Measured: the envelope (lab/metrics.py's) over the whole run and in each phase: startup (the
warm-up), busy, idle, restart (from the restart to the end); the claim is a ratio <= 1 everywhere.
"""
from __future__ import annotations

import numpy as np

from drl.agent import burst
from drl.agent.gossip.core import cycle_rounds
from drl.agent.units import parse_rate

from .engine import Setup, Simulation
from .experiments import Options
from .plots import Line, Panel, save
from .tcp import Flows, TcpFluid
from .trace import envelope

SUMMARY = {"envelope": "1,000 FPS limiters: busy, idle and busy-idle-busy; worst window vs G x T + D"}
DEFAULT_LIMITERS = {"envelope": 1000}
GLOBAL_Bps = parse_rate("10gbit")
ENFORCE = "police"          # what sim/tcp.py's token bucket does with what exceeds it
INTERVAL_S = 0.05
BRANCHING = 3
RTT_S = 0.040
# Each phase as long as what it shows takes, no longer (a longer one proves nothing more and
# costs CI minutes): FPS's estimator and weights have a 1-s EWMA.  At 1,000 limiters the worst
# window of the busy phase starts where it does and that of the restart at the restart, and the
# aggregate is back within 0.5 % of G 6 s after it (1-s means of the 10-s phases run until
# 2026-12-07, bench/RESULTS.md "Speed and memory"); a silent limiter publishes exactly 0 after
# 5.5 s (at 60 limiters; at 1,000 its share, so its weight, is smaller and gets there sooner).
SETTLE_S = 5.0              # after one gossip cycle: FPS's weights settle (5 time constants)
BUSY_S = 5.0                # every group but the idle one busy, measured: settled, 5 time constants
IDLE_S = 7.0                # the restarting third silent: its weights reach exactly 0 (model.ZERO_BELOW)
AFTER_S = 6.0               # after everyone starts again: the restart's burst and FPS's re-split


def groups(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Node indexes: always busy, busy-idle-busy, never busy (about a third each, shuffled)."""
    order = np.random.default_rng([seed, n]).permutation(n)
    third = max(1, n // 3)
    return np.sort(order[:third]), np.sort(order[third:n - third]), np.sort(order[n - third:])


def cycle_s(n: int, branching: int = BRANCHING) -> float:
    """One gossip cycle: the time in which every limiter has updated each of its N - 1 peers once."""
    return cycle_rounds(n - 1, branching) * INTERVAL_S


def schedule(n: int, branching: int = BRANCHING) -> dict[str, float]:
    """Phase boundaries in seconds from the start: a gossip cycle and SETTLE_S of warm-up first."""
    warm = cycle_s(n, branching) + SETTLE_S
    return {"warm_s": warm, "stop_s": warm + BUSY_S, "restart_s": warm + BUSY_S + IDLE_S,
            "end_s": warm + BUSY_S + IDLE_S + AFTER_S}


def budget(n: int) -> tuple[int, int]:
    """D for N policing hosts, and each host's bucket: its share at G/N (they sum to D)."""
    d = burst.budget(GLOBAL_Bps, n, ENFORCE)
    return d, burst.host_depth(GLOBAL_Bps / n, GLOBAL_Bps, n, d, ENFORCE)


def simulate(n: int, opts: Options, branching: int = BRANCHING, sum_tree: bool = True) -> dict:
    """One run; ``branching``: gossip targets per interval, ``sum_tree``: the agent's sum tree where
    it runs one (branching below the peers), or per-peer gossip alone (bench/envelope.py compares)."""
    busy, restarting, idle = groups(n, opts.seed)
    when = schedule(n, branching)
    rng = np.random.default_rng([opts.seed, n, 1])
    per_busy = rng.integers(1, 4, n)                            # 1-3 flows on every node that has any
    node = np.concatenate([np.repeat(busy, per_busy[busy]), np.repeat(restarting, per_busy[restarting]),
                           np.repeat(restarting, per_busy[restarting])])
    k = int(per_busy[restarting].sum())
    start = np.concatenate([rng.uniform(0.0, 2.0, len(node) - 2 * k), rng.uniform(0.0, 2.0, k),
                            np.full(k, when["restart_s"])])
    stop = np.concatenate([np.full(len(node) - 2 * k, np.inf), np.full(k, when["stop_s"]), np.full(k, np.inf)])
    d, depth = budget(n)
    tcp = TcpFluid(Flows.build(node, rtt_s=RTT_S, start_s=start, stop_s=stop), n, rng, bucket_bytes=depth)
    setup = Setup(allocator="fps", n_nodes=n, global_Bps=GLOBAL_Bps, interval_s=INTERVAL_S, branching=branching,
                  delay_s=RTT_S / 2, seed=opts.seed, sum_tree=None if sum_tree else False)
    sim = Simulation(setup, tcp)
    ticks = round(when["end_s"] / INTERVAL_S)
    trace = sim.run(ticks, progress=opts.progress.task(f"envelope fps N={n} branching {branching}"
                                                      f"{' sum tree' if setup.uses_tree() else ''}"))
    delivered = trace.delivered_Bps
    phases = {"whole": (0.0, when["end_s"]), "startup": (0.0, when["warm_s"]),
              "measured": (when["warm_s"], when["end_s"]),
              "busy": (when["warm_s"], when["stop_s"]), "idle": (when["stop_s"], when["restart_s"]),
              "restart": (when["restart_s"], when["end_s"])}
    envelopes = {}
    for name, (lo, hi) in phases.items():
        a, b = round(lo / INTERVAL_S), round(hi / INTERVAL_S)
        envelopes[name] = envelope(delivered[a:b], INTERVAL_S, GLOBAL_Bps, d, a * INTERVAL_S)
    per = round(1.0 / INTERVAL_S)
    seconds = _seconds(delivered, per)
    return {"allocator": "fps", "limiters": n, "branching": branching, "sum_tree": setup.uses_tree(),
            "busy": len(busy), "busy_idle_busy": len(restarting), "idle": len(idle),
            "flows": int(len(node)), "enforce": ENFORCE, "budget_bytes": d, "host_depth_bytes": depth,
            **{k: round(v, 3) for k, v in when.items()},
            "envelope": envelopes["whole"], "envelopes": envelopes,
            "max_window_ratio_1s": float(seconds.max() / GLOBAL_Bps),
            "limit_sum_over_limit_max": float(trace.limit_sum_Bps[round(when["warm_s"] / INTERVAL_S):].max()
                                              / GLOBAL_Bps),
            "control_bps_per_limiter": float(trace.control_Bps.mean() * 8 / n),
            "series": {"t_s": (np.arange(len(seconds)) + 1.0).tolist(), "aggregate_bps": (seconds * 8).tolist(),
                       "limit_sum_bps": (_seconds(trace.limit_sum_Bps, per) * 8).tolist()}}


def _seconds(series: np.ndarray, per: int) -> np.ndarray:
    """1-s means of a per-tick series (the incomplete last second left out)."""
    return series[:len(series) // per * per].reshape(-1, per).mean(axis=1)


def run(opts: Options) -> dict:
    row = simulate(opts.limiters or DEFAULT_LIMITERS["envelope"], opts)
    plot(row, opts)
    return {"params": {"global_bps": GLOBAL_Bps * 8, "interval_s": INTERVAL_S, "branching": BRANCHING,
                       "rtt_s": RTT_S, "enforce": ENFORCE, "idle_s": IDLE_S},
            "rows": [row],
            "claims": {"promise": "in every window of T >= 1 s: bytes <= G x T + D (agent/burst.py's D)",
                       "envelope_ratio": row["envelope"]["ratio"],
                       "envelope_holds": row["envelope"]["ratio"] is not None and row["envelope"]["ratio"] <= 1.0,
                       **{f"envelope_ratio_{k}": v["ratio"] for k, v in row["envelopes"].items()}}}


def plot(row: dict, opts: Options) -> None:
    limit = GLOBAL_Bps * 8e-9
    s = row["series"]
    e = row["envelope"]
    rate = Panel(f"aggregate (1-s means); worst window {e['ratio']:.3f} of G T + D", "seconds", "Gbit/s",
                 [Line("FPS", s["t_s"], [v * 1e-9 for v in s["aggregate_bps"]], "-"),
                  Line("sum of local limits", s["t_s"], [v * 1e-9 for v in s["limit_sum_bps"]], "--")], hline=limit)
    for key, style in (("stop_s", ":k"), ("restart_s", ":g")):
        rate.lines.append(Line(key.removesuffix("_s"), [row[key]] * 2, [0, 1.5 * limit], style))
    rate.lines.append(Line("worst envelope window", [e["at_s"], e["at_s"] + e["window_s"]], [limit * 1.4] * 2, "-r"))
    save(opts.out / "envelope.png", f"Envelope at {row['limiters']} limiters (simulated)", [rate])
