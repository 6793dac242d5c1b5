"""agent/service/client_rules.py: three hosts' ClientRules on in-memory datapaths, their reports through
the real wire codec: a client spread over the hosts is throttled to its threshold in total,
banned everywhere, unbanned everywhere, and the kernel gets exactly the tables' decisions."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from daemon_harness import CLASS_ID, FakeDatapath, agent, config

from drl.agent.clients.table import FLOOR_FRACTION
from drl.agent.clients.rules import client_rule, parse_client_key, parse_prefix, parse_threshold
from drl.agent.clients.windows import Windows
from drl.agent.service import client_rules
from drl.agent.service.client_rules import ClientRules
from drl.agent.gossip.wire import ClientReports, Header, Message, decode, encode

KEY = b"k" * 32
HEAVY = bytes([198, 51, 100, 7])
LIGHT = bytes([198, 51, 100, 8])
INTERVAL = 0.1


class ClientDatapath:
    """What ClientRules uses of agent.datapath.Datapath, in memory, with Windows for the kernel's
    per-client windows (tests/unit/clients/test_clients.py KernelModel says how it models them)
    and ``holds``: the clients the kernel holds by itself (clients.h hold_client); ``room``:
    how many buckets a class's set_client_limits may hold, as a full map would."""

    def __init__(self):
        self.rules, self.limits, self.bans, self.lines, self.windows, self.holds = {}, {}, {}, {}, {}, {}
        self.flagged, self.now, self.room = {}, 0.0, 16384

    def set_client_rule(self, class_id, rule, line=0.0, hold=0.0):
        self.rules[class_id] = rule
        self.limits.pop(class_id, None)
        self.bans.pop(class_id, None)
        self.holds.pop(class_id, None)
        if rule is not None:
            self.windows[class_id], self.lines[class_id] = Windows(rule.window_s, self.now), (line, hold)

    def arrive(self, now, class_id, deltas):
        """The interval's arrivals up to ``now``: counted unless banned, flagged at the line."""
        self.now = now
        bans = self.bans.get(class_id, {})
        counted = {c: d for c, d in deltas.items() if bans.get(c, 0) <= now * 1e9}
        w = self.windows[class_id]
        w.add(now, counted)
        line, hold = self.lines[class_id]
        heavy = w.counts(now, counted, at_least=line)
        self.flagged.setdefault(class_id, set()).update(heavy)
        if hold:
            self.holds.setdefault(class_id, set()).update(set(heavy) - self.limits.get(class_id, {}).keys())

    def read_heavy(self):
        out, self.flagged = self.flagged, {}
        return out

    def client_counts(self, class_id, clients):
        return self.windows[class_id].counts(self.now, clients)

    def forget_clients(self, class_id, clients):
        for c in clients:
            self.windows[class_id].clear(c)

    def set_client_line(self, class_id, line, hold=0.0):
        self.lines[class_id] = (line, hold)

    def drop_holds(self, class_id, clients):
        self.holds.get(class_id, set()).difference_update(clients)

    def set_client_limits(self, class_id, limits):
        """What is there already is updated in place; a new bucket needs room."""
        there = self.limits.get(class_id, {}).keys() | self.holds.get(class_id, set())
        written, full = {}, []
        for client, rates in limits.items():
            if client in there or len(written) < self.room:
                written[client] = rates
            else:
                full.append(client)
        self.limits[class_id] = written
        self.holds.get(class_id, set()).difference_update(limits)
        return full

    def set_client_bans(self, class_id, bans):
        self.bans[class_id] = dict(bans)
        return []


def a_class(name, rule, class_id=3):
    return SimpleNamespace(name=name, class_id=class_id, conf=SimpleNamespace(client=rule, key=hash(name) & 0xFFFF))


def hosts(rule, n=3):
    out = []
    for i in range(n):
        dp = ClientDatapath()
        rules = ClientRules(dp, node_id=f"h{i}")
        rules.apply([a_class("gold", rule)], 0.0, max_age_s=1.0, n_hosts=n)
        out.append((dp, rules))
    return out


def exchange(group, reports, now):
    """Every host's reports to every other, encoded and decoded as on the wire."""
    for i, sent in enumerate(reports):
        if not sent:
            continue
        msg = Message(Header(cluster="c", node=f"h{i}", seq=1, incarnation=1, sent_at=now), ClientReports(tuple(sent)))
        payload = decode(encode(msg, KEY), KEY, "c").payload
        for j, (_, rules) in enumerate(group):
            if j != i:
                rules.receive(f"h{i}", payload, now)


