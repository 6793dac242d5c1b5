"""agent/burst.py: the hosts' depths never add up to more than the class's burst budget D."""
from hypothesis import given, settings, strategies as st

from drl.agent.burst import POLICE_FLOOR, SHAPE_FLOOR, budget, host_depth, mode_depth

MODES = st.sampled_from(["police", "shape"])


def test_default_budgets_are_300ms_policed_and_100ms_shaped_but_at_least_a_floor_per_host():
    assert budget(125e6, 3, "police") == 37_500_000                    # 1 Gbit/s: 300 ms
    assert budget(125e6, 3, "shape") == 12_500_000                     # 100 ms
    assert budget(1.25e6, 3, "shape") == 3 * SHAPE_FLOOR               # 10 Mbit/s: 125 kB < 3 floors
    assert budget(1.25e6, 3, "police") == 3 * POLICE_FLOOR
    assert budget(125e6, 3, "shape", configured=1_000_000) == 1_000_000
    assert budget(125e6, 30, "shape", configured=1_000_000) == 30 * SHAPE_FLOOR   # raised to N floors


def test_equal_shares_keep_the_modes_own_depth_where_the_budget_allows_it():
    """The default budget is what the mode's rule gives N equal hosts: nothing changes for them."""
    g, n = 125e6, 4
    for mode in ("police", "shape"):
        d = budget(g, n, mode)
        assert host_depth(g / n, g, n, d, mode) == mode_depth(g / n, mode)


def test_a_small_budget_is_split_by_rate_and_burst_caps_it():
    g, n = 125e6, 2
    d = 2 * SHAPE_FLOOR + 100_000
    assert host_depth(0.25 * g, g, n, d, "shape") == SHAPE_FLOOR + 25_000       # below 4 ms of its rate
    assert host_depth(0.75 * g, g, n, d, "shape") == SHAPE_FLOOR + 75_000
    assert host_depth(0.75 * g, g, n, d, "shape", burst_bytes=50_000) == 50_000


@settings(max_examples=300, deadline=None)
@given(g=st.floats(1e3, 1.25e11), n=st.integers(1, 10_000), mode=MODES,
       configured=st.none() | st.integers(0, 2**40), split=st.lists(st.floats(0, 1), min_size=1, max_size=50))
def test_the_hosts_depths_add_up_to_at_most_the_budget(g, n, mode, configured, split):
    """Whatever the rates (summing to at most G) and the budget, sum(depth_i) <= D."""
    hosts = split[:n]
    total = sum(hosts) or 1.0
    rates = [g * x / total for x in hosts]
    d = budget(g, n, mode, configured)
    depths = [host_depth(r, g, n, d, mode) for r in rates]
    idle = n - len(rates)                         # the other hosts at rate 0 hold a floor each
    assert sum(depths) + idle * host_depth(0.0, g, n, d, mode) <= d
    assert all(x >= 1 for x in depths)
