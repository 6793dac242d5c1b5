"""agent/cluster/limits.py: versioned global limits, newest wins, kept across restarts."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from drl.agent import units
from drl.agent.cluster.limits import Limit, LimitBook, LimitBookError


def test_config_value_is_version_0_and_a_changed_file_is_a_new_version():
    book = LimitBook()
    assert book.configure("gold", 1e6) == Limit(0, 1e6)
    assert book.configure("gold", 1e6) == Limit(0, 1e6)
    assert book.configure("gold", 2e6) == Limit(1, 2e6)


def test_a_live_set_survives_a_reload_of_an_unchanged_file_but_not_a_changed_one():
    book = LimitBook()
    book.configure("gold", 1e6)
    assert book.set("gold", 5e6) == Limit(1, 5e6)
    assert book.configure("gold", 1e6) == Limit(1, 5e6)
    assert book.configure("gold", 3e6) == Limit(2, 3e6)


def test_merge_adopts_only_newer_limits():
    book = LimitBook()
    book.configure("gold", 1e6)
    book.set("gold", 2e6)
    assert not book.merge("gold", Limit(0, 9e6))
    assert not book.merge("gold", Limit(1, 2e6))
    assert book.merge("gold", Limit(1, 3e6))      # same version: the higher rate, on every agent
    assert book.merge("gold", Limit(4, 1e5))
    assert book.get("gold") == Limit(4, 1e5)
    assert not book.merge("silver", Limit(9, 1.0))  # classes come from config, not from peers


def test_the_book_survives_a_restart(tmp_path):
    path = tmp_path / "limits.json"
    book = LimitBook(path)
    book.configure("gold", 1e6)
    book.set("gold", 7e6)
    book.save()
    again = LimitBook(path)
    assert again.configure("gold", 1e6) == Limit(1, 7e6)   # same file: the live set stays


def test_an_unreadable_book_is_one_line(tmp_path):
    path = tmp_path / "limits.json"
    path.write_text("{not json")
    with pytest.raises(LimitBookError, match="remove it"):
        LimitBook(path)


def test_a_state_directory_that_cannot_be_made_is_named(tmp_path):
    """Not 'limits file ... unreadable; remove it' for a file that does not exist."""
    (tmp_path / "afile").write_text("")
    with pytest.raises(LimitBookError, match=r"cannot use state directory .*afile/sub: Not a directory"):
        LimitBook(tmp_path / "afile" / "sub" / "limits-a.json")
    LimitBook(tmp_path / "new" / "dir" / "limits-a.json")
    assert (tmp_path / "new" / "dir").is_dir()


@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([1e6, 2e6, 3e6])), min_size=1, max_size=20),
       st.randoms())
def test_agents_hearing_the_same_limits_in_any_order_agree(limits, rnd):
    books = [LimitBook() for _ in range(3)]
    for book in books:
        book.configure("c", 1e6)
    for book in books:
        order = [Limit(*x) for x in limits]
        rnd.shuffle(order)
        for limit in order:
            book.merge("c", limit)
    assert len({book.get("c") for book in books}) == 1
    assert books[0].get("c") == max([Limit(0, 1e6), *(Limit(*x) for x in limits)])


# -- bounds (agent/units.py): nothing absurd is stored, saved or loaded ------------------------

TOP = units.MAX_VERSION - 1        # the highest version the book holds: only a set makes it


@pytest.mark.parametrize("rate", [float("inf"), float("nan"), 0.0, -1e6, 1e300])
def test_set_and_configure_refuse_an_absurd_rate_and_store_nothing(tmp_path, rate):
    book = LimitBook(tmp_path / "limits.json")
    book.configure("gold", 1e6)
    with pytest.raises(LimitBookError, match="class 'gold': global_Bps"):
        book.set("gold", rate)
    with pytest.raises(LimitBookError, match="class 'gold': global_Bps"):
        book.configure("gold", rate)
    assert book.get("gold") == Limit(0, 1e6)
    book.save()
    assert LimitBook(tmp_path / "limits.json").get("gold") == Limit(0, 1e6)


def test_a_version_that_cannot_be_incremented_is_never_adopted():
    """A forged announcement at the top of the uint64 range was adopted for good, and the
    next `drlctl set` made 2^64, which crashed the agent after it had saved it."""
    book = LimitBook()
    book.configure("gold", 1e6)
    assert not book.merge("gold", Limit(2**64 - 1, 7.5e6))
    assert not book.merge("gold", Limit(units.MAX_VERSION, 7.5e6))
    assert not book.merge("gold", Limit(TOP, 7.5e6))            # a set could not follow it
    assert not book.merge("gold", Limit(5, float("inf")))
    assert book.get("gold") == Limit(0, 1e6)
    assert book.set("gold", 2e6) == Limit(1, 2e6)


def test_set_at_the_top_version_is_refused_in_one_line_and_changes_nothing(tmp_path):
    book = LimitBook(tmp_path / "limits.json")
    book.configure("gold", 1e6)
    assert book.merge("gold", Limit(TOP - 1, 1e6 + 1))          # adopted: one set can still follow
    assert book.set("gold", 2e6) == Limit(TOP, 2e6)
    with pytest.raises(LimitBookError, match="class 'gold': its limit is at version .* the highest .* rotate"):
        book.set("gold", 3e6)
    with pytest.raises(LimitBookError):
        book.configure("gold", 3e6)
    assert book.get("gold") == Limit(TOP, 2e6)
    book.save()
    assert LimitBook(tmp_path / "limits.json").get("gold") == Limit(TOP, 2e6)


@pytest.mark.parametrize("entry, key", [
    ({"version": 3, "global_Bps": "Infinity", "configured_Bps": 1e6}, "global_Bps"),
    ({"version": 3, "global_Bps": "NaN", "configured_Bps": 1e6}, "global_Bps"),
    ({"version": 3, "global_Bps": -5e6, "configured_Bps": 1e6}, "global_Bps"),
    ({"version": 3, "global_Bps": 1e300, "configured_Bps": 1e6}, "global_Bps"),
    ({"version": 2**64, "global_Bps": 1e6, "configured_Bps": 1e6}, "version"),
    ({"version": -1, "global_Bps": 1e6, "configured_Bps": 1e6}, "version"),
    ({"version": 1.5, "global_Bps": 1e6, "configured_Bps": 1e6}, "version"),
    ({"version": 3, "global_Bps": 1e6, "configured_Bps": "NaN"}, "configured_Bps"),
    ({"version": 3, "global_Bps": 1e6, "configured_Bps": "1e6"}, "configured_Bps"),
])
def test_an_absurd_limits_file_refuses_the_start_naming_file_class_and_key(tmp_path, entry, key):
    path = tmp_path / "limits-a.json"
    text = json.dumps({"gold": entry}).replace('"Infinity"', "Infinity").replace('"NaN"', "NaN")
    path.write_text(text)
    with pytest.raises(LimitBookError) as err:
        LimitBook(path)
    msg = str(err.value)
    assert msg.startswith(f"limits file {path}: class 'gold': {key}") and "remove" in msg and "\n" not in msg