def run(group, seconds, per_host, now=0.0):
    """``per_host(i)`` -> {client: bytes per interval} counted on host i, for ``seconds`` after
    ``now``; returns the time it ends at."""
    for _ in range(round(seconds / INTERVAL)):
        now += INTERVAL
        for i, (dp, _) in enumerate(group):
            dp.arrive(now, 3, per_host(i))
        exchange(group, [rules.tick(now, len(group), 1.0) for _, rules in group], now)
    return now


def throttle_rule():
    return client_rule(parse_client_key("dst/32"), "bytes", parse_threshold("2mbit"), "throttle")


def test_a_client_spread_over_three_hosts_gets_its_threshold_in_total():
    group = hosts(throttle_rule())
    # the heavy client sends 1 Mbit/s through each host (3x its 2 Mbit/s), the light one 0.1
    run(group, 3.0, lambda i: {HEAVY: 12_500, LIGHT: 1_250 if i == 0 else 0})
    limits = [dp.limits[3] for dp, _ in group]
    assert all(set(lim) == {HEAVY} for lim in limits)               # the light client is untouched
    total = sum(lim[HEAVY][0] for lim in limits)
    assert total == pytest.approx(250_000, rel=0.01)                # bytes/s: 2 Mbit/s in all
    assert all(lim[HEAVY][1] == pytest.approx(250_000 / 3) for lim in limits)   # fail-safe: T/N


def test_the_kernel_holds_a_client_from_the_line_and_the_agent_takes_over_or_lets_go():
    """Host 0 alone sees the client above the line (threshold/12): the kernel's hold, then the
    agent's bucket, state ok (held, under its threshold); once it fades the bucket goes.  A
    ban rule holds no one."""
    group = hosts(throttle_rule())
    dp, rules = group[0]
    dp.arrive(0.1, 3, {HEAVY: 50_000})              # over the line (20,833 bytes) in one interval
    assert dp.holds[3] == {HEAVY} and 3 not in dp.limits
    exchange(group, [r.tick(0.1, 3, 1.0) for _, r in group], 0.1)
    assert dp.limits[3][HEAVY][0] == pytest.approx(250_000 / 3) and not dp.holds[3]   # young: T/N
    now = run(group, 0.5, lambda i: {HEAVY: 5_000} if i == 0 else {}, now=0.1)
    share = 250_000 * (1 - 2 * FLOOR_FRACTION / 3)                  # the floors of the two others
    assert dp.limits[3][HEAVY][0] == pytest.approx(share)
    assert [c["state"] for c in rules.listing(None, now, None)[0]["clients"]] == ["ok"]
    now = run(group, 2.0, lambda i: {}, now=now)
    assert not dp.limits.get(3) and not dp.holds[3]
    dp.flagged[3] = {HEAVY}                           # flagged, then let go at once: the hold goes too
    dp.holds[3] = {HEAVY}
    rules.tick(now + INTERVAL, 3, 1.0)
    assert not dp.holds[3]
    banning = hosts(client_rule(parse_client_key("dst/32"), "bytes", parse_threshold("2mbit"), "ban", 5.0))
    banning[0][0].arrive(0.1, 3, {HEAVY: 50_000})
    assert banning[0][0].lines[3][1] == 0 and not banning[0][0].holds.get(3)


def test_held_clients_a_full_map_has_no_room_for_are_tried_again_each_tick():
    group = hosts(throttle_rule(), n=1)
    dp, rules = group[0]
    dp.room = 1
    dp.arrive(0.1, 3, {HEAVY: 100_000, LIGHT: 80_000})  # both over the line, 62,500
    dp.holds[3] = set()                             # the kernel's map was full for its holds too
    rules.tick(0.1, 1, 1.0)
    assert set(dp.limits[3]) == {HEAVY} and rules.get("gold").unheld == 1
    dp.room = 2
    dp.arrive(0.2, 3, {})
    rules.tick(0.2, 1, 1.0)                         # nothing moved but the room
    assert set(dp.limits[3]) == {HEAVY, LIGHT} and rules.get("gold").unheld == 0


