"""``drl-sim run scale``: FPS with up to 490 limiters and branching 1..7 ([Raghavan07] §5.6, Fig. 8).

    drl-sim run scale --limiters 490 --out out/scale

[Raghavan07] §5.6: a 50 Mbit/s global limit, 40 ms flow and
inter-limiter RTTs, "the number of flows arriving at each limiter chosen
uniformly at random from 0 to 5" (the same flows for the same N), gossip
branching factor br = 1..7.  Measured per (allocator, N, br): the delivered
aggregate rate, Jain's index over all flows, and the control bandwidth per
limiter (real datagram sizes, sim.wiretap).  References: CTB, one token
bucket that all of the flows cross, and GRD at br = 3 (the paper reports it
"fails to limit the aggregate rate" beyond 50 limiters).

Gossip is the paper's, per-peer only (``Setup.sum_tree=False``): the agent's sum tree
(agent/gossip/tree.py) would bring FPS and GRD their peers' sum in three intervals whatever the
branching, and the figure is about the branching.

Deviation from the paper, for simulation time: the flows all start during the
first 2 s and live through the run (the paper starts one every 100 ms and
lets each live 60 s).  Measurement starts after every node has heard from
every peer once (one gossip cycle, ceil((N-1)/br) intervals) plus 10 s.
"""
from __future__ import annotations

import math

import numpy as np

from drl.agent.units import parse_rate

from .engine import Setup, Simulation
from .experiments import Options, sizes
from .plots import Line, Panel, save
from .tcp import Flows, TcpFluid
from .trace import jain

SUMMARY = {"scale": "[Raghavan07] Fig. 8: FPS at 10..490 limiters, br 1..7, vs GRD and CTB (50 Mbit/s)"}
DEFAULT_LIMITERS = {"scale": 490}
SIZES = (10, 50, 100, 250, 490)
BRANCHING = tuple(range(1, 8))
GLOBAL_Bps = parse_rate("50mbit")
RTT_S = 0.040
INTERVAL_S = 0.050
LOSS = 0.01
SETTLE_S = 10.0
MEASURE_S = 20.0


def flows_for(n_limiters: int, seed: int) -> np.ndarray:
    """The limiter of every flow: 0..5 flows per limiter, the same for the same N."""
    rng = np.random.default_rng([seed, n_limiters])
    return np.repeat(np.arange(n_limiters), rng.integers(0, 6, n_limiters))


def measure(allocator: str, n: int, branching: int, flow_nodes: np.ndarray, opts: Options) -> dict:
    """One run; the CTB reference puts every flow on one limiter."""
    n_sim = 1 if allocator == "ctb" else n
    nodes = np.zeros_like(flow_nodes) if allocator == "ctb" else flow_nodes
    rng = np.random.default_rng([opts.seed, n, branching])
    flows = Flows.build(nodes, rtt_s=RTT_S, start_s=rng.uniform(0.0, 2.0, len(nodes)))
    tcp = TcpFluid(flows, n_sim, rng)
    setup = Setup(allocator=allocator, n_nodes=n_sim, global_Bps=GLOBAL_Bps, interval_s=INTERVAL_S,
                  branching=branching, loss=LOSS, delay_s=RTT_S / 2, seed=opts.seed, sum_tree=False)
    sim = Simulation(setup, tcp)
    warm = math.ceil((n_sim - 1) / max(1, setup.effective_branching())) + round(SETTLE_S / INTERVAL_S)
    label = f"{allocator} N={n} br={branching}"
    sim.run(warm, progress=opts.progress.task(label + " warm-up"))
    before = tcp.flow_bytes.copy()
    trace = sim.run(round(MEASURE_S / INTERVAL_S), progress=opts.progress.task(label))
    rates = (tcp.flow_bytes - before) / MEASURE_S
    return {"allocator": allocator, "limiters": n, "branching": branching, "flows": int(len(nodes)),
            "delivered_bps": float(trace.delivered_Bps.mean() * 8),
            "limit_sum_bps": float(trace.limit_sum_Bps.mean() * 8),
            "jain": jain(rates),
            "control_bps_per_limiter": float(trace.control_Bps.mean() * 8 / n_sim),
            "loss_detected": sim.tap.loss_detected}


def run(opts: Options) -> dict:
    rows = []
    for n in sizes(SIZES, opts.limiters or DEFAULT_LIMITERS["scale"]):
        flow_nodes = flows_for(n, opts.seed)
        rows.append(measure("ctb", n, 0, flow_nodes, opts))
        rows.append(measure("grd", n, 3, flow_nodes, opts))
        rows += [measure("fps", n, br, flow_nodes, opts) for br in BRANCHING]
    plot(rows, opts)
    return {"params": {"global_bps": GLOBAL_Bps * 8, "rtt_s": RTT_S, "interval_s": INTERVAL_S,
                       "loss": LOSS, "measure_s": MEASURE_S, "branching": list(BRANCHING)},
            "rows": rows, "claims": claims(rows)}


def claims(rows: list[dict]) -> dict:
    """The paper's statements next to what this run measured."""
    def worst(alloc: str, key, n_min: int = 0) -> float:
        vals = [key(r) for r in rows if r["allocator"] == alloc and r["limiters"] > n_min]
        return max(vals) if vals else float("nan")
    err = lambda r: abs(r["delivered_bps"] / (GLOBAL_Bps * 8) - 1.0)  # noqa: E731
    br3 = [r for r in rows if r["allocator"] == "fps" and r["branching"] == 3]
    return {
        "fps_max_rate_error_br>=3": worst("fps", lambda r: err(r) if r["branching"] >= 3 else 0.0),
        "grd_max_rate_error_N>50": worst("grd", err, 50),
        "fps_br3_control_bps_per_limiter": [r["control_bps_per_limiter"] for r in br3],
        "paper": "FPS holds the limit at 490 limiters; little gain beyond br=3; "
                 "GRD fails beyond 50 limiters; br=3 costs 48 B x 20/s x 3 per limiter",
    }


def plot(rows: list[dict], opts: Options) -> None:
    def series(alloc: str, br: int, key: str, scale: float = 1.0) -> tuple[list, list]:
        pts = [(r["limiters"], r[key] * scale) for r in rows if r["allocator"] == alloc
               and (alloc != "fps" or r["branching"] == br)]
        return [p[0] for p in pts], [p[1] for p in pts]

    panels = []
    for key, title, unit, scale, ref in (("delivered_bps", "delivered rate", "Mbit/s", 1e-6, GLOBAL_Bps * 8e-6),
                                         ("jain", "Jain's index (flows)", "index", 1.0, None),
                                         ("control_bps_per_limiter", "control traffic", "kbit/s per limiter",
                                          1e-3, None)):
        lines = [Line(f"FPS br={br}", *series("fps", br, key, scale)) for br in BRANCHING]
        if key != "control_bps_per_limiter":
            lines += [Line("GRD br=3", *series("grd", 3, key, scale), "--s"),
                      Line("CTB (one bucket)", *series("ctb", 0, key, scale), ":k^")]
        panels.append(Panel(title, "limiters", unit, lines, hline=ref))
    save(opts.out / "fig8_scale.png", "Scaling, [Raghavan07] Fig. 8 (simulated)", panels)
