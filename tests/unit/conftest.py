"""Fixtures shared by the unit tests."""
from __future__ import annotations

import signal

import pytest


@pytest.fixture
def signals_kept():
    """serve() installs the agent's signal handlers; give pytest its own back."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for s, handler in kept.items():
        signal.signal(s, handler)
