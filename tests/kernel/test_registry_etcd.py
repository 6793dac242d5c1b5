"""agent/cluster/registry.py against a real etcd (Debian's etcd-server) on 127.0.0.1, free ports.

One etcd serves the module (each test under a cluster name of its own); the
outage test stops and restarts it with its data, the TLS test runs its own.
No namespaces: the registry is plain TCP, and etcd is always stopped and its
data dir removed (lab/etcd.py).
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from click.testing import CliRunner

from drl.agent.cluster.registry import Registry, RegistryConfig
from drl.cli.ctl import main as ctl_main
from drl.lab.etcd import Etcd, make_certs

pytestmark = [pytest.mark.kernel,
              pytest.mark.skipif(shutil.which("etcd") is None, reason="no etcd (apt-get install etcd-server)")]


@pytest.fixture(scope="module")
def etcd():
    with Etcd() as server:
        yield server


@pytest.fixture
def registries(etcd):
    """Factory: a started Registry of a cluster unique to the test; all closed afterwards."""
    cluster, made = f"t{uuid.uuid4().hex[:8]}", []

    def make(node_id: str, ttl_s: float = 5.0, server: Etcd = etcd, **tls) -> Registry:
        reg = Registry(RegistryConfig(server.endpoints, cluster, ttl_s=ttl_s, **tls), node_id,
                       ("10.0.0.1", 7470 + len(made)), 1)
        made.append(reg)
        reg.start()
        return reg

    make.cluster = cluster
    yield make
    for reg in made:
        reg.close()


def wait(cond, timeout_s: float) -> float:
    """Seconds until cond() held; fails the test after timeout_s."""
    start = time.monotonic()
    while not cond():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


def test_two_agents_see_each_other_and_a_close_leaves_at_once(registries):
    a, b = registries("a"), registries("b")
    wait(lambda: set(a.view().members) == set(b.view().members) == {"a", "b"}, 5.0)
    assert b.view().members["a"].addr == ("10.0.0.1", 7470) and b.view().reachable
    seen = b.changed()
    a.close()
    assert wait(lambda: set(b.view().members) == {"b"}, 3.0) < 3.0      # revoked, not expired (a 5-s lease)
    assert b.changed() > seen and b.view().lost == {}                   # it said it leaves: not lost


def test_a_close_without_leaving_expires_with_the_lease_as_a_kill_does(registries):
    """close(leave=False): an agent that failed, its datapath still enforcing (agent/service/daemon.py
    failed); the others must count it lost, at what that datapath may pass."""
    a, b = registries("a", ttl_s=2.0), registries("b")
    wait(lambda: "a" in b.view().members, 5.0)
    a.close(leave=False)
    gone = wait(lambda: "a" not in b.view().members, 5.0)
    assert list(b.view().lost) == ["a"] and gone > 1.0, gone


HOLDER = textwrap.dedent("""
    import sys, time
    from drl.agent.cluster.registry import Registry, RegistryConfig
    reg = Registry(RegistryConfig(((sys.argv[1], int(sys.argv[2])),), sys.argv[3], ttl_s=2), "k", ("10.0.0.9", 7470), 1)
    reg.start()
    while "k" not in reg.view().members:
        time.sleep(0.02)
    print("registered", flush=True)
    time.sleep(60)
