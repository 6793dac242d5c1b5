"""Shadow mode from the flag and the file to the datapath and the status.

The kernel side (a would-be drop counted and passed) is tests/kernel/test_shadow.py.
"""
from __future__ import annotations

import time

import pytest

from drl.agent.config.build import ConfigError
from daemon_harness import TWO, FakeDatapath, agent, config, file_agent


def written(dp, class_id: int) -> bool:
    return dp.classes[class_id][1]["shadow"]


def test_the_flag_puts_every_class_in_shadow_and_the_status_says_so(tmp_path):
    dp = FakeDatapath()
    with agent(config(tmp_path, "--global", "10mbit", "--shadow"), dp) as a:
        assert written(dp, 0)                # from the first write, before any tick
        a.tick(time.monotonic())
        assert written(dp, 0)
        st = a.status()
    assert st["shadow"] is True and st["classes"][0]["shadow"] is True


def test_without_the_flag_nothing_is_in_shadow(tmp_path):
    dp = FakeDatapath()
    with agent(config(tmp_path, "--global", "10mbit"), dp) as a:
        a.tick(time.monotonic())
        assert not written(dp, 0) and a.status()["shadow"] is False


def test_a_reload_flips_one_class_in_place(tmp_path):
    dp = FakeDatapath()
    a, path = file_agent(tmp_path, TWO.replace('name = "A"\n', 'name = "A"\nshadow = true\n'), dp)
    with a:
        a.tick(time.monotonic())
        assert written(dp, 0) and not written(dp, 1)
        run, resets = a.table.get("A"), list(dp.resets)
        path.write_text(TWO)
        assert a.reload() == {"ok": True, "added": (), "changed": ("A",), "removed": ()}
        # the same run, slot, allocator state and (in the kernel) bucket: nothing reset
        assert a.table.get("A") is run and run.class_id == 0 and dp.resets == resets
        a.tick(time.monotonic() + 1)
        assert not written(dp, 0)
        assert [c["shadow"] for c in a.status()["classes"]] == [False, False]


def test_agent_table_shadow_is_every_class_default(tmp_path):
    dp = FakeDatapath()
    a, _ = file_agent(tmp_path, TWO.replace('allocator = "static"\n', 'allocator = "static"\nshadow = true\n'), dp)
    with a:
        assert written(dp, 0) and written(dp, 1)


def test_shadow_must_be_a_boolean(tmp_path):
    with pytest.raises(ConfigError, match=r"drl\.toml:\d+: class 'A': shadow: expected true or false"):
        file_agent(tmp_path, TWO.replace('name = "A"\n', 'name = "A"\nshadow = "yes"\n'), FakeDatapath())
