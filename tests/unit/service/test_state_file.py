"""agent/service/class_table.py StateFile: an allocator's saved state, checked before it is used."""
from __future__ import annotations

import json
import logging

import pytest

from drl.agent.allocators import create
from drl.agent.allocators.transfer import Ledger, ledger_to_dict
from drl.agent.service.class_table import StateFile, StateFileError


def dqmp_file(tmp_path, edit):
    alloc = create("dqmp", quota_bytes=10**9, period_s=86400.0)
    state = alloc.initial_state("a", ("a", "b"))
    data = alloc.dump_state(state)
    data["ledger"] = ledger_to_dict(Ledger(holding=10**9))       # the manager's quota
    edit(data)
    path = tmp_path / "dqmp-a.json"
    path.write_text(json.dumps(data))
    return StateFile(alloc, path), alloc, state


def test_a_good_file_is_restored(tmp_path):
    sf, alloc, _ = dqmp_file(tmp_path, lambda d: None)
    assert alloc.dump_state(sf.load()) == json.loads(sf.path.read_text())


@pytest.mark.parametrize("edit, key", [
    (lambda d: d["ledger"].update(holding=float("nan")), "ledger.holding"),
    (lambda d: d["ledger"].update(holding=-10**9), "ledger.holding"),
    (lambda d: d["ledger"].update(holding=1e300), "ledger.holding"),
    (lambda d: d.update(consumed=-5), "consumed"),
    (lambda d: d.update(granted_total=float("inf")), "granted_total"),
])
def test_a_file_with_an_absurd_number_is_logged_naming_file_and_key_and_the_class_starts_afresh(
        tmp_path, caplog, edit, key):
    """A NaN, negative or 1e300 holding was restored silently."""
    sf, _, _ = dqmp_file(tmp_path, edit)
    with caplog.at_level(logging.WARNING):
        assert sf.load() is None
    [line] = [r.getMessage() for r in caplog.records if "state_refused" in r.getMessage()]
    assert str(sf.path) in line and key in line and "\n" not in line


def test_a_file_nested_past_the_parsers_limit_is_one_line(tmp_path):
    sf, _, _ = dqmp_file(tmp_path, lambda d: None)
    sf.path.write_text("[" * 100_000)
    with pytest.raises(StateFileError, match="remove it"):
        sf.load()