def test_a_spray_of_flagged_clients_is_adopted_a_bounded_number_a_tick_the_rest_held_in_line(monkeypatch):
    """10,000 addresses at the line at once: each tick reads and decides ADOPT_PER_TICK of them
    (the oldest flagged first), the rest wait held by the kernel at threshold/N; the line longer
    than MAX_WAITING loses its oldest, and their holds.  A heavy client flagged later is still
    adopted, and throttled, once the line has reached it."""
    monkeypatch.setattr(client_rules, "MAX_WAITING", 6_000)
    group = hosts(throttle_rule(), n=1)
    dp, rules = group[0]
    spray = [bytes([10, 0, i >> 8, i & 255]) for i in range(10_000)]
    counted = []
    read = dp.client_counts
    dp.client_counts = lambda class_id, clients: counted.append(len(clients)) or read(class_id, clients)
    dp.arrive(0.1, 3, dict.fromkeys(spray, 70_000))    # each over the line (62,500 bytes: n = 1)
    rules.tick(0.1, 1, 1.0)
    cr = rules.get("gold")
    assert counted == [client_rules.ADOPT_PER_TICK]
    assert len(cr.waiting) == 6_000 and dp.holds[3] == set(cr.waiting)    # the rest's holds went
    assert len(dp.limits[3]) == client_rules.ADOPT_PER_TICK
    now = 0.1
    dp.arrive(now + INTERVAL, 3, {HEAVY: 300_000})     # a real heavy client, behind the line
    for _ in range(40):
        now += INTERVAL
        dp.arrive(now, 3, {HEAVY: 300_000} if now > 0.15 else {})
        followed = len(cr.table.wanted())
        rules.tick(now, 1, 1.0)
        assert counted[-1] <= client_rules.ADOPT_PER_TICK + followed + 1
        if not cr.waiting:
            break
    assert not cr.waiting and HEAVY in dp.limits[3]
    top = rules.listing(None, now, None)[0]["clients"][0]
    assert (top["client"], top["state"]) == ("198.51.100.7/32", "throttled")
    # a client is followed until its sliding count fades: two 1-s windows, 20 ticks of adoptions
    assert max(counted) <= 21 * client_rules.ADOPT_PER_TICK + 1


def test_a_ban_reaches_every_host_and_unban_lifts_it_everywhere():
    rule = client_rule(parse_client_key("dst/32"), "conns", parse_threshold("20/1s"), "ban", 5.0)
    group = hosts(rule)
    # only host 0 sees the client: 3 connections, then 30 more in the same second
    now = 1.0
    for conns in (3, 30, 0):
        now += INTERVAL
        for i, (dp, _) in enumerate(group):
            dp.arrive(now, 3, {HEAVY: conns} if i == 0 else {})
        exchange(group, [rules.tick(now, 3, 1.0) for _, rules in group], now)
        assert (HEAVY in group[1][0].bans.get(3, {})) == (conns == 0)     # a round after host 0 banned
    untils = [dp.bans[3][HEAVY] for dp, _ in group]
    assert max(untils) - min(untils) < 0.2e9 and untils[0] > (now + 4.5) * 1e9   # the window's rest + 5 s
    assert group[1][1].unban(parse_prefix("198.51.100.0/24"), None, now) == [("gold", "198.51.100.7/32")]
    assert HEAVY not in group[1][0].bans[3]
    now += INTERVAL
    exchange(group, [rules.tick(now, 3, 1.0) for _, rules in group], now)
    now += INTERVAL
    exchange(group, [rules.tick(now, 3, 1.0) for _, rules in group], now)
    assert all(HEAVY not in dp.bans[3] for dp, _ in group)
    assert all(dp.windows[3].count(HEAVY, now) == 0 for dp, _ in group)     # its count starts over


def test_a_changed_or_removed_rule_is_taken_out_of_the_kernel():
    dp = ClientDatapath()
    rules = ClientRules(dp, node_id="a")
    rules.apply([a_class("gold", throttle_rule())], 0.0, 1.0, 2)
    assert dp.rules[3] == throttle_rule() and rules and dp.lines[3] == (0.25 * 250_000 / 2, 250_000 / 2)
    other = client_rule(parse_client_key("dst/24"), "bytes", parse_threshold("1mbit"), "throttle")
    rules.apply([a_class("gold", other)], 1.0, 1.0, 2)
    assert dp.rules[3] == other and rules.get("gold").rule == other
    rules.tick(1.5, 5, 1.0)
    assert dp.lines[3] == (0.25 * 125_000 / 5, 125_000 / 5)     # the line and the hold follow N
    rules.apply([a_class("gold", None)], 2.0, 1.0, 2)
    assert dp.rules[3] is None and not rules and rules.tick(3.0, 1, 1.0) == []


