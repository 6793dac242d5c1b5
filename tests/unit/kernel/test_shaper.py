"""Shape mode: the pure parts of agent/kernel/shaper.py, the option from the flag
and the file, and what the agent hands the shaper and the datapath.

The kernel side (HTB steered by skb->priority, rates, restoring the root qdisc) is
tests/kernel/test_shape.py.
"""
from __future__ import annotations

import time

import pytest

from drl.agent.config.build import SHAPE_DEFAULT_MAX, ConfigError, build_classes
from drl.agent.config.schema import defaults
from drl.agent.service.daemon import Agent
from drl.agent.model import SLOW_START_Bps
from drl.agent.burst import SHAPE_FLOOR, mode_depth
from drl.agent.kernel.shaper import (HTB_MAJOR, MAX_SHAPED_ID, Shaper, ShaperError, handle, leaf_handle,
                              needs_update, queue_limit, shape_rate)
from drl.cli.agent import load_config, up
from drl.agent.kernel.fake import FakeShaper

from daemon_harness import TWO, FakeDatapath, MemoryTransport, config


# -- pure parts --------------------------------------------------------------------------

def test_handle_is_tc_h_make_of_our_major_and_the_slot_plus_one():
    assert handle(0) == 0xD1D1_0001 and handle(41) == 0xD1D1_002A
    assert handle(0) >> 16 == HTB_MAJOR
    assert leaf_handle(0) == 0x0001_0000 and leaf_handle(41) == 0x002A_0000
    assert handle(MAX_SHAPED_ID) & 0xFFFF == 0x7FFF          # never the default class ffff
    for bad in (-1, MAX_SHAPED_ID + 1, 0xFFFF):
        with pytest.raises(ShaperError, match="cannot be shaped"):
            handle(bad)


def test_rate_never_goes_below_police_modes_slow_start_floor():
    assert shape_rate(0) == SLOW_START_Bps
    assert shape_rate(SLOW_START_Bps / 2) == SLOW_START_Bps
    assert shape_rate(1.25e6) == 1_250_000


def test_a_rate_is_rewritten_when_it_falls_by_a_tenth_of_a_percent_or_rises_by_one():
    assert needs_update(None, 1_000_000)                      # no HTB class yet
    assert not needs_update(1_000_000, 1_000_000)
    assert not needs_update(1_000_000, 1_010_000) and not needs_update(1_000_000, 999_000)
    assert needs_update(1_000_000, 1_010_001) and needs_update(1_000_000, 998_999)
    assert needs_update(SLOW_START_Bps, 1_000_000)


def test_burst_is_4ms_of_the_rate_but_at_least_a_gso_skb_and_the_queue_20ms_more():
    assert mode_depth(1.25e6, "shape") == SHAPE_FLOOR == 64 * 1024 + 1514       # 10 Mbit/s: 5 kB in 4 ms
    assert mode_depth(125e6, "shape") == 500_000                                 # 1 Gbit/s
    assert queue_limit(2.5e6, SHAPE_FLOOR) == 50_000 + SHAPE_FLOOR               # 20 Mbit/s: 47 ms (tbf's 77)
    assert queue_limit(125e6, 500_000) == 2_500_000 + 500_000                    # 1 Gbit/s: 24 ms


# -- the option --------------------------------------------------------------------------

def test_the_flag_sets_every_class_and_shape_is_the_default_where_a_class_matches_all(tmp_path):
    assert config(tmp_path, "--global", "10mbit").classes[0].enforce == "shape"
    assert config(tmp_path, "--global", "10mbit", "--class", "all").classes[0].enforce == "shape"
    assert config(tmp_path, "--global", "10mbit", "--enforce", "police").classes[0].enforce == "police"
    assert config(tmp_path, "--global", "10mbit", "--class", "proto=udp", "--enforce", "shape").classes[0].enforce \
        == "shape"


