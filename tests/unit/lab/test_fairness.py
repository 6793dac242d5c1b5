"""lab/fairness.py: Jain's index, the one copy every part of the project imports."""
import math

import pytest
from hypothesis import given, strategies as st

from drl.lab.fairness import jain

rates = st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=1, max_size=50)


@given(rates)
def test_lies_between_one_over_k_and_one(xs):
    assert 1 / len(xs) - 1e-9 <= jain(xs) <= 1 + 1e-9


@given(rates, st.floats(min_value=1e-3, max_value=1e3))
def test_ignores_scale(xs, k):
    assert jain([x * k for x in xs]) == pytest.approx(jain(xs), rel=1e-6, abs=1e-9)


def test_matches_the_paper_example():
    # [Raghavan07] §4.1: 9 flows alike and 1 starved gives "the seemingly high fairness index of 0.9"
    assert jain([1.0] * 9 + [0.0]) == pytest.approx(0.9)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_equal_is_one_and_one_hot_is_one_over_n(n):
    assert jain([3.0] * n) == pytest.approx(1.0)
    assert jain([7.0] + [0.0] * (n - 1)) == pytest.approx(1 / n)


def test_idle_is_not_unfair():
    assert jain([]) == 1.0 and jain([0.0, 0.0, 0.0]) == 1.0


def test_nan_members_are_left_out():
    assert jain([2.0, math.nan, 2.0]) == 1.0 and jain([math.nan]) == 1.0
