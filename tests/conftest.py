"""Fixtures and checks for the whole suite.

The fast set (``pytest -m "not slow and not kernel"``) must stay fast: a test with neither
marker whose call takes longer than FAST_LIMIT_S fails, naming the marker it lacks.  Kernel
tests are timed by ``--durations`` in every run instead: they run real TCP for seconds by
design.  ``DRL_FAST_CLOCK=cpu`` (scripts/test.sh, where these tests run at nice 19 beside
the kernel tests) judges the test's CPU time instead: its wall time there is the other
lane's load.
"""
from __future__ import annotations

import os
import time

import pytest

FAST_LIMIT_S = 5.0
CPU_CLOCK = os.environ.get("DRL_FAST_CLOCK") == "cpu"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    started = time.process_time()
    yield
    item.stash[_CPU_S] = time.process_time() - started


_CPU_S = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    took = item.stash.get(_CPU_S, call.duration) if CPU_CLOCK else call.duration
    if (call.when == "call" and report.passed and took > FAST_LIMIT_S
            and item.get_closest_marker("slow") is None and item.get_closest_marker("kernel") is None):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {took:.1f} s{' of CPU' if CPU_CLOCK else ''}, over the fast "
                           f"set's {FAST_LIMIT_S:g} s: make it faster or mark it @pytest.mark.slow")
