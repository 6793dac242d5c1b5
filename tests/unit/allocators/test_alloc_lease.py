"""Leases (agent/allocators/lease.py): [RLDesign]."""
import pytest
from hypothesis import given, settings, strategies as st

from drl.agent.allocators import create
from drl.agent.allocators.common import ParameterError
from drl.agent.model import Local

from netharness import Net

MEMBERS = ["a", "b", "c", "d"]
GLOBAL = 4_000_000.0


def _net(**params):
    net = Net(create("lease", ttl_s=5.0, refresh_s=1.0, **params), MEMBERS, GLOBAL, interval_s=0.5)
    for k, m in enumerate(MEMBERS):
        net.local[m] = Local(demand_Bps=(k + 1) * 500_000.0)
    return net


def test_grants_follow_demand_and_fit_the_global_limit():
    net = _net()
    net.run(10)
    limits = {m: net.decision[m].limit_Bps for m in MEMBERS}
    assert limits["a"] == pytest.approx(500_000) and limits["b"] == pytest.approx(1_000_000)
    assert sum(limits.values()) <= GLOBAL + 1e-6
    assert net.decision["b"].info["lease_state"] == "valid"
    assert 3.0 <= net.decision["b"].info["lease_expires_in_s"] <= 5.0


@pytest.mark.parametrize("mode, expected", [("pessimistic", 0.0), ("optimistic", 1_000_000.0),
                                            ("safe", GLOBAL / 4)])
def test_each_mode_on_server_loss(mode, expected):
    net = _net(on_lease_loss=mode)
    net.run(10)
    net.crash("a")                          # the lease server
    net.run(8)                              # 4 s: the lease still holds
    assert net.decision["b"].info["lease_state"] == "valid"
    net.run(4)                              # 6 s > ttl: it expired
    assert net.decision["b"].info["lease_state"] == "expired"
    assert net.decision["b"].limit_Bps == pytest.approx(expected)


def test_safe_mode_uses_the_configured_safe_rate():
    net = _net(on_lease_loss="safe", safe_Bps=123_000.0)
    net.crash("a")
    net.run(3)
    assert net.decision["c"].limit_Bps == 123_000.0 and net.decision["c"].info["lease_state"] == "none"


def test_soft_limit_warns_and_hard_limit_is_the_bucket():
    net = _net(soft_fraction=0.8)
    net.local["d"] = Local(demand_Bps=10_000_000.0)
    net.run(10)
    decision = net.decision["d"]
    assert decision.mode.name == "BUCKET" and decision.limit_Bps < 10_000_000.0
    assert "hard limit" in decision.info["warning"]
    assert "soft limit" in net.decision["a"].info["warning"]          # the server
    assert "warning" not in net.decision["b"].info
    quiet = _net(soft_fraction=0.8)
    for m in MEMBERS:
        quiet.local[m] = Local(demand_Bps=500_000.0)
    quiet.run(10)
    assert all("warning" not in quiet.decision[m].info for m in MEMBERS)


def test_clients_fail_over_to_the_next_server():
    net = _net(servers="a,c")
    net.run(6)
    net.crash("c")
    net.run(20)
    assert net.decision["d"].info["lease_state"] == "valid"


def test_bad_parameters_are_refused_in_one_line():
    with pytest.raises(ParameterError, match="on_lease_loss"):
        create("lease", on_lease_loss="hopeful")
    with pytest.raises(ParameterError, match="refresh_s"):
        create("lease", ttl_s=1.0, refresh_s=2.0)
    with pytest.raises(ParameterError, match="not members"):
        create("lease", servers=("zz",)).initial_state("a", ("a", "b"))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), loss=st.floats(0, 0.5), dup=st.floats(0, 0.3), delay=st.integers(0, 1),
       demands=st.lists(st.lists(st.floats(0, 5e6), min_size=4, max_size=4), min_size=1, max_size=6))
def test_unexpired_grants_never_exceed_the_global_limit(seed, loss, dup, delay, demands):
    """Whatever the demand swings, loss and duplicates: the capacity clients may be
    using under a valid lease never adds up to more than the global limit."""
    net = Net(create("lease", ttl_s=3.0, refresh_s=1.0, servers="a,b"), MEMBERS, GLOBAL,
              interval_s=0.5, loss=loss, dup=dup, max_delay=delay, seed=seed)
    for phase in demands:
        for m, d in zip(MEMBERS, phase):
            net.local[m] = Local(demand_Bps=d)
        for _ in range(5):
            net.tick()
            in_use = sum(net.decision[m].limit_Bps for m in MEMBERS
                         if net.decision[m].info["lease_state"] == "valid")
            assert in_use <= GLOBAL * (1 + 1e-9)


@pytest.mark.parametrize("reserved, own", [(None, GLOBAL), (0.0, GLOBAL), (1_500_000.0, GLOBAL - 1_500_000.0)])
def test_a_server_grants_nothing_of_what_dead_peers_may_still_pass(reserved, own):
    """A killed client's kernel passes its fail-safe: granting the whole limit to the others
    let three hosts pass 1.32 times it."""
    from drl.agent.allocators.common import peer_view
    from drl.agent.model import PeerState, Snapshot

    alloc = create("lease", ttl_s=5.0, refresh_s=1.0)
    view = peer_view(MEMBERS, [PeerState(m, 0.0, False, 30.0) for m in MEMBERS[1:]])._replace(reserved_Bps=reserved)
    snap = Snapshot(now=10.0, node_id="a", interval_s=0.5, global_Bps=GLOBAL, local=Local(demand_Bps=9e9), view=view)
    assert alloc.step(alloc.initial_state("a", tuple(MEMBERS)), snap).decision.limit_Bps == pytest.approx(own)
