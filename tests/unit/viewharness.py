"""One summary of a PeerView, for tests that compare the agent's views with the simulator's
(tests/unit/gossip/test_stale_rule.py, tests/unit/sim/test_sim_membership.py)."""
from __future__ import annotations

import math


def summary(view) -> dict:
    return {"members": tuple(view.members), "n_alive": view.n_alive, "remote_sum": view.remote_sum,
            "peers": {p: (s.value, s.alive, s.age_s if math.isfinite(s.age_s) else "never")
                      for p, s in sorted(view.peers.items())}}
