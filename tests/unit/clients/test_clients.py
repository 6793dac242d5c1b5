"""Per-client throttle and ban, the pure core (agent/clients/): rule parsing, the sliding
window counter against an exact window, the cross-host merge, bans, and the report's size."""
from __future__ import annotations

import ipaddress
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drl.agent.clients import table as clients
from drl.agent.clients.reports import MAX_BAN_NOTES, REPORT_K, BanNote, ClientReport, report_bytes
from drl.agent.clients.rules import (ClientKey, ClientRuleError, client_rule, parse_client_key, parse_prefix,
                                     parse_threshold)
from drl.agent.clients.table import ClientTable, throttle_share
from drl.agent.clients.windows import Windows, sliding_count
from drl.agent.gossip import drl_pb2
from drl.agent.gossip.wire import MAX_DATAGRAM, Batch, ClassClients, Header, Message, _fill_report, encode

net = ipaddress.ip_network


def ip(text: str) -> bytes:
    """A client as the tables key it: the packed network address."""
    return net(text).network_address.packed


V4_64 = (32, 64)          # the key lengths of rule()'s dst/32


def rule(key="dst/32", measure=None, threshold="2mbit", action=None, ban_duration_s=None, exempt=()):
    return client_rule(parse_client_key(key) if key else None, measure,
                       parse_threshold(threshold) if threshold else None, action, ban_duration_s,
                       [parse_prefix(p) for p in exempt])


# -- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("dst/32", ClientKey("dst", 32, 64)),
    ("dst/24", ClientKey("dst", 24, 64)),
    ("dst/64", ClientKey("dst", 32, 64)),
    ("dst/128", ClientKey("dst", 32, 128)),
    ("src/32", ClientKey("src", 32, 64)),
    ("dst/24/56", ClientKey("dst", 24, 56)),
    ("dst/0/0", ClientKey("dst", 0, 0)),
    (" dst/16 ", ClientKey("dst", 16, 64)),
])
def test_client_keys(text, expected):
    key = parse_client_key(text)
    assert key == expected
    assert parse_client_key(str(key)) == key


def test_a_key_maps_addresses_to_their_client_prefix():
    key = parse_client_key("dst/24/56")
    assert key.client_of("198.51.100.77") == ip("198.51.100.0")
    assert key.network(key.client_of("2001:db8:1:2ff::9")) == net("2001:db8:1:200::/56")
    assert key.owns(ip("198.51.100.0")) and not key.owns(ip("198.51.100.1")) and not key.owns(b"\0" * 5)


@pytest.mark.parametrize("text,unit,count,window_s", [
    ("2mbit", "rate", 250_000, 1.0),
    ("10MBps", "rate", 10_000_000, 1.0),
    ("2000/1200s", "count", 2000, 1200.0),
    ("2000/1s", "count", 2000, 1.0),
    ("2000/20m", "count", 2000, 1200.0),
    ("250KB/1s", "size", 250_000, 1.0),
    ("1MiB / 10s", "size", 1024**2, 10.0),
])
def test_thresholds(text, unit, count, window_s):
    t = parse_threshold(text)
    assert (t.kind, t.count, t.window_s) == (unit, count, window_s)
    assert t.per_s == count / window_s


@pytest.mark.parametrize("parse,text,message", [
    (parse_client_key, "dst", "write dst/LEN or dst/LEN4/LEN6"),
    (parse_client_key, "dst/x", "write dst/LEN"),
    (parse_client_key, "peer/32", "the client is 'dst'"),
    (parse_client_key, "dst/129", "an IPv6 prefix length is at most 128"),
    (parse_client_key, "dst/33/64", "an IPv4 prefix length is at most 32 (the first length is IPv4's)"),
    (parse_client_key, "dst/24/129", "an IPv6 prefix length is at most 128"),
    (parse_threshold, "2000", "give a rate ('2mbit') or COUNT/WINDOW"),
    (parse_threshold, "2mbps", "ambiguous rate unit"),
    (parse_threshold, "2furlongs", "unknown rate unit"),
    (parse_threshold, "0mbit", "rate '0mbit' is below the floor of 8 kbit/s"),
    (parse_threshold, "2000/0s", "the window must be longer than 0"),
    (parse_threshold, "2000/soon", "not a duration"),
    (parse_threshold, "2000/1y", "unknown duration unit"),
    (parse_threshold, "0/1s", "the count must be a whole number above 0"),
    (parse_threshold, "20.5/1s", "the count must be a whole number above 0"),
    (parse_threshold, "2XB/1s", "unknown size unit"),
    (parse_threshold, "0KB/1s", "the size must be above 0"),
    (parse_prefix, "10.0.0.0/33", "is not an address or prefix"),
])
def test_parse_errors_are_one_line(parse, text, message):
    with pytest.raises(ClientRuleError, match=re.escape(message)) as e:
        parse(text)
    assert "\n" not in str(e.value) and repr(text.strip())[1:-1] in str(e.value)


