"""The web workload's size distribution (lab/web.py); the transfers themselves run in tests/kernel/test_lab.py."""
import random

from hypothesis import given, strategies as st

from drl.lab.web import pareto_size


@given(st.integers(0, 2**32), st.integers(1_000, 100_000), st.floats(1.05, 3.0), st.integers(1, 10_000_000))
def test_sizes_are_positive_and_capped(seed, mean, shape, cap):
    rng = random.Random(seed)
    assert all(1 <= pareto_size(rng, mean, shape, cap) <= cap for _ in range(20))


def test_mean_matches_when_the_tail_is_light_enough_to_converge():
    rng = random.Random(7)
    sizes = [pareto_size(rng, 20_000, 3.0, 10**12) for _ in range(50_000)]
    assert abs(sum(sizes) / len(sizes) - 20_000) < 0.05 * 20_000


def test_heavy_tail_puts_most_bytes_in_few_objects():
    rng = random.Random(7)
    sizes = sorted(pareto_size(rng, 20_000, 1.2, 2_000_000) for _ in range(20_000))
    top = sum(sizes[-len(sizes) // 10:])
    assert top > 0.5 * sum(sizes), "the largest 10 % of objects carry most of the bytes"
