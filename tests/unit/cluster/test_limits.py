"""agent/cluster/limits.py: versioned global limits, newest wins, kept across restarts."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

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
