"""Fixtures for kernel tests: every test builds its own Lab (lab/netns.py) from a code
topology (lab/topology.py's ``pair``/``star``) under a run prefix of its own.

``make_lab(topology)`` builds any topology; ``net`` is a fresh pair (h1 10.0.0.1
<-> h2 10.0.0.2), ``make_star(n)`` and ``net3`` stars; ``cluster(lab)`` and
``agents`` (on net3) start real agents.  Both skip with a reason when this machine cannot run kernel
tests, and every Lab removes its namespaces and processes afterwards, even
when the test fails.
"""
from __future__ import annotations

import contextlib

import pytest

from drl.lab.agents import Cluster, write_key
from drl.lab.netns import Lab
from drl.lab.preflight import skip_reason
from drl.lab.topology import WAN_RTO_MIN, new_run, pair, star
from drl.lab.traffic import iperf3_server


@pytest.fixture
def make_lab():
    """Factory: Lab(topology), built now and torn down after the test."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with contextlib.ExitStack() as built:
        yield lambda topology: built.enter_context(Lab(topology))


@pytest.fixture
def net(make_lab):
    return make_lab(pair(new_run("dp")))


@pytest.fixture
def make_star(make_lab):
    """Factory: a star of n hosts on one bridge (h1 10.0.0.1 ...) with TCP's WAN RTO floor
    (lab/topology.py WAN_RTO_MIN: agent tests divide limits among TCP flows)."""
    return lambda n_hosts: make_lab(star(n_hosts, new_run("st"), rto_min=WAN_RTO_MIN))


@pytest.fixture
def net3(make_star):
    return make_star(3)


@pytest.fixture
def net4(make_star):
    return make_star(4)


@pytest.fixture
def cluster(tmp_path):
    """Factory: a lab.agents.Cluster on a Lab, its agents sharing a fresh key in tmp_path."""
    write_key(tmp_path / "cluster.key")
    return lambda lab: Cluster(lab, tmp_path, str(tmp_path / "cluster.key"))


@pytest.fixture
def agents(net3, cluster):
    """Agents on net3's hosts."""
    return cluster(net3)


@pytest.fixture
def server(net):
    """An iperf3 server on h2 (10.0.0.2 / fd00::2)."""
    with iperf3_server(net.hosts[1]) as srv:
        yield srv


@pytest.fixture
def datapath(net):
    """Factory: Datapath attached to h1's eth0; every one made is closed afterwards."""
    from drl.agent.kernel.datapath import Datapath

    made = []

    def make(**kw):
        dp = Datapath("eth0", netns=net.hosts[0].ns, **kw)
        made.append(dp)
        dp.attach()
        return dp

    yield make
    for dp in made:
        dp.close()
