"""Real agents that find each other and read their limits in a real etcd (``--registry``).

Topology: a star of 5 hosts; agents on h1..h4 limit their eth0 egress, h5 is
the sink and runs etcd (Debian's etcd-server, lab/etcd.py) on 10.0.0.5:2379.
No agent is given --peers: each learns the others from etcd.  Rates are
measured at the sink's eth0 (L2 bytes, what the limiter counts).
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
import time

import pytest

from drl.agent.burst import budget
from drl.agent.service.control import ControlError, request
from drl.cli.ctl import render_set
from drl.lab.agents import StatusPoller, installed
from drl.lab.etcd import Etcd
from drl.lab.measure import RxMeter, sink_rate_bps
from drl.lab.metrics import envelope, mean, rebin, within
from drl.lab.traffic import iperf3_server, iperf3_start

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

LIMIT = 12e6


@pytest.fixture
def make_fleet(make_star, cluster):
    """Factory: n_hosts -> (lab, etcd on the sink (the last host), start(host, *extra) -> agent
    with only --registry, start_together(hosts, *extra) -> such agents started side by side)."""
    with contextlib.ExitStack() as running:
        def make(n_hosts: int):
            lab = make_star(n_hosts)
            etcd = running.enter_context(Etcd(host=lab.hosts[-1]))
            agents = cluster(lab)
            registry = ("--registry", etcd.url, "--cluster", "t")

            def start(host, *extra, allocator="fps", global_="12mbit"):
                return agents.start(host, (), allocator, global_, *registry, *extra)

            def start_together(hosts, *extra, allocator="fps", global_="12mbit"):
                return agents.start_together(hosts, allocator, global_, *registry, *extra)
            return lab, etcd, start, start_together
        yield make


@pytest.fixture
def fleet(make_fleet):
    """(lab, etcd on the sink, start(host, *extra) -> agent with only --registry); 4 agent hosts."""
    return make_fleet(5)[:3]


def members(st) -> int:
    """Agents this one counts: itself and its alive peers."""
    return 1 + sum(p["state"] == "alive" for p in st["peers"])


def peers(st) -> list[dict]:
    """Its peers in N: not those gone from etcd unannounced and silent (``lost``, only reserved)."""
    return [p for p in st["peers"] if p["state"] != "lost"]


def wait_members(agents, n: int, timeout_s: float) -> float:
    """Seconds until every agent counts ``n`` members; fails with their statuses after ``timeout_s``."""
    t0 = time.monotonic()
    for a in agents:
        st = a.wait_for(lambda s: members(s) == n and len(peers(s)) == n - 1, t0 + timeout_s - time.monotonic())
        assert members(st) == n and len(peers(st)) == n - 1, (a.host, st["peers"], st["registry"])
    return time.monotonic() - t0


def senders(lab, hosts, seconds: int) -> list:
    """Two TCP flows from each host to its own iperf3 server on the sink (the Lab stops the servers)."""
    return [iperf3_start(h, iperf3_server(lab.hosts[-1]), seconds=seconds, streams=2) for h in hosts]


def test_agents_find_each_other_join_and_leave_through_etcd(fleet):
    lab, etcd, start = fleet
    h1, h2, h3, h4, sink = lab.hosts
    agents = [start(h) for h in (h1, h2, h3)]
    wait_members(agents, 3, timeout_s=5)
    assert all(a.status()["registry"]["state"] == "reachable" for a in agents)

    clients = senders(lab, (h1, h2, h3), seconds=30)
    time.sleep(4)
    rate3 = sink_rate_bps(sink, 6)
    assert within(rate3, LIMIT, 0.10), rate3

    agents.append(start(h4))                       # a 4th host joins while traffic runs
    took = wait_members(agents, 4, timeout_s=3 + 1)   # 1 s: the agent's own start
    assert took <= 3.0, took
    clients4 = senders(lab, (h4,), seconds=17)
    time.sleep(4)
    total4 = sink_rate_bps(sink, 6)
    assert within(total4, LIMIT, 0.10), total4
    # its flows get their share: 2 of 8 flows, a quarter of the limit (FPS).  Shaped, a newcomer
    # gets there slowly (README "Known limits"): one CI run read 0.57 of it 10 s in, a moment
    # of its ramp, so it has 5 s more to get there
    st4 = agents[3].wait_for(lambda st: st["local_limit_bps"] >= 0.6 * LIMIT / 4, 5)
    assert st4["local_limit_bps"] >= 0.6 * LIMIT / 4, st4["local_limit_bps"]

    agents[3].kill(signal.SIGKILL)                 # its key goes with its lease (TTL 5 s)
    gone = wait_members(agents[:3], 3, timeout_s=9)
    for a in agents[:3]:
        st = a.status()
        assert len(st["registry"]["members"]) == 3, st["registry"]
        # out of N, but what its datapath may still pass (its fail-safe rate) stays reserved
        assert [p["node_id"] for p in st["peers"] if p["state"] == "lost"] == [h4.name], st["peers"]
        assert st["effective_limit_bps"] < LIMIT, st["effective_limit_bps"]
    print(f"measured: 3 agents {rate3 / 1e6:.2f} Mbit/s; 4th seen by all in {took:.2f} s, then "
          f"{total4 / 1e6:.2f} Mbit/s with its local limit {st4['local_limit_bps'] / 1e6:.2f}; "
          f"SIGKILLed one dropped after {gone:.2f} s")
    for c in clients + clients4:  # -t is an upper bound: every phase above ends on its own
        c.stop()


def test_limit_holds_while_etcd_is_down_and_a_change_made_meanwhile_lands(fleet):
    lab, etcd, start = fleet
    h1, h2, h3, _, sink = lab.hosts
    agents = [start(h) for h in (h1, h2, h3)]
    wait_members(agents, 3, timeout_s=5)
    clients = senders(lab, (h1, h2, h3), seconds=40)
    time.sleep(4)

    etcd.stop()
    t0 = time.monotonic()
    # 12 s: over two lease TTLs (5 s) and many of the 1-s longest retry waits (BACKOFF_S)
    down = sink_rate_bps(sink, 10)      # most of the outage
    reply = request(agents[0].socket, "set", timeout_s=3.0, **{"class": "default", "global": "6mbit"})
    assert reply["registry"] == "pending" and "registry: pending" in render_set(reply), reply
    for a in agents:
        st = a.wait_for(lambda s: members(s) == 3, 2)      # a peer stale for a stall's moment comes back
        assert st["registry"]["state"] == "unreachable" and members(st) == 3, (st["registry"], st["peers"])
        assert st["global_limit_bps"] == LIMIT       # nothing applied while etcd is away
    time.sleep(max(0.0, 12 - (time.monotonic() - t0)))
    assert within(down, LIMIT, 0.10), down

    etcd.start()
    for a in agents:
        # the set may reach a peer by gossip before that peer's own next etcd call succeeds
        st = a.wait_for(lambda s: s["global_limit_bps"] == 6e6 and s["registry"]["state"] == "reachable",
                        timeout_s=8)
        assert st["global_limit_bps"] == 6e6 and st["registry"]["state"] == "reachable", st["registry"]
    time.sleep(3)
    after = sink_rate_bps(sink, 5)
    assert within(after, 6e6, 0.10), after
    print(f"measured: {down / 1e6:.2f} Mbit/s while etcd was down, {after / 1e6:.2f} after the set landed")
    for c in clients:            # -t is an upper bound: every phase above ends on its own
        c.stop()


GDRL_CLASS = """\
[[class]]
name = "gold"
global = "12mbit"
allocator = "gdrl"
"""


def test_gdrl_class_from_etcd_rejoins_under_its_id_and_the_sum_stays_at_the_limit(fleet, tmp_path):
    """A gdrl class imported into etcd while the fleet runs: every agent starts it, the
    founders being the members then (etcd's genesis key); one agent killed and restarted
    under its id (its state file: a rejoiner) gets its capacity back from its best friend."""
    lab, etcd, start = fleet
    hosts = lab.hosts[:3]
    agents = [start(h) for h in hosts]
    wait_members(agents, 3, timeout_s=5)
    (tmp_path / "gold.toml").write_text(GDRL_CLASS)
    ctl = subprocess.run(hosts[0].argv(installed("drlctl"), "import", str(tmp_path / "gold.toml"),
                                       "--registry", etcd.url, "--cluster", "t"), capture_output=True, text=True)
    assert ctl.returncode == 0, ctl.stderr
    clients = senders(lab, hosts, seconds=40)
    sums = []

    def capacities() -> dict[str, float]:
        caps = {}
        for a in agents:
            try:
                gold = [c for c in a.status()["classes"] if c["name"] == "gold"]
            except ControlError:            # the one that is down
                continue
            if gold:
                caps[a.host] = gold[0]["allocator_state"]["capacity_bps"]
        sums.append(sum(caps.values()))
        return caps

    def until(cond, timeout_s: float) -> dict[str, float]:
        """Sample the capacities until cond(capacities) holds; fails after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while not cond(caps := capacities()):
            assert time.monotonic() < deadline, caps
            time.sleep(0.3)
        return caps

    caps = until(lambda caps: len(caps) == 3, 5)            # every agent started it, as a founder
    assert all(c > 0 for c in caps.values()), caps
    victim = agents[1]
    victim.kill(signal.SIGKILL)
    until(lambda caps: len(caps) == 2 and sum(caps.values()) >= 0.99 * LIMIT, 12)   # its key expired: inherited
    agents[1] = start(hosts[1])                           # its state file: a rejoiner
    until(lambda caps: caps.get(victim.host, 0) > 0.5 * LIMIT / 3, 20)
    until(lambda caps: sum(caps.values()) >= 0.995 * LIMIT, 10)    # the return and its ack settled
    # never above the limit; the agents are read one after another, ~0.1 s apart, so a transfer
    # applied between two reads can count twice (test_allocators.py allows the same 3 %)
    assert max(sums) <= LIMIT * 1.03, max(sums)
    print(f"measured: sum of capacities {min(sums) / 1e6:.2f}-{max(sums) / 1e6:.2f} Mbit/s over {len(sums)} samples")
    for c in clients:            # loaded through every phase above (each ends on its condition)
        c.stop()


# FPS evaluates line 10 on the weights each agent has heard (fps.py), which sum to 1 only when
# the views agree.  With --branching 3 and per-peer gossip alone, gossip reached 3 of 15 peers a
# round: while the 8 senders' weights grew from 0 after the idle split, each heard the others'
# rounds late (h1 once held weight 0.10 against 0.016 heard, 1.48 published, and took 35.5 of
# 40 Mbit/s); the local limits summed to 1.09-3.12 G and 3 runs of 5 went over the envelope
# (1.018, 1.023, 1.082).  The default branching (16) reaches every peer each round; at 3 the
# agents now read the weights' sum from the sum tree (agent/gossip/tree.py) instead.
@pytest.mark.parametrize("branching", [16, 3], ids=["mesh", "sum-tree"])
def test_sixteen_agents_from_etcd_eight_sending_hold_the_envelope_and_use_the_limit(make_fleet, branching):
    """16 agents that know each other only through etcd, 8 of them sending two TCP flows each and
    8 idle, FPS in the default mode (shape): the senders get the limit the idle ones do not use,
    and every window of 1 s or more stays within G x T + D (agent/burst.py)."""
    lab, _, _, start_together = make_fleet(17)
    hosts, sink = lab.hosts[:16], lab.hosts[16]
    t0 = time.monotonic()
    agents = start_together(hosts, "--branching", str(branching), global_="40mbit")
    started = time.monotonic() - t0
    joined = wait_members(agents, 16, timeout_s=20)
    limit_Bps, d = 40e6 / 8, budget(40e6 / 8, 16, "shape")
    with RxMeter(sink) as meter:
        start = time.monotonic()
        with StatusPoller(agents, start, period_s=0.5):
            for c in senders(lab, hosts[:8], seconds=14):
                c.wait()
        end = time.monotonic()
    series = meter.series(start, end)
    env = envelope(series, 0.1, limit_Bps, d)
    used = mean(series[30:130]) / limit_Bps           # from 3 s in: FPS has moved the idle hosts' shares
    worst = max(sum(series[k:k + 10]) * 0.1 for k in range(len(series) - 9))   # worst 1-s window, bytes
    seconds = [round(x / limit_Bps, 3) for x in rebin(series, 10)]
    # the local limits' sum every 0.5 s (each agent's latest status by then): over G, the hosts may pass more
    sums = [(k * 0.5, sum(next((s["local_limit_bps"] for t, s in reversed(a.samples) if t <= k * 0.5), 0.0)
                          for a in agents) / 40e6) for k in range(1, 2 * round(end - start))]
    top = max(sums, key=lambda ts: ts[1])
    print(f"measured: 16 agents answered after {started:.1f} s, all saw 16 members {joined:.1f} s later; "
          f"worst 1-s window {worst / (limit_Bps + d):.3f} of G x 1 s + D ({worst / limit_Bps:.3f} of G); "
          f"envelope ratio {env['ratio']:.3f} at {env['ratio_at_s']} s over {env['ratio_window_s']} s; "
          f"mean from 3 s {used:.3f} of G; 1-s windows {seconds}; sum of local limits at most {top[1]:.3f} of G "
          f"(at {top[0]} s), {[round(x, 2) for _, x in sums[:8]]} in the first 4 s")
    # measured 0.960-0.963 (5 runs); a busier CI machine fills less (test_promise.py: 0.885 there):
    # the check is that the idle hosts' shares went to the senders (else ~0.5)
    assert 0.8 <= used <= 1.0, used
    assert env["ratio"] <= 1.0, f"{env['ratio']:.3f} of G x T + D over {env['ratio_window_s']} s at {env['ratio_at_s']} s"
    trees = [a.status()["sum_tree"] for a in agents]
    if branching < 15:           # one group of 16: every agent reads a sum of its 15 peers from h1
        assert all(t["covers"] == 15 and t["summer"] == "h1" for t in trees), trees
    else:
        assert trees == [None] * 16
