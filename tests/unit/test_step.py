"""One class step for the agent and the simulator (agent/step.py).

Every allocator step of the agent's tick and of the simulator's loop must come from
``class_step``: a result from drl-sim is evidence about the agent only if both run the same
order (tree sums, snapshot, allocator, heard cap).  The allocator's ``step`` is wrapped to
note who called it; a caller that goes round ``class_step`` fails these tests.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from daemon_harness import FakeDatapath, agent, config
from drl.agent import step as step_module
from drl.agent.allocators.fps import FlowProportionalShare
from drl.agent.model import Decision, Local, Mode, PeerView, Step
from drl.agent.step import ClassInput, class_step
from drl.sim.engine import Setup, Simulation
from drl.sim.openloop import PoissonDemand


@pytest.fixture
def callers(monkeypatch):
    """The function that called FPS's step, one entry per call."""
    seen: list[str] = []
    real = FlowProportionalShare.step

    def noting(self, state, snap):
        caller = sys._getframe(1)
        seen.append(f"{caller.f_code.co_filename}:{caller.f_code.co_name}")
        return real(self, state, snap)
    monkeypatch.setattr(FlowProportionalShare, "step", noting)
    return seen


def _all_from_class_step(seen: list[str]) -> bool:
    return bool(seen) and all(c == f"{step_module.__file__}:class_step" for c in seen)


def test_the_agents_tick_steps_every_class_through_class_step(tmp_path, callers):
    cfg = config(tmp_path, "--global", "8mbit", "--allocator", "fps", "--peers", "b@10.0.0.2:7470")
    with agent(cfg, FakeDatapath()) as a:
        for _ in range(3):
            a.tick(time.monotonic())
    assert len(callers) == 3 and _all_from_class_step(callers), callers


@pytest.mark.parametrize("n, branching", [(4, 3), (40, 3)])       # 40 with branching 3: the sum tree runs
def test_the_simulator_steps_every_node_through_class_step(callers, n, branching):
    setup = Setup(allocator="fps", n_nodes=n, global_Bps=1e6, branching=branching)
    sim = Simulation(setup, PoissonDemand(np.ones(n), n, np.random.default_rng(0)))
    assert bool(sim.trees) == (n == 40)
    sim.run(5)
    assert len(callers) == 5 * n and _all_from_class_step(callers), set(callers)


class _Greedy:
    """An allocator that asks for the whole limit, whatever it hears."""
    name = "greedy"

    def initial_state(self, node_id, members):
        return None

    def step(self, state, snap):
        return Step(None, Decision(Mode.BUCKET, limit_Bps=snap.global_Bps, publish=1.0))


class _Sums:
    def __init__(self, remote_sum):
        self.remote_sum, self.calls = remote_sum, []

    def apply(self, view, key, now):
        self.calls.append(key)
        return view._replace(remote_sum=self.remote_sum)


def _given(view, safe_Bps=250.0):
    return ClassInput(1.0, "a", 0.05, 1000.0, Local(10.0), view, (), safe_Bps, key=7)


def test_the_heard_cap_comes_after_the_allocator_and_the_tree_before_it():
    unheard = PeerView(("a", "b"), {}, 0.0, 1, unheard_by=1)
    sums = _Sums(42.0)
    snap, out = class_step(_Greedy(), None, _given(unheard), sums)
    assert sums.calls == [7] and snap.view.remote_sum == 42.0      # the allocator saw the tree's sum
    assert out.decision.limit_Bps == 250.0                         # and its decision was capped
    _, heard = class_step(_Greedy(), None, _given(unheard._replace(unheard_by=0)))
    assert heard.decision.limit_Bps == 1000.0
