"""etcd's data is the operator's: its loss or a hand edit does not change a limit or a member
(service/registry_sync.py, cluster/registry.py; docs/registry.md "Failures").  A real etcd
(Debian's etcd-server, lab/etcd.py) under the in-memory agent of daemon_harness."""
from __future__ import annotations

import json
import shutil
import time

import pytest
from click.testing import CliRunner

from drl.agent.cluster.etcd import Gateway
from drl.agent.cluster.registry import Registry, RegistryConfig, import_classes
from drl.agent.gossip.core import CLUSTER, GossipCore, Outgoing, PeerList
from drl.cli.agent import load_config, up
from drl.cli.ctl import main as ctl_main
from drl.lab.etcd import Etcd

from daemon_harness import FakeDatapath, agent, values

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None, reason="needs etcd (Debian etcd-server)")


def etcd_config(tmp_path, etcd, *more):
    args = ["--iface", "lo", "--node-id", "a", "--listen", "127.0.0.1:7470", "--insecure", "--interval", "1s",
            "--socket", str(tmp_path / "ctl.sock"), "--state-dir", str(tmp_path / "state"),
            "--registry", etcd.url, "--cluster", "t", *more]
    ctx = up.make_context("up", args)
    return load_config(None, ctx.params, {"global_Bps", "registry", "cluster"} & set(ctx.params), check_host=False)


def follow(a, until, timeout_s: float = 5.0, always=lambda: True) -> float:
    """Run the agent's registry step until ``until()`` holds, checking ``always()`` at every
    step; the seconds it took."""
    start = time.monotonic()
    while not until():
        assert always(), a.status()["registry"]
        assert time.monotonic() - start < timeout_s, a.status()["registry"]
        a._follow_registry()
        time.sleep(0.02)
    assert always(), a.status()["registry"]
    return time.monotonic() - start


def hold(a, seconds: float, always) -> None:
    """Run the registry step for ``seconds``, ``always()`` holding throughout."""
    end = time.monotonic() + seconds
    follow(a, lambda: time.monotonic() >= end, seconds + 5, always)


def stored(gw, key: str):     # the test's own client waits longer than an agent's 1 s: a loaded CI
    found = gw.get(key)
    return None if found is None else json.loads(found[0])


def test_a_wiped_etcd_keeps_the_live_limit_and_gets_the_class_back(tmp_path):
    """Every agent went back to its own --global (30/24 of the operator's limit) when etcd
    lost its keys; now they keep the newest limit they hold and write the table back."""
    with Etcd() as etcd:
        cfg = etcd_config(tmp_path, etcd, "--global", "30mbit")
        gw = Gateway(etcd.endpoints[0], None, 10.0)
        with agent(cfg, FakeDatapath()) as a:
            import_classes(cfg.registry, [{"name": "gold", "global": "20mbit", "match": ["dst=10.9.0.0/16"]}])
            follow(a, lambda: a.table.get("gold") is not None)      # a class only etcd has
            assert a.set_limit({"class": "default", "global": "24mbit"})["ok"]
            follow(a, lambda: a.book.get("default").global_Bps == 3e6)
            version = a.book.get("default").version
            gw.delete_prefix("/drl/")                                # etcd wiped (or a new, empty one)

            def unchanged():
                return (a.book.get("default").global_Bps == 3e6 and a.book.get("default").version == version
                        and a.table.get("gold") is not None and a.book.get("gold").global_Bps == 20e6 / 8)

            follow(a, lambda: stored(gw, "/drl/t/classes/default") is not None
                   and stored(gw, "/drl/t/classes/gold") is not None, 5.0, unchanged)
            assert stored(gw, "/drl/t/classes/default")["global"] == "24mbit"
            assert stored(gw, "/drl/t/classes/gold") == {"name": "gold", "global": "20mbit",
                                                        "match": ["dst=10.9.0.0/16"]}
            hold(a, 1.0, unchanged)                   # what came back is what was in force: no new version