def test_a_rule_with_defaults():
    r = rule()
    assert (r.measure, r.action, r.ban_duration_s, r.limit, r.window_s) == ("bytes", "throttle", 0.0, 250_000, 1.0)
    assert rule(key=None, threshold=None) is None
    banned = rule(measure="conns", threshold="2000/1200s", action="ban", ban_duration_s=3600.0,
                  exempt=["10.0.0.0/8", "10.0.0.0/8", "fd00::/8"])
    assert banned.exempt == (net("10.0.0.0/8"), net("fd00::/8"))
    assert banned.is_exempt(ip("10.1.2.3")) and not banned.is_exempt(ip("11.1.2.3"))
    wide = client_rule(parse_client_key("dst/7"), threshold=parse_threshold("1mbit"), exempt=banned.exempt)
    assert not wide.is_exempt(ip("10.0.0.0"))        # only partly exempt: the kernel checks each address
    assert rule(measure="packets", threshold="2000/1s").limit == 2000


@pytest.mark.parametrize("kwargs,message", [
    (dict(key=None, threshold="2mbit"), "client threshold given without a client key"),
    (dict(key=None, threshold=None, exempt=["10.0.0.0/8"]), "client exempt given without a client key"),
    (dict(key=None, threshold=None, ban_duration_s=0.0), "client ban_duration given without"),
    (dict(threshold=None), "client key dst/32/64: needs a threshold"),
    (dict(measure="requests"), "client measure 'requests': use bytes, packets, conns"),
    (dict(action="block"), "client action 'block': use throttle or ban"),
    (dict(threshold="2000/1200s"), "measure 'bytes': threshold '2000/1200s' has no size unit"),
    (dict(measure="packets"), "measure 'packets' counts packets: threshold '2mbit' is bytes; write COUNT/WINDOW"),
    (dict(measure="conns", threshold="2MB/1s"), "measure 'conns' counts new connections: threshold '2MB/1s' is bytes"),
    (dict(ban_duration_s=60.0), "ban_duration applies to action = \"ban\", not throttle"),
    (dict(action="ban", ban_duration_s=-1.0), "ban_duration must be 0 s or more"),
])
def test_rule_errors_are_one_line(kwargs, message):
    with pytest.raises(ClientRuleError, match=re.escape(message)) as e:
        rule(**kwargs)
    assert "\n" not in str(e.value)


def test_a_window_holds_at_least_one_interval():
    rule(threshold="2000/1s", measure="packets").check_interval(0.1)
    with pytest.raises(ClientRuleError, match=r"the window \(0.05 s\) is shorter than the interval \(0.1 s\)"):
        rule(threshold="100/50ms", measure="packets").check_interval(0.1)


# -- sliding window -----------------------------------------------------------------------


def test_the_sliding_count_of_the_example():
    """[RLDesign] "Sliding window counter algorithm": 5 before, 3 now, 30 % in: 6.5."""
    assert sliding_count(5, 3, 18.0, 60.0) == pytest.approx(6.5)


def exact_count(intervals: list[tuple[float, float, float]], now_s: float, window_s: float) -> float:
    """Brute force: each interval's count spread evenly over it, summed over (now - W, now]."""
    total = 0.0
    for start, end, amount in intervals:
        overlap = min(end, now_s) - max(start, now_s - window_s)
        if overlap > 0:
            total += amount * overlap / (end - start)
    return total


