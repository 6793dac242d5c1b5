"""GDRL (agent/allocators/gdrl.py) on the paper's setup and under a hostile network."""
import pytest
from hypothesis import given, settings, strategies as st

from drl.agent.allocators import create
from drl.agent.allocators.gdrl import INDICATORS, PARTS, EtaAboveBoundError
from drl.lab.fairness import jain
from drl.agent.model import Local

from netharness import Net, diffusion_accounted

N = 10
SCALE = 1e6   # the paper's unit rates as MB/s; capacities are whole B/s
LAMBDA = [(i + 1) / (N + 1) * SCALE for i in range(N)]           # lambda_i = i/(N+1), [Stanojevic09] §III-A
CAPACITY = 1.1 * sum(LAMBDA)                                      # C = 1.1 * sum(lambda_i)
MEMBERS = [f"n{i:02d}" for i in range(N)]


def _paper_net(**net_kw):
    net = Net(create("gdrl", eta=0.25, indicator="spare"), MEMBERS, CAPACITY, **net_kw)
    for member, lam in zip(MEMBERS, LAMBDA):
        net.local[member] = Local(demand_Bps=lam)
    return net


def _q(net):
    """q_i = lambda_i - C_i, the spare bandwidth of eq. 14 that [Stanojevic09] Fig. 3/4 plot."""
    return [lam - net.decision[m].limit_Bps for m, lam in zip(MEMBERS, LAMBDA)]


@pytest.mark.parametrize("net_kw", [{}, {"loss": 0.3, "dup": 0.1, "max_delay": 2, "seed": 4}],
                         ids=["reliable", "lossy"])
def test_paper_ring_reaches_jain_099(net_kw):
    """[Stanojevic09] §III-A: 10 limiters on a ring, eta = 1/4: JFI(q) goes from ~0 to >= 0.99."""
    net = _paper_net(**net_kw)
    net.run(1)
    assert jain(_q(net)) < 0.1
    net.run(79)
    assert jain(_q(net)) >= 0.99
    assert diffusion_accounted(net) == PARTS


def test_a_node_outside_the_founders_starts_as_a_joiner():
    """A registry's agents start a class from the founders etcd keeps: the others join."""
    alloc = create("gdrl")
    founder, joiner = alloc.initial_state("a", ("a", "b")), alloc.initial_state("c", ("a", "b"))
    assert founder.genesis == ("a", "b") and founder.neighbours == ("b",)
    assert joiner.genesis == () and set(joiner.neighbours) <= {"a", "b"} and joiner.neighbours
    assert type(alloc).genesis_shares and create("dqmp").genesis_shares and not hasattr(create("fps"), "genesis_shares")


def test_eta_above_the_bound_is_refused_unless_forced():
    with pytest.raises(EtaAboveBoundError, match=r"above 1/\(2d\) = 0.25"):
        create("gdrl", eta=0.3)
    with pytest.raises(EtaAboveBoundError, match="0.125"):
        create("gdrl", eta=0.2, graph="regular", degree=4)
    alloc = create("gdrl", eta=0.3, force_eta=True)
    net = Net(alloc, MEMBERS[:3], 3e6)
    net.run(1)
    assert "above" in net.decision[MEMBERS[0]].info["warning"]


def test_default_eta_is_one_over_two_d():
    assert create("gdrl").initial_state("a", ("a", "b", "c")).eta == 0.25
    assert create("gdrl", graph="regular", degree=3).initial_state("a", tuple("abcdef")).eta == pytest.approx(1 / 6)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(INDICATORS)), demand=st.floats(1e3, 1e9), c=st.floats(0, 1e9),
       more=st.floats(1, 1e9))
def test_indicators_do_not_increase_with_capacity(name, demand, c, more):
    """003 Assumption 1: q decreasing in C (non-increasing for the clipped drop rate)."""
    ind = INDICATORS[name]
    assert ind.value(demand, c + more) <= ind.value(demand, c)
    assert ind.slope(demand) > 0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), loss=st.floats(0, 0.5), dup=st.floats(0, 0.3), delay=st.integers(0, 3),
       crashes=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 25)), max_size=3),
       indicator=st.sampled_from(sorted(INDICATORS)))
def test_conserved_every_tick_under_loss_dup_reorder_and_crashes(seed, loss, dup, delay, crashes, indicator):
    members = [f"m{i}" for i in range(6)]
    total = 6_000_000
    net = Net(create("gdrl", indicator=indicator, dead_after_s=2.0), members, total,
              loss=loss, dup=dup, max_delay=delay, seed=seed)
    for k, m in enumerate(members):
        net.local[m] = Local(demand_Bps=(k + 1) * 300_000.0)
    schedule = {tick: members[k] for k, tick in crashes}
    for tick in range(40):
        if tick in schedule and len(net.live) > 1:
            net.crash(schedule[tick])
        net.tick()
        assert diffusion_accounted(net) == PARTS


def test_best_friend_inherits_a_crashed_nodes_capacity():
    members = ["a", "b", "c", "d"]
    net = Net(create("gdrl", dead_after_s=3.0), members, 4_000_000)
    for m in members:
        net.local[m] = Local(demand_Bps=1_000_000.0)
    net.run(5)
    net.crash("b")
    net.run(2)
    assert net.state["c"].ledger.claimed == frozenset()      # a short silence: no action
    net.run(3)
    assert net.state["c"].ledger.claimed == {"b"}             # b's ring successor is its heir
    net.run(40)
    limits = [net.decision[m].limit_Bps for m in net.live]
    assert diffusion_accounted(net) == PARTS
    assert sum(limits) == pytest.approx(4_000_000, abs=100) and min(limits) > 1_200_000   # the rest in flight


@pytest.mark.slow
def test_regular_graph_of_100_converges():
    """[Stanojevic09] §III-C: random d-regular graphs at eta = 1/(2d) converge as well."""
    members = [f"n{i:03d}" for i in range(100)]
    lam = {m: (i + 1) / 101 * SCALE for i, m in enumerate(members)}
    net = Net(create("gdrl", graph="regular", degree=4, seed=1, indicator="spare"), members, 1.1 * sum(lam.values()))
    for m in members:
        net.local[m] = Local(demand_Bps=lam[m])
    net.run(120)
    assert jain([lam[m] - net.decision[m].limit_Bps for m in members]) >= 0.99


@pytest.mark.parametrize("name", ["gdrl", "fillratio"])
def test_a_change_of_the_global_limit_rescales_every_limit_on_the_next_tick(name):
    """drlctl set, a reload or etcd change C: the ledgers hold parts of C, so the limits
    follow on the next tick, with no transfer (a ledger in B/s kept enforcing the old C
    for good).  What is in flight at the change is short for a few ticks, as at any tick."""
    members = ["a", "b", "c", "d"]
    net = Net(create(name), members, 8e6)
    for k, m in enumerate(members):
        net.local[m] = Local(demand_Bps=(k + 1) * 2e6)        # together more than any C below
    net.run(30)
    for limit in (2e6, 16e6, 8e6):
        net.global_Bps = limit
        for tick in range(10):
            net.tick()
            total = sum(net.decision[m].limit_Bps for m in members)
            assert diffusion_accounted(net) == PARTS and total <= limit * (1 + 1e-9), (limit, tick, total)
        assert total >= 0.95 * limit, (limit, total)
