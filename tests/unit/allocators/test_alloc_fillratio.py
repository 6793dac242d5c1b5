"""Fill ratio (agent/allocators/fillratio.py): [Ramsden]."""
import pytest
from hypothesis import given, settings, strategies as st

from drl.agent.allocators import create
from drl.agent.allocators.gdrl import PARTS
from drl.agent.model import Local

from netharness import Net, diffusion_accounted

MEMBERS = ["a", "b", "c", "d", "e", "f"]
R = 6_000_000
DEMAND = {m: (k + 1) * 400_000.0 for k, m in enumerate(MEMBERS)}


def _net(alloc=None, **kw):
    net = Net(alloc or create("fillratio", dead_after_s=5.0), MEMBERS, R, **kw)
    for m in MEMBERS:
        net.local[m] = Local(demand_Bps=DEMAND[m])
    return net


def _ratios(net, nodes):
    return [net.decision[m].limit_Bps / DEMAND[m] for m in nodes]


def test_supply_follows_demand_on_the_ring():
    """[Ramsden] eq. 1: S_1/D_1 = ... = S_n/D_n; on a ring, eta = 1/4."""
    net = _net()
    net.run(1)
    assert max(_ratios(net, MEMBERS)) / min(_ratios(net, MEMBERS)) > 3
    net.run(150)
    ratios = _ratios(net, MEMBERS)
    assert max(ratios) / min(ratios) < 1.02
    assert net.decision["a"].info["fill_ratio"] == pytest.approx(ratios[0], rel=1e-6)
    assert diffusion_accounted(net) == PARTS


def test_joining_node_starts_at_zero_and_gets_supply_from_two_random_neighbours():
    net = _net()
    net.run(30)
    joiner = create("fillratio", join=True, seed=5)
    state = joiner.initial_state("g", tuple(MEMBERS) + ("g",))
    assert len(state.neighbours) == 2 and set(state.neighbours) <= set(MEMBERS)
    net.add("g", joiner, tuple(MEMBERS) + ("g",))
    net.local["g"] = Local(demand_Bps=2_000_000.0)
    net.run(1)
    assert net.state["g"].ledger.holding == 0
    net.run(200)
    assert net.decision["g"].limit_Bps > 500_000
    assert set(net.state["g"].ledger.links) == set(state.neighbours)
    assert diffusion_accounted(net) == PARTS


@settings(max_examples=20, deadline=None)
@given(side=st.sets(st.sampled_from(MEMBERS), min_size=1, max_size=3), start=st.integers(1, 20),
       length=st.integers(1, 4), loss=st.floats(0, 0.3), seed=st.integers(0, 1000))
def test_netsplit_shorter_than_dead_after_creates_no_supply(side, start, length, loss, seed):
    """[Ramsden] §3.1: a split changes nothing; during and after it the supplies held plus
    in flight are R, no one inherits anything, and all transfers are acked after healing."""
    net = _net(loss=loss, seed=seed, max_delay=1)
    net.run(start)
    net.partition(side)
    for _ in range(length):
        net.tick()
        assert diffusion_accounted(net) == PARTS
    net.heal()
    net.loss = 0.0
    net.run(30)
    assert diffusion_accounted(net) == PARTS
    assert all(not s.ledger.claimed and not s.ledger.closed for s in net.state.values())
    links = [link for s in net.state.values() for link in s.ledger.links.values()]
    assert sum(s.ledger.holding for s in net.state.values()) + sum(l.net for l in links) == PARTS


def test_best_buddy_inherits_and_supply_is_rebalanced():
    net = _net()
    net.run(40)
    net.crash("c")
    net.run(6)
    assert net.state["d"].ledger.claimed == {"c"}
    net.run(150)
    ratios = _ratios(net, net.live)
    assert max(ratios) / min(ratios) < 1.05
    assert diffusion_accounted(net) == PARTS