traces = st.lists(st.tuples(st.floats(0.01, 0.7), st.floats(0.0, 1000.0)), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(trace=traces, window_s=st.floats(0.2, 3.0), start_s=st.floats(0.0, 50.0))
def test_the_sliding_counter_stays_within_its_bound_of_the_exact_window(trace, window_s, start_s):
    """Estimate - exact lies in [-prev (1 - alpha), prev alpha] (sliding_count's docstring)."""
    w, t, seen = Windows(window_s, start_s), start_s, []
    for length_s, amount in trace:
        w.add(t + length_s, {"c": amount})
        seen.append((t, t + length_s, amount))
        t += length_s
        index = math.floor(t / window_s)
        alpha = 1.0 - (t - index * window_s) / window_s
        prev = exact_count(seen, index * window_s, window_s)      # the whole previous fixed window
        error = w.count("c", t) - exact_count(seen, t, window_s)
        slack = 1e-9 * (1 + sum(a for *_, a in seen))
        assert -prev * (1 - alpha) - slack <= error <= prev * alpha + slack


@given(rate=st.floats(1.0, 1e9), ticks_per_window=st.integers(1, 20), n=st.integers(1, 80))
def test_a_steady_rate_is_counted_exactly(rate, ticks_per_window, n):
    interval_s = 0.1
    w = Windows(ticks_per_window * interval_s, 0.0)
    for k in range(1, n + 1):
        w.add(k * interval_s, {"c": rate * interval_s})
    assert w.count("c", n * interval_s) == pytest.approx(rate * min(n, ticks_per_window) * interval_s, rel=1e-9)


def test_quiet_clients_are_forgotten_and_counts_fade():
    w = Windows(1.0, 0.0)
    w.add(0.5, {"a": 10.0, "b": 10.0})
    w.add(1.5, {"a": 10.0})
    # the previous window weighted by the half still covered (exactly 0: b's 10 fell in 0-0.5)
    assert w.count("b", 1.5) == pytest.approx(10.0 * 0.5)
    w.add(2.5, {"a": 10.0})
    assert len(w) == 1 and w.count("b", 2.5) == 0.0
    w.clear("a")
    assert w.count("a", 2.5) == 0.0


# -- throttle ---------------------------------------------------------------------------------


@given(demands=st.lists(st.floats(0.0, 1e9), min_size=1, max_size=50), limit=st.floats(1.0, 1e10))
def test_local_shares_add_up_to_the_threshold(demands, limit):
    total = sum(demands)
    shares = [throttle_share(limit, d, total, len(demands)) for d in demands]
    assert sum(shares) == pytest.approx(limit, rel=1e-9)
    assert min(shares) >= clients.FLOOR_FRACTION * limit / len(demands) * (1 - 1e-12)


def hosts(r, names=("a", "b", "c"), max_age_s=0.35):
    return {n: ClientTable(r, max_age_s, 0.0, node_id=n) for n in names}


def tick_all(tables, now_s, deltas):
    """Every host ticks, then every report reaches every other host before the next tick."""
    ticks = {n: t.tick(now_s, deltas.get(n, {}), len(tables)) for n, t in tables.items()}
    for sender, tick in ticks.items():
        for name, table in tables.items():
            if name != sender:
                assert table.receive(sender, tick.report, now_s) == 0
    return ticks


HEAVY = ip("198.51.100.1")
LIGHT = [ip(f"198.51.100.{i}") for i in range(10, 29)]


def test_a_client_spread_over_three_hosts_gets_its_threshold_in_total():
    """2 Mbit/s threshold; the heavy client pulls 2 Mbit/s from each of 3 hosts (3x), 19 light
    clients 0.1 Mbit/s from one host each (under the line, threshold/12)."""
    r, interval_s = rule(), 0.1
    tables = hosts(r)
    per_tick = r.limit * interval_s                               # 2 Mbit/s for one interval
    for k in range(1, 31):
        deltas = {n: {HEAVY: per_tick} for n in tables}
        for i, c in enumerate(LIGHT):
            deltas["abc"[i % 3]][c] = 0.05 * per_tick
        ticks = tick_all(tables, k * interval_s, deltas)
    assert sum(t.limits[HEAVY] for t in ticks.values()) == pytest.approx(r.limit)
    assert all(t.limits[HEAVY] == pytest.approx(r.limit / 3) for t in ticks.values())
    assert all(set(t.limits) == {HEAVY} for t in ticks.values())
    row = tables["a"].rows(3.0)[0]
    assert (row.client, row.state, row.hosts) == (net("198.51.100.1/32"), "throttled", ("a", "b", "c"))
    assert row.global_count == pytest.approx(3 * r.limit) and row.local_count == pytest.approx(r.limit)


def test_uneven_demand_is_split_by_demand_and_released_below_the_threshold():
    r, interval_s = rule(), 0.1
    tables = hosts(r)
    per_tick = r.limit * interval_s
    split = {"a": 1.5, "b": 0.5, "c": 0.0}
    for k in range(1, 21):
        ticks = tick_all(tables, k * interval_s, {n: {HEAVY: f * per_tick} for n, f in split.items()})
    shares = {n: t.limits[HEAVY] for n, t in ticks.items()}
    assert sum(shares.values()) == pytest.approx(r.limit)
    floor = clients.FLOOR_FRACTION * r.limit / 3
    assert shares["c"] == pytest.approx(floor)
    assert shares["a"] == pytest.approx(floor + (r.limit - 3 * floor) * 0.75)
    for k in range(21, 41):        # down to 0.85 of the threshold: still throttled (no release at a dip)
        ticks = tick_all(tables, k * interval_s, {"a": {HEAVY: 0.85 * per_tick}})
    assert all(HEAVY in t.throttled for t in ticks.values() if t.limits) and ticks["a"].throttled
    for k in range(41, 61):        # down to 0.45: under the release line, still over the line at a
        ticks = tick_all(tables, k * interval_s, {"a": {HEAVY: 0.45 * per_tick}})
    assert all(not t.throttled for t in ticks.values())
    assert {n for n, t in ticks.items() if t.limits} == {"a"}


def counted_everywhere(tables, client, now_s):
    """The client's sliding count summed over every host's own counters: what one observer of
    all counters would know."""
    return sum(row.local_count for t in tables.values() for row in t.rows(now_s)
               if row.client == t.rule.key.network(client))


def ticks_to_limit(tables, deltas_at):
    """(tick at which the summed count crosses the threshold, tick from which every host limits)."""
    crossed = everywhere = None
    for k in range(1, 60):
        ticks = tick_all(tables, k * 0.1, deltas_at(k))
        over = counted_everywhere(tables, HEAVY, k * 0.1) >= next(iter(tables.values())).rule.limit
        crossed = crossed or (k if over else None)
        everywhere = everywhere or (k if all(HEAVY in t.throttled for t in ticks.values()) else None)
    return crossed, everywhere


def test_a_client_seen_above_the_line_everywhere_is_limited_one_tick_after_crossing():
    """The bound of the module docstring: every host holding the client at or above the reporting
    line, so every report is out on the crossing tick."""
    r = rule()
    tables = hosts(r)
    crossed, everywhere = ticks_to_limit(tables, lambda k: {n: {HEAVY: r.limit * 0.01 * k / 3} for n in tables})
    assert crossed and everywhere - crossed == 1


def test_a_client_partly_below_the_line_is_limited_two_ticks_after_crossing():
    """b and c hold it steadily below the line (threshold/12), then one burst at a takes it over:
    a reports on the crossing tick, b and c one tick later (a peer reports it), then all know."""
    r = rule()
    tables = hosts(r)
    steady = {"b": {HEAVY: 0.005 * r.limit}, "c": {HEAVY: 0.005 * r.limit}}
    crossed, everywhere = ticks_to_limit(tables, lambda k: {**steady, "a": {HEAVY: 0.95 * r.limit}} if k == 21
                                         else steady if k < 21 else {})
    assert crossed == 21 and everywhere == 23


def test_a_client_is_held_from_the_line_at_no_more_than_a_fair_share_until_peers_report():
    """Every host counts the client over the line at once: each holds it at threshold/N on
    that tick and the next (YOUNG_TICKS), so their shares never add up to more than the
    threshold however late their peers' reports come; a client below the line is not held."""
    r = rule()
    tables = hosts(r)
    line = tables["a"].line(3)
    alone = {n: t.tick(0.1, {HEAVY: 1.2 * line, LIGHT[0]: 0.9 * line}, 3) for n, t in tables.items()}
    assert all(t.limits == {HEAVY: pytest.approx(r.limit / 3)} and not t.throttled for t in alone.values())
    assert all(t.hold == pytest.approx(r.limit / 3) for t in alone.values())
    second = {n: t.tick(0.2, {HEAVY: 0.1 * line}, 3) for n, t in tables.items()}   # still no report
    assert all(t.limits[HEAVY] == pytest.approx(r.limit / 3) for t in second.values())
    third = {n: t.tick(0.3, {HEAVY: 0.1 * line}, 3) for n, t in tables.items()}
    assert all(t.limits[HEAVY] == pytest.approx(r.limit * (1 - 2 * clients.FLOOR_FRACTION / 3))
               for t in third.values())            # each alone as far as it knows: no longer young


def test_a_host_below_the_reporting_line_reports_a_client_that_others_report():
    r = rule()
    tables = hosts(r)
    deltas = {"a": {HEAVY: 0.2 * r.limit}, "b": {HEAVY: 0.01 * r.limit}}    # a above the line, b far below
    assert tick_all(tables, 0.1, deltas)["b"].report.counts == ()
    ticks = tick_all(tables, 0.2, deltas)
    assert [c for c, _ in ticks["b"].report.counts] == [HEAVY]
    tick_all(tables, 0.3, deltas)
    assert tables["c"].rows(0.3)[0].hosts == ("a", "b")


def test_the_report_is_the_top_k_above_half_a_fair_share():
    r = rule()
    table = ClientTable(r, 0.35, 0.0)
    line = clients.REPORT_FRACTION * r.limit / 4
    many = {ip(f"10.1.0.{i}"): line * (1 + i / 100) for i in range(100)}
    many[ip("10.9.0.1")] = line * 0.99
    report = table.tick(1.0, many, n_hosts=4).report
    assert len(report.counts) == REPORT_K
    assert [v for _, v in report.counts] == sorted((v for _, v in report.counts), reverse=True)
    assert report.counts[0][0] == ip("10.1.0.99")


def test_peer_reports_expire_and_bad_entries_are_ignored():
    r = rule(exempt=["10.0.0.0/8"])
    table = ClientTable(r, 0.35, 0.0)
    report = ClientReport(V4_64, ((HEAVY, r.limit), (b"\xc6\x33\x64", 1.0), (ip("10.0.0.1"), 1.0),
                                  (ip("198.51.100.2"), math.nan), (ip("198.51.100.3"), -1.0)))
    assert table.receive("b", report, 0.0) == 4
    assert table.receive("c", ClientReport((24, 64), ((HEAVY, r.limit),)), 0.0) == 1   # another key
    floor = clients.FLOOR_FRACTION * r.limit / 2                  # over the threshold, but not here
    assert table.tick(0.1, {}, 2).limits == {HEAVY: pytest.approx(floor)}
    assert table.tick(0.5, {}, 2).limits == {}          # b's report is 0.5 s old: it counts 0


def test_exempt_clients_are_never_counted():
    r = rule(exempt=["198.51.100.0/24"])
    table = ClientTable(r, 0.35, 0.0)
    tick = table.tick(0.1, {HEAVY: 10 * r.limit}, 1)
    assert tick.limits == {} and tick.report.counts == () and table.rows(0.1) == []


# -- bans -------------------------------------------------------------------------------------


def ban_rule(duration_s=60.0):
    return rule(measure="conns", threshold="100/10s", action="ban", ban_duration_s=duration_s)


def test_the_first_host_over_the_threshold_bans_and_the_ban_reaches_every_host():
    r = ban_rule()
    tables = hosts(r)
    ticks = tick_all(tables, 1.0, {n: {HEAVY: 34} for n in tables})    # 102 new flows in total
    assert all(not t.issued for t in ticks.values())                    # each host knows only its 34
    ticks = tick_all(tables, 1.1, {})
    assert all(t.issued == (HEAVY,) and t.bans == {HEAVY: 10.0 + 60.0} for t in ticks.values())
    ticks = tick_all(tables, 1.2, {n: {HEAVY: 1} for n in tables})     # banned traffic is not counted
    assert all(t.bans == {HEAVY: pytest.approx(70.0)} for t in ticks.values())
    assert all(not t.issued for t in ticks.values())
    row = tables["b"].rows(1.2)[0]
    assert (row.state, row.banned_until_s) == ("banned", pytest.approx(70.0))
    tick_all(tables, 69.9, {n: {HEAVY: 1} for n in tables})
    ticks = tick_all(tables, 70.0, {n: {HEAVY: 1} for n in tables})    # over: counted afresh
    assert all(t.bans == {} for t in ticks.values())
    row = tables["a"].rows(70.0)[0]
    assert (row.state, row.local_count) == ("ok", pytest.approx(1))
    tables["a"].receive("b", ClientReport(V4_64, bans=(BanNote(HEAVY, 1, 0.05),)), 70.0)    # late, drifted
    tables["a"].tick(70.1, {}, 3)
    assert tables["a"].rows(70.1)[0].local_count == pytest.approx(0.99)    # merged, not a new ban


def test_bans_of_one_version_merge_to_the_later_end():
    r = ban_rule()
    table = ClientTable(r, 0.35, 0.0)
    table.receive("b", ClientReport(V4_64, bans=(BanNote(HEAVY, 1, 50.0),)), 1.0)
    table.receive("c", ClientReport(V4_64, bans=(BanNote(HEAVY, 1, 80.0),)), 1.0)
    table.receive("b", ClientReport(V4_64, bans=(BanNote(HEAVY, 1, 20.0),)), 2.0)
    assert table.tick(2.0, {}, 3).bans == {HEAVY: 81.0}


def test_an_unban_is_a_tombstone_no_older_note_resurrects():
    r = ban_rule()
    a, b = ClientTable(r, 0.35, 0.0, "a"), ClientTable(r, 0.35, 0.0, "b")
    old = a.tick(1.0, {HEAVY: 200}, 2).report
    b.receive("a", old, 1.0)
    assert a.unban(net("198.51.100.0/24"), 2.0) == [net("198.51.100.1/32")]
    tomb = a.tick(2.0, {}, 2).report.bans
    assert tomb == (BanNote(HEAVY, 2, 68.0 + 0.35, lifted=True),)
    b.receive("a", ClientReport(V4_64, bans=tomb), 2.0)
    for table in (a, b):
        table.receive("x", old, 2.1)                # the old ban note, late
        assert table.tick(2.2, {}, 2).bans == {}
    again = a.tick(3.0, {HEAVY: 150}, 2)             # crosses again: a ban one version up
    assert again.issued == (HEAVY,) and again.report.bans[0].version == 3
    assert a.unban(net("203.0.113.0/24"), 3.0) == []


def test_an_unbanned_client_starts_from_zero_and_tombstones_expire():
    r = ban_rule(duration_s=0.0)
    table = ClientTable(r, 0.35, 0.0)
    table.tick(5.0, {HEAVY: 150}, 1)
    assert table.unban(net("198.51.100.1"), 5.5) == [net("198.51.100.1/32")]
    assert table.tick(6.0, {HEAVY: 50}, 1).bans == {}
    assert table.rows(6.0)[0].global_count == pytest.approx(50)
    table.tick(10.36, {}, 1)
    assert table.tick(10.4, {}, 1).report.bans == ()    # the tombstone outlived the ban by max_age_s


def test_every_ban_goes_round_in_the_reports():
    table = ClientTable(ban_rule(), 0.35, 0.0)
    many = {ip(f"203.0.113.{i}"): 200 for i in range(3 * MAX_BAN_NOTES)}
    table.tick(1.0, many, 1)
    sent = [n.client for k in range(3) for n in table.tick(1.1 + 0.1 * k, {}, 1).report.bans]
    assert sorted(sent) == sorted(many)


# -- the report's size --------------------------------------------------------------------


def encoded(report: ClientReport) -> bytes:
    """The report as agent/gossip/wire.py puts it on the wire (drl.proto ClientReport), key 2^32 - 1."""
    msg = drl_pb2.ClientReport()
    _fill_report(msg, ClassClients(2**32 - 1, report))
    return msg.SerializeToString()


clients_ = st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16))


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(st.tuples(clients_, st.floats(0, 2.0**40, width=32)), max_size=REPORT_K),
       bans=st.lists(st.tuples(clients_, st.integers(0, 2**64 - 1), st.floats(0, 2.0**20, width=32), st.booleans()),
                     max_size=MAX_BAN_NOTES),
       lengths=st.tuples(st.integers(0, 32), st.integers(0, 128)))