def test_the_default_polices_grd_quotas_traffic_outside_every_class_and_many_classes(tmp_path):
    assert config(tmp_path, "--global", "10mbit", "--allocator", "grd").classes[0].enforce == "police"
    assert config(tmp_path, "--global", "10mbit", "--allocator", "dqmp", "--quota", "1GB/1d").classes[0].enforce \
        == "police"
    # only UDP is limited: everything else would go through HTB for nothing
    assert config(tmp_path, "--global", "10mbit", "--class", "proto=udp").classes[0].enforce == "police"
    opts = {**defaults(), "iface": "lo", "node_id": "a"}
    few = [{**opts, "name": f"c{i}", "global_Bps": 1e6, "class_specs": () if i == 0 else (f"dst=10.0.{i}.0/24",)}
           for i in range(SHAPE_DEFAULT_MAX)]
    assert {c.enforce for c in build_classes(opts, few, (), 4096)} == {"shape"}
    many = few + [{**few[1], "name": "one-more", "class_specs": ("dst=10.1.0.0/24",)},
                  {**few[1], "name": "asks", "class_specs": ("dst=10.2.0.0/24",), "enforce": "shape"}]
    assert [c.enforce for c in build_classes(opts, many, (), 4096)][-3:] == ["police", "police", "shape"]
    # the default is never refused; an explicit shape is, in one line
    mixed = [{**few[0], "allocator": "grd"}, few[1]]
    assert [c.enforce for c in build_classes(opts, mixed, (), 4096)] == ["police", "shape"]


def test_random_drop_and_quota_classes_cannot_be_shaped(tmp_path):
    with pytest.raises(ConfigError, match="enforce = shape cannot enforce random drop"):
        config(tmp_path, "--global", "10mbit", "--allocator", "grd", "--enforce", "shape")
    with pytest.raises(ConfigError, match="enforce = shape cannot enforce a volume quota"):
        config(tmp_path, "--global", "10mbit", "--allocator", "dqmp", "--quota", "1GB/1d", "--enforce", "shape")


def file_agent(tmp_path, text, dp, sh, *flags):
    path = tmp_path / "drl.toml"
    path.write_text(text)
    opts = up.make_context("up", ["--config", str(path), "--socket", str(tmp_path / "ctl.sock"),
                                  "--state-dir", str(tmp_path / "state"), *flags]).params
    opts.pop("config")
    explicit = {"socket_path", "state_dir"} | ({"enforce"} if flags else set())
    cfg = load_config(str(path), opts, explicit, check_host=False)
    return Agent(cfg, transport=MemoryTransport, datapath=lambda cfg, port: dp, shaper=lambda cfg: sh), path


SHAPE_A = TWO.replace('name = "A"\n', 'name = "A"\nenforce = "shape"\n')


def test_a_shaped_class_gets_its_htb_class_and_priority_and_a_policed_one_none(tmp_path):
    dp, sh = FakeDatapath(), FakeShaper()
    a, _ = file_agent(tmp_path, SHAPE_A, dp, sh)
    with a:
        a.tick(time.monotonic())
        assert dp.classes[0][1]["shape_prio"] == handle(0) and dp.classes[1][1]["shape_prio"] == 0
        assert sh.rates == {0: dp.classes[0][1]["rate_Bps"]}      # the local limit is the HTB rate
        assert [c["enforce"] for c in a.status()["classes"]] == ["shape", "police"]
    assert sh.closed


def test_the_flag_overrides_the_file_and_shadow_wins_over_shape(tmp_path):
    dp, sh = FakeDatapath(), FakeShaper()
    a, _ = file_agent(tmp_path, SHAPE_A.replace('name = "B"\n', 'name = "B"\nshadow = true\n'), dp, sh,
                      "--enforce", "police")
    with a:
        a.tick(time.monotonic())
        assert sh.rates == {} and dp.classes[0][1]["shape_prio"] == 0
    dp, sh = FakeDatapath(), FakeShaper()
    a, _ = file_agent(tmp_path, TWO.replace('name = "B"\n', 'name = "B"\nshadow = true\n'), dp, sh,
                      "--enforce", "shape")
    with a:
        a.tick(time.monotonic())
        assert sh.rates.keys() == {0}                               # B is in shadow: counted, not shaped
        assert dp.classes[1][1]["shape_prio"] == 0 and dp.classes[1][1]["shadow"] is True