def test_reports_for_a_class_without_a_rule_are_ignored_and_counted():
    group = hosts(throttle_rule(), n=2)
    lone = ClientRules(ClientDatapath(), node_id="x")
    run(group, 1.0, lambda i: {HEAVY: 30_000})
    group[0][0].arrive(1.1, 3, {HEAVY: 30_000})
    sent = group[0][1].tick(1.1, 2, 1.0)
    lone.receive("h0", ClientReports(tuple(sent)), 2.0)
    assert lone.ignored == 1


def test_drlctl_clients_shows_the_listing_of_each_class():
    """ClientRules.listing (the control socket's reply) through drlctl's renderer."""
    from drl.cli.ctl import render_clients

    group = hosts(throttle_rule())
    mid = bytes([198, 51, 100, 9])                  # 0.24 Mbit/s on h0: over the line, held, ok
    run(group, 3.0, lambda i: {HEAVY: 12_500, LIGHT: 1_250, mid: 3_000} if i == 0 else {HEAVY: 12_500})
    listing = group[0][1].listing(None, 3.0, limit=None)
    rows = {r["client"]: r for r in listing[0]["clients"]}
    heavy = rows["198.51.100.7/32"]
    assert heavy["state"] == "throttled" and heavy["hosts"] == ["h0", "h1", "h2"]
    assert heavy["global_bps"] == pytest.approx(3e6, rel=0.02) and heavy["share_bps"] == pytest.approx(2e6 / 3, rel=0.02)
    assert "198.51.100.8/32" not in rows            # under the reporting line: the kernel counts it alone
    assert rows["198.51.100.9/32"]["state"] == "ok" and rows["198.51.100.9/32"]["share_count"] > 0
    lines = render_clients(listing).splitlines()
    assert lines[0] == "class gold   client dst/32/64   bytes   threshold 2mbit   throttle"
    assert lines[1].split() == ["CLIENT", "GLOBAL", "LOCAL", "STATE", "HOSTS"]
    assert lines[2].startswith("198.51.100.7/32 ") and "throttled, share 666.7 kbit/s" in lines[2]
    assert lines[2].rstrip().endswith("h0,h1,h2")
    assert lines[3].startswith("198.51.100.9/32 ") and "ok, share " in lines[3]
    assert render_clients([]) == "no class has a client rule (docs/clients.md)"


class AgentDatapath(FakeDatapath, ClientDatapath):
    def __init__(self):
        FakeDatapath.__init__(self)
        ClientDatapath.__init__(self)


def test_the_agent_answers_drlctl_clients_and_unban_and_refuses_bad_requests(tmp_path):
    cfg = config(tmp_path, "--global", "12mbit", "--client-key", "dst/32", "--client-measure", "conns",
                 "--client-threshold", "3/1s", "--client-action", "ban", "--ban-duration", "5s")
    dp = AgentDatapath()
    with agent(cfg, dp) as a:
        now = time.monotonic()
        dp.arrive(now - 0.05, CLASS_ID, {})             # the model's windows start here
        dp.arrive(now, CLASS_ID, {HEAVY: 5})            # 5 connections in 50 ms
        a.tick(now)
        assert HEAVY in dp.bans[CLASS_ID]
        st = a.status()
        assert st["clients"]["banned"] == 1 and st["clients"]["action"] == "ban"
        clients, unban = a.commands()["clients"], a.commands()["unban"]     # the control socket's handlers
        listing = clients({"class": "default", "limit": 5})
        assert listing["ok"] and listing["classes"][0]["clients"][0]["state"] == "banned"
        assert not clients({"class": "nope"})["ok"]
        assert "limit" in clients({"limit": [1]})["error"]
        assert "not an address" in unban({"prefix": "nowhere"})["error"]
        assert unban({"prefix": "198.51.100.0/24"})["lifted"] == [{"class": "default", "client": "198.51.100.7/32"}]
        assert HEAVY not in dp.bans[CLASS_ID]
        assert unban({"prefix": "198.51.100.7"})["error"] == "no ban on 198.51.100.7/32"