def test_report_bytes_is_the_real_encoded_size(entries, bans, lengths):
    report = ClientReport(lengths, tuple(entries), tuple(BanNote(*b) for b in bans))
    assert report_bytes(report) == len(encoded(report))


def framed(n_bytes: int) -> int:
    """A message as a field: tag, length varint, body."""
    return 1 + max(1, (n_bytes.bit_length() + 6) // 7) + n_bytes


def test_the_worst_report_fits_one_datagram_with_the_longest_header():
    """REPORT_K IPv6 /128 clients and MAX_BAN_NOTES IPv6 tombstones with 64-bit versions, in a
    ClientReports payload (Datagram oneof -> ClientReports.reports) behind a header with 64-char
    cluster and node ids, 64-bit seq and incarnation, and the HMAC tag."""
    worst = ClientReport((32, 128), tuple((ip(f"2001:db8::{i:x}"), 3.4e38) for i in range(REPORT_K)),
                         tuple(BanNote(ip(f"2001:db8::{i:x}"), 2**64 - 1, 86400.0, True)
                               for i in range(MAX_BAN_NOTES)))
    body = report_bytes(worst)
    assert body == len(encoded(worst)) == 887
    header = Header(cluster="c" * 64, node="n" * 64, dst="d" * 64, seq=2**64 - 1, sent_at=1.0,
                    incarnation=2**64 - 1, class_id=2**32 - 1)
    header_and_tag = len(encode(Message(header, Batch()), b"k" * 32)) - 2     # less the empty Batch field
    assert header_and_tag == 272
    assert header_and_tag + framed(framed(body)) == 1165 <= MAX_DATAGRAM
    ipv4 = ClientReport(V4_64, tuple((ip(f"198.51.100.{i}"), 1e6) for i in range(REPORT_K)))
    assert report_bytes(ipv4) == 5 + 2 + 2 + 2 * (3 + 4 * REPORT_K)    # 8 bytes a client
    ipv6 = ClientReport(V4_64, tuple((ip(f"2001:db8:0:{i:x}::"), 1e6) for i in range(REPORT_K)))
    assert report_bytes(ipv6) == 5 + 2 + 2 + (3 + 8 * REPORT_K) + (3 + 4 * REPORT_K)   # 12


# -- windows kept elsewhere (the kernel) --------------------------------------------------


class KernelModel:
    """What bpf/limiter.c does for one class, with Windows as its arithmetic: counts arrivals
    of clients not banned, flags a client once its count reaches the line, starts a client
    over when the agent resets it."""

    def __init__(self, window_s: float):
        self.windows, self.bans, self.line = Windows(window_s, 0.0), {}, 0.0
        self.flagged: set = set()

    def arrive(self, now_s: float, deltas: dict) -> None:
        # an interval's arrivals as if at its end, as tick's deltas are taken
        self.windows.add(now_s, {c: d for c, d in deltas.items() if self.bans.get(c, 0.0) <= now_s})
        self.flagged |= set(self.windows.counts(now_s, at_least=self.line) if self.line else ())

    def ask(self, table: ClientTable, now_s: float) -> dict:
        wanted, self.flagged = table.wanted() | self.flagged, set()
        return self.windows.counts(now_s, wanted)

    def apply(self, tick) -> None:
        self.bans, self.line = dict(tick.bans), tick.line
        for c in tick.resets:
            self.windows.clear(c)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from([HEAVY, *LIGHT[:3]]), st.floats(0, 3e5), max_size=4),
                min_size=5, max_size=40), st.sampled_from(["throttle", "ban"]))
def test_windows_in_the_kernel_decide_as_windows_here(trace, action):
    """tick_counts on a model of the kernel's counters (which reads only the wanted and newly
    heavy clients) throttles and bans exactly as tick on the deltas, tick after tick."""
    r = rule(action=action, ban_duration_s=0.5 if action == "ban" else None)
    here, there = ClientTable(r, 1.0, 0.0), ClientTable(r, 1.0, 0.0)
    kernel = KernelModel(r.window_s)
    kernel.line = there.line(2)                      # the agent writes it with the rule
    for k, deltas in enumerate(trace, 1):
        now = 0.1 * k
        a = here.tick(now, deltas, 2)
        kernel.arrive(now, deltas)
        b = there.tick_counts(now, kernel.ask(there, now), 2)
        kernel.apply(b)
        assert a.limits == pytest.approx(b.limits) and a.bans == pytest.approx(b.bans)
        assert dict(a.report.counts) == pytest.approx(dict(b.report.counts))