def test_a_limit_newer_than_etcds_table_is_what_is_written_back(tmp_path):
    """The table goes back with the newest limit the agent holds (gossip may have brought
    one etcd's table never said)."""
    from drl.agent.cluster.limits import Limit

    with Etcd() as etcd:
        cfg = etcd_config(tmp_path, etcd, "--global", "30mbit")
        gw = Gateway(etcd.endpoints[0], None, 10.0)
        with agent(cfg, FakeDatapath()) as a:
            assert a.set_limit({"class": "default", "global": "24mbit"})["ok"]
            follow(a, lambda: a.book.get("default").global_Bps == 3e6)
            newer = Limit(a.book.get("default").version + 5, 2.5e6)
            assert a.book.merge("default", newer)                   # a peer's newer set, by gossip
            gw.delete("/drl/t/classes/default")                     # an etcdctl del, say
            follow(a, lambda: stored(gw, "/drl/t/classes/default") is not None, 5.0,
                   lambda: a.book.get("default") == newer)
            assert stored(gw, "/drl/t/classes/default")["global"] == "20mbit"
            hold(a, 0.5, lambda: a.book.get("default").global_Bps == 2.5e6)


def test_drlctl_class_delete_returns_every_agent_to_its_own_definition(tmp_path):
    """A class deleted on purpose (a tombstone, one transaction): an agent with a class of that
    name of its own goes back to it, one without drops it, and nothing is written back."""
    with Etcd() as etcd:
        cfg = etcd_config(tmp_path, etcd, "--global", "30mbit")
        gw = Gateway(etcd.endpoints[0], None, 10.0)
        with agent(cfg, FakeDatapath()) as a:
            import_classes(cfg.registry, [{"name": "gold", "global": "20mbit", "match": ["dst=10.9.0.0/16"]}])
            assert a.set_limit({"class": "default", "global": "24mbit"})["ok"]
            follow(a, lambda: a.table.get("gold") is not None and a.book.get("default").global_Bps == 3e6)
            version = a.book.get("default").version
            reg = ["--registry", etcd.url, "--cluster", "t"]
            for name in ("default", "gold"):
                result = CliRunner().invoke(ctl_main, ["class", "delete", name, *reg])
                assert result.exit_code == 0 and f"deleted class {name!r}" in result.output, result.output
            follow(a, lambda: a.table.get("gold") is None and a.book.get("default").global_Bps == 30e6 / 8)
            assert a.book.get("default").version > version          # in force over the deleted one
            hold(a, 1.5, lambda: gw.get("/drl/t/classes/default") is None and gw.get("/drl/t/classes/gold") is None)
            missing = CliRunner().invoke(ctl_main, ["class", "delete", "silver", *reg])
            assert missing.exit_code == 1 and "no class 'silver' in etcd" in missing.output
            # written again, the class is live again and a hand delete is a loss again
            import_classes(cfg.registry, [{"name": "gold", "global": "20mbit", "match": ["dst=10.9.0.0/16"]}])
            follow(a, lambda: a.table.get("gold") is not None)
            assert gw.get("/drl/t/deleted/gold") is None
            gw.delete("/drl/t/classes/gold")
            follow(a, lambda: gw.get("/drl/t/classes/gold") is not None, 5.0, lambda: a.table.get("gold") is not None)


def test_an_agents_own_member_key_deleted_by_hand_is_back_at_once(tmp_path):
    """It came back only when the lease was renewed after it ran out (12 s and more)."""
    with Etcd() as etcd:
        reg = Registry(RegistryConfig(etcd.endpoints, "t"), "a", ("127.0.0.1", 7470), 1)
        gw = Gateway(etcd.endpoints[0], None, 10.0)
        reg.start()
        try:
            deadline = time.monotonic() + 3
            while gw.get("/drl/t/members/a") is None:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            for wipe in (lambda: gw.delete("/drl/t/members/a"), lambda: gw.delete_prefix("/drl/")):
                wipe()
                start = time.monotonic()
                while gw.get("/drl/t/members/a") is None:
                    assert time.monotonic() - start < 1.5, reg.view()
                    time.sleep(0.02)
                assert stored(gw, "/drl/t/members/a") == {"addr": "127.0.0.1:7470", "incarnation": 1}
        finally:
            reg.close()


