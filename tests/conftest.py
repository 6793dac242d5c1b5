"""Fixtures and checks for the whole suite.

The fast set (``pytest -m "not slow and not kernel"``) must stay fast: a test with neither
marker whose call takes longer than FAST_LIMIT_S fails, naming the marker it lacks.  Kernel
tests are timed by ``--durations`` in every run instead: they run real TCP for seconds by
design.
"""
from __future__ import annotations

import pytest

FAST_LIMIT_S = 5.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (call.when == "call" and report.passed and call.duration > FAST_LIMIT_S
            and item.get_closest_marker("slow") is None and item.get_closest_marker("kernel") is None):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {call.duration:.1f} s, over the fast set's {FAST_LIMIT_S:g} s: "
                           "make it faster or mark it @pytest.mark.slow")
