"""The metrics of [Raghavan07] §4.1, on series sampled every ``dt`` seconds.

    >>> within(9.6, 10.0)
    True

Utilization at two timescales (Fig. 4), per-limiter shares, convergence
time after a change (Fig. 6, 7, 9), and the web table (Table 1).  ``within``
is THE tolerance rule of the project: tests and experiments import it from
here (Jain's index, Fig. 5, lives in lab/fairness.py, which sim/ shares).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

TOLERANCE = 0.10  # relative; how close is "at the target" for bandwidths, everywhere

WEB_RANGES = ((0, 5_000), (5_000, 50_000), (50_000, 500_000), (500_000, math.inf))  # Table 1, bytes


def within(value: float, target: float, rel: float = TOLERANCE) -> bool:
    """|value - target| <= rel * |target|: the one tolerance rule for bandwidth comparisons."""
    return abs(value - target) <= rel * abs(target)


def window(series: Sequence[float], dt: float, start_s: float, stop_s: float) -> list[float]:
    """The samples whose bin [k dt, (k+1) dt) lies within [start_s, stop_s)."""
    lo, hi = math.ceil(start_s / dt - 1e-9), math.floor(stop_s / dt + 1e-9)
    return list(series[max(lo, 0):max(hi, 0)])


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def rebin(series: Sequence[float], factor: int) -> list[float]:
    """Means of consecutive groups of ``factor`` samples (100 ms -> 1 s with factor 10)."""
    return [mean(series[i:i + factor]) for i in range(0, len(series) - factor + 1, factor)]


def quantiles(xs: Sequence[float], qs: Sequence[float] = (0.05, 0.5, 0.95)) -> dict[str, float]:
    s = sorted(xs)
    if not s:
        return {}
    return {f"p{round(q * 100)}": s[min(len(s) - 1, int(q * len(s)))] for q in qs}


def utilization(aggregate: Sequence[float], dt: float, limit: float) -> dict:
    """Delivered/limit at the sample timescale and at 1 s (Fig. 4's two histograms)."""
    coarse = rebin(aggregate, max(1, round(1.0 / dt)))
    return {"mean": mean(aggregate) / limit,
            f"{dt * 1000:.0f}ms": quantiles([x / limit for x in aggregate]),
            "1s": quantiles([x / limit for x in coarse])}


def moving_mean(series: Sequence[float], width: int) -> list[float]:
    """Trailing mean over ``width`` samples (the first ones average what exists)."""
    out, acc = [], 0.0
    for i, x in enumerate(series):
        acc += x - (series[i - width] if i >= width else 0.0)
        out.append(acc / min(i + 1, width))
    return out


def convergence(per_limiter: dict[str, Sequence[float]], dt: float, changes: Sequence[float],
                end_s: float, limit: float, rel: float = TOLERANCE) -> list[dict]:
    """For each change time: how long until every limiter's 1-s rate stays within ``rel * limit``
    of where it settles (its mean over the last third before the next change).  None: never."""
    smooth = [moving_mean(s, max(1, round(1.0 / dt))) for s in per_limiter.values()]
    bounds = sorted(set(changes)) + [end_s]
    out = []
    for at, nxt in zip(bounds, bounds[1:]):
        lo, hi = round(at / dt), round(nxt / dt)
        if hi <= lo:
            continue
        settle = hi - max(1, (hi - lo) // 3)
        last_bad = lo - 1
        for s in smooth:
            target = mean(s[settle:hi])
            last_bad = max([last_bad] + [k for k in range(lo, hi) if abs(s[k] - target) > rel * limit])
        after = round((last_bad + 1 - lo) * dt, 3) if last_bad < settle else None
        out.append({"at_s": round(at, 3), "converged_after_s": after})
    return out


def sliding_means(series: Sequence[float], dt: float, width_s: float = 1.0) -> list[float]:
    """Mean of every ``width_s`` window starting at each sample: out[k] covers [k dt, k dt + width_s)."""
    w = max(1, round(width_s / dt))
    out, acc = [], sum(series[:w])
    for k in range(len(series) - w + 1):
        out.append(acc / w)
        if k + w < len(series):
            acc += series[k + w] - series[k]
    return out


def fault_impact(aggregate: Sequence[float], dt: float, limit: float, at_s: float, until_s: float,
                 demand_exceeds: bool = True, level: float = 0.95, width_s: float = 1.0,
                 end_s: float | None = None) -> dict:
    """What a fault at ``at_s`` did to the aggregate, looked at until ``until_s``:

    * ``worst_window_ratio``: the highest mean over a ``width_s`` window (sliding by ``dt``) that
      lies within [at_s, until_s), over ``limit`` (at least the first window after ``at_s``);
      ``worst_window_at_s`` is where that window starts;
    * ``recovery_s``: 0 if no window starting in [at_s, until_s) falls below ``level`` x the
      limit; else the time from ``at_s`` to the start of the first window back at ``level`` after
      the first one below it (searched to the end of the series, or of what was measured,
      ``end_s``; None: never).  None when the demand does not exceed the limit (then the limit
      is not expected to be used)."""
    if end_s is not None:
        aggregate = aggregate[:max(0, math.floor(end_s / dt + 1e-9))]
        until_s = min(until_s, end_s)
    means = sliding_means(aggregate, dt, width_s)
    w = max(1, round(width_s / dt))
    lo = math.ceil(at_s / dt - 1e-9)
    hi = max(lo, math.floor(until_s / dt + 1e-9) - w)     # last window start that fits
    if lo >= len(means):
        return {"worst_window_ratio": None, "worst_window_at_s": None, "recovery_s": None}
    hi = min(hi, len(means) - 1)
    worst = max(range(lo, hi + 1), key=lambda k: means[k])
    out = {"worst_window_ratio": means[worst] / limit, "worst_window_at_s": round(worst * dt, 3), "recovery_s": None}
    if demand_exceeds:
        low = next((k for k in range(lo, hi + 1) if means[k] < level * limit), None)
        if low is None:
            out["recovery_s"] = 0.0
        else:
            back = next((k for k in range(low, len(means)) if means[k] >= level * limit), None)
            out["recovery_s"] = None if back is None else round(max(0.0, back * dt - at_s), 3)
    return out


def envelope(series: Sequence[float], dt: float, limit: float, budget: float, min_window_s: float = 1.0) -> dict:
    """The promise, checked the way users look: every window of ``min_window_s`` or longer
    carries at most ``limit`` x T + ``budget`` (one central token bucket of rate ``limit``
    and depth ``budget``; ``series`` in units/s per ``dt`` bin, ``budget`` in units).

    * ``excess``: the most any such window carried beyond ``limit`` x T (0 when none did),
      at ``at_s`` for ``window_s``; the promise holds iff it is <= ``budget``;
    * ``ratio``: the highest window total over its envelope ``limit`` x T + ``budget``
      (<= 1 iff the promise holds), at ``ratio_at_s`` for ``ratio_window_s``.

    Every window length counts, not only 1 s: a burst budget spent in one second and
    again in the next is two budgets in two seconds, which 1-s windows alone never see."""
    w = max(1, round(min_window_s / dt))
    n = len(series)
    prefix = [0.0]
    for x in series:
        prefix.append(prefix[-1] + x * dt)
    out = {"budget": budget, "excess": 0.0, "at_s": None, "window_s": None,
           "ratio": None, "ratio_at_s": None, "ratio_window_s": None}
    low, low_at = math.inf, 0      # least of prefix[a] - limit*a*dt over the starts a <= b - w
    for b in range(w, n + 1):
        a = b - w
        if prefix[a] - limit * a * dt < low:
            low, low_at = prefix[a] - limit * a * dt, a
        excess = prefix[b] - limit * b * dt - low
        if excess > out["excess"]:
            out.update(excess=excess, at_s=round(low_at * dt, 3), window_s=round((b - low_at) * dt, 3))
    best = -math.inf
    for a in range(0, n - w + 1):      # the ratio favours short windows: scan them all (n^2 / 2, n ~ 10^3)
        for b in range(a + w, n + 1):
            envelope_units = limit * (b - a) * dt + budget
            if envelope_units > 0 and (r := (prefix[b] - prefix[a]) / envelope_units) > best:
                best = r
                out.update(ratio=r, ratio_at_s=round(a * dt, 3), ratio_window_s=round((b - a) * dt, 3))
    return out


def web_table(transfers: Iterable[dict]) -> list[dict]:
    """Harmonic-mean delivered rate (bits/s) of completed web transfers per size range (Table 1)."""
    rows = []
    for lo, hi in WEB_RANGES:
        rates = [t["size"] * 8 / (t["end_s"] - t["start_s"]) for t in transfers
                 if t["completed"] and lo <= t["size"] < hi and t["end_s"] > t["start_s"]]
        rows.append({"min_bytes": lo, "max_bytes": None if hi == math.inf else hi, "transfers": len(rates),
                     "hmean_bps": len(rates) / sum(1 / r for r in rates) if rates else None})
    return rows