""")


def test_a_killed_holder_expires_with_its_lease(etcd, registries):
    """SIGKILL: no revoke, no keepalive; the key goes when the 2-s lease runs out."""
    b = registries("b")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, etcd.addr, str(etcd.port), registries.cluster],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "registered"
        wait(lambda: "k" in b.view().members, 5.0)
        proc.send_signal(signal.SIGKILL)
        gone = wait(lambda: "k" not in b.view().members, 5.0)
        assert list(b.view().lost) == ["k"]          # no leaving said: its datapath may still pass
    finally:
        proc.kill()
        proc.wait()
    assert 1.0 < gone < 4.0, gone        # etcd expires leases on its own clock, up to ~1 s late
    print(f"killed holder gone after {gone:.2f} s (lease TTL 2 s)")


def test_an_outage_keeps_the_view_and_pending_writes_land_after(etcd, registries):
    a, b = registries("a"), registries("b")
    wait(lambda: len(b.view().members) == 2, 5.0)
    etcd.stop()
    try:
        wait(lambda: not a.view().reachable and not b.view().reachable, 5.0)
        a.put_class({"name": "gold", "global": "70mbit"})                    # while etcd is away
        view = b.view()
        assert set(view.members) == {"a", "b"} and view.error, view
        time.sleep(2.0)
    finally:
        etcd.start()
    back = wait(lambda: b.view().reachable and "gold" in b.view().classes, 8.0)   # backoff <= 1 s
    assert b.view().classes["gold"] == {"name": "gold", "global": "70mbit"} and set(b.view().members) == {"a", "b"}
    assert b.view().since > view.since
    print(f"resync {back:.2f} s after etcd was back")


def test_a_hung_etcd_counts_as_unreachable(etcd, registries):
    """SIGSTOP keeps the connections open and answers nothing: the next renewal times out."""
    a = registries("a", ttl_s=3)
    wait(lambda: a.view().reachable, 5.0)
    etcd.proc.send_signal(signal.SIGSTOP)
    try:
        hung = wait(lambda: not a.view().reachable, 4.0)        # a renewal every 1 s, each given 1 s
        assert "timed out" in a.view().error and set(a.view().members) == {"a"}
    finally:
        etcd.proc.send_signal(signal.SIGCONT)
    wait(lambda: a.view().reachable, 8.0)
    print(f"hung etcd noticed after {hung:.2f} s")


def test_latest_pending_write_per_class_wins(etcd, registries):
    a = registries("a")
    wait(lambda: a.view().reachable, 5.0)
    etcd.stop()
    try:
        wait(lambda: not a.view().reachable, 5.0)
        for rate in ("1mbit", "2mbit", "3mbit"):
            a.put_class({"name": "gold", "global": rate})
    finally:
        etcd.start()
    wait(lambda: a.view().classes.get("gold", {}).get("global") == "3mbit", 8.0)


def test_a_lease_lost_behind_our_back_is_granted_again(registries):
    a, b = registries("a", ttl_s=3), registries("b")
    wait(lambda: set(b.view().members) == {"a", "b"}, 5.0)
    old = a._lease
    a.cfg.gateways()[0].revoke(a._lease)           # as if it had expired during a long stall
    # at once (the watch saw its key go), at the latest at the next renewal (every ttl/3 = 1 s)
    wait(lambda: a._lease != old and "a" in b.view().members, 6.0)
    assert b.view().lost == {}


def test_a_dead_endpoint_fails_over_to_the_next(etcd, registries):
    reg = Registry(RegistryConfig((("127.0.0.1", 1), *etcd.endpoints), registries.cluster), "a", ("10.0.0.1", 7470), 1)
    try:
        reg.start()
        wait(lambda: reg.view().reachable and "a" in reg.view().members, 5.0)
    finally:
        reg.close()


def test_tls_with_client_certificates(tmp_path, registries):
    tls = make_certs(tmp_path, "127.0.0.1")
    with Etcd(tls=tls) as server:
        good = registries("a", server=server, ca=tls.ca, cert=tls.client_cert, key=tls.client_key)
        anonymous = registries("b", server=server, ca=tls.ca)            # no client certificate
        plain = registries("c", server=server)                             # http to an https port
        wait(lambda: good.view().reachable and "a" in good.view().members, 8.0)     # 3 s flaked in a loaded CI
        wait(lambda: "client certificate" in anonymous.view().error and plain.view().error, 8.0)
        assert set(good.view().members) == {"a"} and not anonymous.view().reachable and not plain.view().reachable
        print(f"without a client certificate: {anonymous.view().error}; over http: {plain.view().error}")
        for reg in (good, anonymous, plain):
            reg.close()                  # while the server is up: revoke


def test_drlctl_import_writes_the_classes_an_agent_then_sees(tmp_path, etcd, registries):
    path = tmp_path / "drl.toml"
    path.write_text(textwrap.dedent("""
        [agent]
        iface = "eth0"
        allocator = "gdrl"

        [[class]]
        name = "gold"
        global = "50mbit"
        match = ["dst=198.51.100.0/24"]

        [[class]]
        name = "silver"
        global = "20mbit"
        allocator = "fps"
    """))
    result = CliRunner().invoke(ctl_main, ["import", str(path), "--registry", etcd.url, "--cluster", registries.cluster])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"imported 2 classes into /drl/{registries.cluster}/classes/"
    a = registries("a")
    wait(lambda: len(a.view().classes) == 2, 5.0)
    assert a.view().classes == {
        "gold": {"name": "gold", "global": "50mbit", "match": ["dst=198.51.100.0/24"], "allocator": "gdrl"},
        "silver": {"name": "silver", "global": "20mbit", "allocator": "fps"}}

    path.write_text('[[class]]\nname = "gold"\nglobal = "50mbit"\nmatch = "dst=nonsense"\n')
    result = CliRunner().invoke(ctl_main, ["import", str(path), "--registry", etcd.url, "--cluster", registries.cluster])
    assert result.exit_code == 1 and result.output.startswith(f"Error: {path}") and "Traceback" not in result.output


def test_an_ipv6_endpoint(registries):
    with Etcd("::1") as server:
        reg = registries("a", server=server)
        wait(lambda: "a" in reg.view().members, 3.0)
        assert server.url.startswith("etcd://[::1]:")
        reg.close()


def test_founders_are_the_first_agents_members_and_the_same_for_everyone(registries):
    a, b = registries("a"), registries("b")
    wait(lambda: set(a.view().members) == set(b.view().members) == {"a", "b"}, 5.0)
    # two agents racing to found a class: one transaction wins, both get its members
    assert a.founders("gold", ("a",)) == ("a",)
    assert b.founders("gold", ("a", "b")) == ("a",)
    assert b.founders("silver", ("b", "a")) == ("a", "b") == a.founders("silver", ("a",))
    a.close()
    b.close()
    c = registries("c")            # the whole cluster replaced: none of the founders is registered
    wait(lambda: set(c.view().members) == {"c"}, 5.0)
    assert c.founders("gold", ("c",)) == ("c",)
    assert "genesis" not in " ".join(c.view().bad_keys)


def test_a_node_id_taken_by_another_agent_is_refused_and_a_previous_life_is_not(etcd, registries):
    a = registries("a")
    wait(lambda: "a" in a.view().members, 5.0)
    twin = registries("a")                       # the fixture gives it another gossip address
    wait(lambda: "registered by another agent at 10.0.0.1:7470" in twin.view().error, 3.0)
    assert not twin.view().reachable and a.view().members["a"].addr == ("10.0.0.1", 7470)
    twin.close()                                 # a refused agent's stop leaves the owner's key alone
    time.sleep(0.5)                              # (it wrote "left" under its own lease and revoked it)
    assert "a" in a.view().members and not a.view().members["a"].left, a.view().members
    again = Registry(RegistryConfig(etcd.endpoints, registries.cluster), "a", ("10.0.0.1", 7470), 2)
    try:                                         # the same agent restarted before its lease ran out
        again.start()
        wait(lambda: again.view().reachable and again.view().members["a"].incarnation == 2, 3.0)
    finally:
        again.close()


def test_a_member_key_deleted_by_hand_is_written_again_by_its_live_agent(etcd, registries):
    """Its lease lives, so nothing else would write it: the others counted it lost for 12 s
    and more.  Its registry sees its own key's delete in the watch and registers at once."""
    from drl.agent.cluster.etcd import Gateway

    registries("a")
    b = registries("b")
    wait(lambda: set(b.view().members) == {"a", "b"}, 5.0)
    gw, key = Gateway(etcd.endpoints[0], None, 5.0), f"/drl/{registries.cluster}/members/a"
    gw.delete(key)
    back = wait(lambda: gw.get(key) is not None, 4.0)      # at once (a busy machine: seconds), not 12 s
    wait(lambda: "a" in b.view().members and b.view().lost == {}, 3.0)
    print(f"member key deleted by hand: back after {back:.2f} s")
