"""agent/cluster/limits.py: versioned global limits, newest wins, kept across restarts.

Most tests run the book on a clock stopped at 0 ms, where a change is simply one more."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from drl.agent import units
from drl.agent.cluster.limits import MAX_AHEAD_MS, Limit, LimitBook, LimitBookError


def stopped(ms: int = 0):
    return lambda: ms


def test_config_value_is_version_0_and_a_changed_file_is_a_new_version():
    book = LimitBook(clock=stopped())
    assert book.configure("gold", 1e6) == Limit(0, 1e6)
    assert book.configure("gold", 1e6) == Limit(0, 1e6)
    assert book.configure("gold", 2e6) == Limit(1, 2e6)


def test_a_live_set_survives_a_reload_of_an_unchanged_file_but_not_a_changed_one():
    book = LimitBook(clock=stopped())
    book.configure("gold", 1e6)
    assert book.set("gold", 5e6) == Limit(1, 5e6)
    assert book.configure("gold", 1e6) == Limit(1, 5e6)
    assert book.configure("gold", 3e6) == Limit(2, 3e6)


def test_merge_adopts_only_newer_limits():
    book = LimitBook(clock=stopped())
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
    book = LimitBook(path, clock=stopped())
    book.configure("gold", 1e6)
    book.set("gold", 7e6)
    book.save()
    again = LimitBook(path, clock=stopped())
    assert again.configure("gold", 1e6) == Limit(1, 7e6)   # same file: the live set stays


def test_an_unreadable_book_is_one_line(tmp_path):
    path = tmp_path / "limits.json"
    path.write_text("{not json")
    with pytest.raises(LimitBookError, match="remove it"):
        LimitBook(path, clock=stopped())


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
    books = [LimitBook(clock=stopped()) for _ in range(3)]
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


@pytest.mark.parametrize("rate", [float("inf"), float("nan"), 0.0, -1e6, 1e300])
def test_set_and_configure_refuse_an_absurd_rate_and_store_nothing(tmp_path, rate):
    book = LimitBook(tmp_path / "limits.json", clock=stopped())
    book.configure("gold", 1e6)
    with pytest.raises(LimitBookError, match="class 'gold': global_Bps"):
        book.set("gold", rate)
    with pytest.raises(LimitBookError, match="class 'gold': global_Bps"):
        book.configure("gold", rate)
    assert book.get("gold") == Limit(0, 1e6)
    book.save()
    assert LimitBook(tmp_path / "limits.json", clock=stopped()).get("gold") == Limit(0, 1e6)


NOW = 1_796_000_000_000         # ms since the epoch: December 2026


def test_a_change_takes_the_time_it_was_made_unless_a_newer_version_is_held():
    clock = [NOW]
    book = LimitBook(clock=lambda: clock[0])
    assert book.configure("gold", 1e6) == Limit(0, 1e6)          # the file's first value
    assert book.set("gold", 2e6) == Limit(NOW, 2e6)
    assert book.set("gold", 3e6) == Limit(NOW + 1, 3e6)          # twice in a millisecond: one more
    clock[0] = NOW + 5000
    assert book.configure("gold", 4e6) == Limit(NOW + 5000, 4e6)
    assert book.merge("gold", Limit(NOW + 30_000, 5e6))          # a peer's, within the bound
    assert book.set("gold", 6e6) == Limit(NOW + 30_001, 6e6)     # ... which a set beats at once


def test_old_small_versions_stay_valid_and_any_new_change_beats_them(tmp_path):
    path = tmp_path / "limits.json"
    path.write_text(json.dumps({"gold": {"version": 3, "global_Bps": 7e6, "configured_Bps": 1e6}}))
    book = LimitBook(path, clock=stopped(NOW))
    assert book.configure("gold", 1e6) == Limit(3, 7e6)           # the live set of old stays
    assert book.merge("gold", Limit(4, 8e6))                       # old peers still agree among themselves
    assert book.set("gold", 2e6) == Limit(NOW, 2e6)


@pytest.mark.parametrize("version", [NOW + MAX_AHEAD_MS + 1, NOW + 3_600_000, units.MAX_VERSION - 2,
                                     units.MAX_VERSION - 1, units.MAX_VERSION, 2**64 - 1, 2**64, -1])
def test_a_version_beyond_the_clock_bound_or_out_of_range_is_never_adopted(version):
    """A forged note at 2^63 - 3 was adopted for good, and the next set could not follow it."""
    book = LimitBook(clock=stopped(NOW))
    book.configure("gold", 1e6)
    assert not book.merge("gold", Limit(version, 1.25e11))
    assert book.ahead_ms(version) > 0 or version < 0
    assert book.get("gold") == Limit(0, 1e6)
    assert book.set("gold", 2e6) == Limit(NOW, 2e6)


def test_the_bound_is_inclusive_and_equal_versions_take_the_higher_rate():
    book = LimitBook(clock=stopped(NOW))
    book.configure("gold", 1e6)
    edge = NOW + MAX_AHEAD_MS
    assert book.ahead_ms(edge) == 0 and book.merge("gold", Limit(edge, 2e6))
    assert not book.merge("gold", Limit(edge, 1e6)) and book.merge("gold", Limit(edge, 3e6))
    assert not book.merge("gold", Limit(edge, 3e6))


@pytest.mark.parametrize("rate", [float("inf"), float("nan"), 0.0, -1e6, 1e300])
def test_merge_refuses_an_absurd_rate_at_any_version(rate):
    book = LimitBook(clock=stopped(NOW))
    book.configure("gold", 1e6)
    assert not book.merge("gold", Limit(NOW, rate))
    assert book.get("gold") == Limit(0, 1e6)


def test_a_stored_version_beyond_the_bound_is_dropped_at_start_and_the_class_can_change_again(tmp_path):
    """The incident's state dir: a forged 2^63 - 3 adopted and saved; the class restarts from its
    config value at version 0, and the next set wins."""
    path = tmp_path / "limits.json"
    path.write_text(json.dumps({"gold": {"version": units.MAX_VERSION - 2, "global_Bps": 1.25e11,
                                         "configured_Bps": 1e6},
                                "silver": {"version": NOW - 5, "global_Bps": 3e6, "configured_Bps": 1e6}}))
    book = LimitBook(path, clock=stopped(NOW))
    assert book.configure("gold", 1e6) == Limit(0, 1e6)
    assert book.configure("silver", 1e6) == Limit(NOW - 5, 3e6)
    assert book.set("gold", 2e6) == Limit(NOW, 2e6)
    book.save()
    assert LimitBook(path, clock=stopped(NOW)).get("gold") == Limit(NOW, 2e6)


@given(st.lists(st.tuples(st.integers(0, 2**64), st.sampled_from([1e6, 2e6, 3e6])), max_size=20))
def test_whatever_peers_announce_a_set_wins_on_every_agent(forged):
    books = [LimitBook(clock=stopped(NOW)) for _ in range(3)]
    for book in books:
        book.configure("c", 1e6)
        for limit in forged:
            book.merge("c", Limit(*limit))
    mine = books[0].set("c", 5e6)
    assert all(book.merge("c", mine) for book in books[1:])
    assert {book.get("c") for book in books} == {mine}


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
        LimitBook(path, clock=stopped())
    msg = str(err.value)
    assert msg.startswith(f"limits file {path}: class 'gold': {key}") and "remove" in msg and "\n" not in msg