def test_a_member_key_never_heard_is_forgotten_when_deleted_and_one_heard_stays_lost(tmp_path):
    """A key written by hand with no agent behind it stayed lost, its share reserved for good;
    a real agent's (heard by gossip, killed: its datapath enforces its fail-safe) stays lost."""
    with Etcd() as etcd:
        cfg = etcd_config(tmp_path, etcd, "--global", "10mbit")
        gw = Gateway(etcd.endpoints[0], None, 10.0)
        b_addr = ("127.0.0.2", 7470)
        b = GossipCore("b", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)
        with agent(cfg, FakeDatapath()) as a:
            gw.put("/drl/t/members/x", json.dumps({"addr": "127.0.0.9:7470", "incarnation": 1}).encode())
            gw.put("/drl/t/members/b", json.dumps({"addr": "127.0.0.2:7470", "incarnation": 1}).encode())
            follow(a, lambda: a.members.n_nodes == 3)
            a.transport.arrive(b.publish(values({a.table.get("default").conf.key: 1e5}), 0.0), b_addr)
            a.receive()

            def rows():
                return {r["node_id"]: r["state"] for r in a.members.status(time.monotonic())}

            assert set(rows()) == {"b", "x"}
            gw.delete("/drl/t/members/x")
            gw.delete("/drl/t/members/b")
            follow(a, lambda: set(rows()) == {"b"})
            assert rows() == {"b": "lost"} or rows() == {"b": "alive"}, rows()     # x forgotten, b kept
            assert a.members.n_nodes == 2           # b's datapath still passes: in N, reserved
            assert sorted(a.registry.view().lost) == ["b", "x"]      # etcd's side knows no gossip
            gw.put("/drl/t/members/x", json.dumps({"addr": "127.0.0.9:7470", "incarnation": 1}).encode())
            follow(a, lambda: a.members.n_nodes == 3 and set(rows()) == {"b", "x"})   # registers again: a member


def test_a_killed_members_lease_expiring_leaves_the_survivor_its_share_not_nothing(tmp_path):
    """Issue 43: b, heard at half of the limit, is killed; its key goes with its lease.  Out of
    N, the survivor's safe rate was the whole limit, and b was reserved that much (the
    largest safe rate since it was heard): effective 0 until b came back.  b's datapath
    keeps the fail-safe of N = 2, so both count it: N stays 2, b is reserved its half."""
    with Etcd() as etcd:
        cfg = etcd_config(tmp_path, etcd, "--global", "10mbit", "--allocator", "fps")
        gw = Gateway(etcd.endpoints[0], None, 10.0)
        b = GossipCore("b", CLUSTER, None, PeerList([cfg.listen]), 1, incarnation=1)
        with agent(cfg, FakeDatapath()) as a:
            gw.put("/drl/t/members/b", json.dumps({"addr": "127.0.0.2:7470", "incarnation": 1}).encode())
            follow(a, lambda: a.members.n_nodes == 2)
            key = a.table.get("default").conf.key
            a.transport.arrive(b.publish({key: Outgoing(1e5, local_Bps=625_000.0)}, 0.0), ("127.0.0.2", 7470))
            a.receive()
            gw.delete("/drl/t/members/b")                     # its lease expired: no "left"
            follow(a, lambda: {r["state"] for r in a.members.status(time.monotonic() + 10)} == {"lost"})
            for dt in (10.0, 10.1, 60.0):                     # stale; then its fail-safe surely on
                a.tick(time.monotonic() + dt)
                st = a.status()["classes"][0]
                assert st["safe_rate_bps"] == 5e6, st
                assert st["effective_limit_bps"] == pytest.approx(5e6), st
