"""Fixtures for kernel tests: a fresh two-host network per test (tests/kernel/netns.py).

``net`` skips with a reason when this machine cannot run kernel tests, and
always removes its namespaces and processes, even when the test fails.
"""
from __future__ import annotations

import pytest

from netns import Network, kernel_skip_reason, run_prefix


@pytest.fixture
def net():
    reason = kernel_skip_reason()
    if reason:
        pytest.skip(reason)
    with Network(run_prefix("dp")) as network:
        yield network


@pytest.fixture
def server(net):
    """An iperf3 server on h2 (10.0.0.2 / fd00::2)."""
    with net.hosts[1].iperf3_server() as srv:
        yield srv


@pytest.fixture
def datapath(net):
    """Factory: Datapath attached to h1's eth0; every one made is closed afterwards."""
    from agent.datapath import Datapath

    made = []

    def make(**kw):
        dp = Datapath("eth0", netns=net.hosts[0].ns, **kw)
        made.append(dp)
        dp.attach()
        return dp

    yield make
    for dp in made:
        dp.close()
