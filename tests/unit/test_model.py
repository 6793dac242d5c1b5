"""agent/model.py's shared rules: heard_cap (one-way loss)."""
from __future__ import annotations

from drl.agent.model import Decision, Mode, PeerView, heard_cap

HEARD = PeerView(("a", "b"), {}, 1.0, 1)
UNHEARD = HEARD._replace(unheard_by=1)


def test_a_host_nobody_misses_keeps_its_decision():
    for d in (Decision(Mode.BUCKET, 9e6), Decision(Mode.DROP, 0.0, 0.3), Decision(Mode.PASS, 0.0)):
        assert heard_cap(d, HEARD, 1e6) is d


def test_an_unheard_host_passes_at_most_its_safe_rate_whatever_its_mode():
    assert heard_cap(Decision(Mode.BUCKET, 9e6, publish=2.0), UNHEARD, 1e6) == \
        Decision(Mode.BUCKET, 1e6, publish=2.0, info={"unheard_by": 1})
    assert heard_cap(Decision(Mode.BUCKET, 5e5), UNHEARD, 1e6) == Decision(Mode.BUCKET, 5e5)   # below: as it is
    for d in (Decision(Mode.DROP, 0.0, 0.3), Decision(Mode.PASS, 0.0)):
        capped = heard_cap(d, UNHEARD, 1e6)
        assert (capped.mode, capped.limit_Bps, capped.drop_probability) == (Mode.BUCKET, 1e6, 0.0)