def test_a_reload_back_to_police_or_removing_the_class_removes_its_htb_class(tmp_path):
    dp, sh = FakeDatapath(), FakeShaper()
    a, path = file_agent(tmp_path, SHAPE_A, dp, sh)
    with a:
        a.tick(time.monotonic())
        assert sh.rates.keys() == {0}
        path.write_text(TWO)
        assert a.reload()["changed"] == ("A",)
        a.tick(time.monotonic() + 1)
        assert sh.rates == {} and dp.classes[0][1]["shape_prio"] == 0
        path.write_text(SHAPE_A)
        a.reload()
        a.tick(time.monotonic() + 2)
        assert sh.rates.keys() == {0}
        path.write_text(TWO[:TWO.index("[[class]]")] + TWO[TWO.index('[[class]]\nname = "B"'):])
        assert a.reload()["removed"] == ("A",)
        assert sh.rates == {}


class RecordingShaper(Shaper):
    """The Shaper's bookkeeping with the netlink writes recorded instead of sent."""

    def __init__(self):
        super().__init__("eth0")
        self.writes: list[tuple[int, int, str]] = []
        self.bursts: list[int] = []
        self.detaches = 0

    def _attach(self):
        self._previous = {"kind": "noqueue", "handle": 0, "options": ""}

    def _write_class(self, class_id, rate, burst):
        self.writes.append((class_id, rate, "write"))
        self.bursts.append(burst)

    def _delete_class(self, class_id):
        self.writes.append((class_id, 0, "del-class"))

    def detach(self):
        self.detaches += 1
        self._previous = None
        self._rates.clear()


def test_the_shaper_writes_a_class_once_then_on_any_fall_and_a_rise_above_one_percent():
    sh = RecordingShaper()
    assert sh.set_rate(3, 1_000_000) == handle(3)
    assert sh.set_rate(3, 1_009_000) == handle(3) and sh.set_rate(3, 999_500) == handle(3)
    sh.set_rate(3, 995_000)                 # below the limit written: the host would pass more than its limit
    sh.set_rate(3, 1_004_000)               # above, by less than 1 %: the host passes a little less
    sh.set_rate(3, 1_020_000)
    sh.set_rate(3, 0)
    assert sh.writes == [(3, 1_000_000, "write"), (3, 995_000, "write"), (3, 1_020_000, "write"),
                         (3, SLOW_START_Bps, "write")]
    assert sh.rates == {3: SLOW_START_Bps} and sh.bursts == [SHAPE_FLOOR] * 4
    sh.discard(3)
    assert sh.writes[-1] == (3, 0, "del-class")
    assert sh.rates == {} and sh._previous is None        # the last class takes the tree with it


def test_the_shaper_writes_a_burst_given_and_again_when_it_moves_above_one_percent():
    sh = RecordingShaper()
    sh.set_rate(3, 1_000_000, burst_bytes=200_000)
    sh.set_rate(3, 1_000_000, burst_bytes=201_000)
    sh.set_rate(3, 1_000_000, burst_bytes=210_000)
    assert sh.bursts == [200_000, 210_000]


def test_a_slot_that_cannot_be_shaped_gets_priority_0_so_it_is_policed():
    sh = RecordingShaper()
    assert sh.set_rate(MAX_SHAPED_ID + 1, 1e6) == 0 and sh.set_rate(MAX_SHAPED_ID + 1, 1e6) == 0
    assert sh.writes == []


def test_a_failed_agent_leaves_its_htb_for_the_next_one_and_a_stop_puts_the_root_back():
    failed, stopped = RecordingShaper(), RecordingShaper()
    for sh in (failed, stopped):
        sh.set_rate(3, 1_000_000)
    failed.close(detach=False)
    stopped.close()
    assert (failed.detaches, stopped.detaches) == (0, 1)
