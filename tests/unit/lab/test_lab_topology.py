"""Planning a topology is pure: names, addresses, routes and commands, checked without root."""
import dataclasses
from pathlib import Path

import pytest

from drl.lab.agents import agent_argv
from drl.lab.registry import builtin, resolve
from drl.lab.reader import loads
from drl.lab.topology import ANY_RUN, IFNAMSIZ, RUN, new_run, plan
from drl.lab.traffic import place


@pytest.mark.parametrize("name", sorted(builtin()))
@pytest.mark.parametrize("central", [False, True])
def test_every_name_carries_the_run_prefix_and_fits(name, central):
    p = plan(resolve(name), run="lb12ab", central=central)
    ifaces = [i.name for v in p.veths + p.ctl for i in (v.a, v.b)]
    assert all(n.startswith("lb12ab") and len(n) <= IFNAMSIZ for n in ifaces + [p.bridge])
    assert all(ns.startswith("lb12ab-") for ns in p.namespaces)
    created = [c for c in p.build_commands() if c[:3] == ["ip", "link", "add"]]
    assert all(c[c.index("netns") + 1].startswith("lb12ab-") for c in created), "veths are born inside the run's namespaces"


def test_run_prefix_is_random_and_recognisable():
    runs = {new_run() for _ in range(20)}
    assert len(runs) > 1 and all(RUN.fullmatch(r) for r in runs)
    assert ANY_RUN.fullmatch(new_run("dp")) and not RUN.fullmatch(new_run("dp"))


@pytest.mark.parametrize("prefix", ["", "d", "dpx", "D1", "d-"])
def test_a_run_prefix_clean_could_not_find_is_refused(prefix):
    with pytest.raises(ValueError, match="two letters"):
        new_run(prefix)


def test_routes_lead_every_source_to_the_sink():
    exp = resolve("bottleneck")
    p = plan(exp, run="lb0001")
    table = {(r.host, r.dst): r.via for r in p.routes}
    # s2 -> l2 -> sw -> sink: s2's route to the sink's subnet goes via l2's address on the s2-l2 link
    assert table[("s2", "10.1.3.0/24")] == p.iface("l2", "s2").addr
    assert table[("l2", "10.1.3.0/24")] == p.iface("sw", "l2").addr
    # and the sink routes replies back through sw
    assert table[("sink", "10.1.2.0/24")] == p.iface("sw", "sink").addr


def test_rto_min_reaches_every_data_route_and_only_when_asked():
    exp = dataclasses.replace(resolve("bottleneck"), rto_min_s=None)
    plain = [c for c in plan(exp, run="lb0001").build_commands() if "route" in c]
    assert plain and not any("rto_min" in c for c in plain)
    cmds = plan(dataclasses.replace(exp, rto_min_s=0.01), run="lb0001").build_commands()
    routes = [c for c in cmds if "route" in c]
    assert all(c[-2:] == ["rto_min", "10ms"] for c in routes)
    # every link's subnet is reached by a route with the option, from every host
    reach = {(c[2], c[5]) for c in routes}
    assert reach == {(f"lb0001-{h}", f"10.1.{i}.0/24") for h in exp.hosts for i in range(len(exp.links))}


def test_agents_limit_the_egress_toward_the_sink():
    exp = resolve("bottleneck")
    spread, central = plan(exp, run="lb0001"), plan(exp, run="lb0001", central=True)
    assert {h: i.name for h, i in spread.agent_ifaces().items()} == {"l1": "lb0001l1-0", "l2": "lb0001l2-0"}
    assert list(central.agent_ifaces()) == ["sw"] and central.agent_ifaces()["sw"] == central.iface("sw", "sink")
    assert central.ctl == () and len(spread.ctl) == 2


def test_agent_argv_gossips_on_the_control_network():
    exp = resolve("flow-join")
    p = plan(exp, run="lb0001")
    argv = agent_argv(p, "l2", "grd", "/k", "/s")
    opt = dict(zip(argv[2::2], argv[3::2]))
    assert opt["--iface"] == "lb0001l2-0" and opt["--global"] == "10000000bit"
    assert opt["--listen"] == "10.254.0.2:7470"
    assert opt["--peers"].split(",") == [f"l{i}@10.254.0.{i}:7470" for i in (1, 3, 4, 5)]
    assert opt["--interval"] == "50ms", "[params.grd] overrides [agent]"
    assert agent_argv(p, "l2", "fps", "/k", "/s")[argv.index("--interval") + 1] == "500ms"


def test_a_lab_agent_keeps_its_state_in_the_run_not_in_the_hosts_state_dir():
    p = plan(resolve("baseline"), run="lb0001")
    assert "--state-dir" not in agent_argv(p, "l1", "fps", "/k", "/s")     # VMs: the machine's own
    argv = agent_argv(p, "l1", "fps", "/k", "/s", state_dir="/run/drl-lab/lb0001/l1.state")
    assert argv[argv.index("--state-dir") + 1] == "/run/drl-lab/lb0001/l1.state"


def test_single_agent_runs_insecure_on_loopback():
    p = plan(resolve("baseline"), run="lb0001", central=True)
    argv = agent_argv(p, "sw", "ctb", "/k", "/s")
    assert "--insecure" in argv and "--peers" not in argv


def test_shaping_uses_tbf_on_both_ends():
    exp = resolve("bottleneck")
    p = plan(exp, run="lb0001")
    link = next(l for l in exp.links if set(l.ends) == {"s2", "l2"})
    cmds = p.shaping_commands(link, 2e6 / 8)
    assert [c[2] for c in cmds] == ["lb0001-s2", "lb0001-l2"]
    assert all(c[c.index("root") + 1:c.index("root") + 4] == ["tbf", "rate", "2000000bit"] for c in cmds)


def test_traffic_places_servers_where_the_limited_direction_needs_them():
    exp = resolve("web")
    p = plan(exp, run="lb0001")
    bulk, web = place(p)
    assert (bulk.server_host, bulk.client_host, bulk.target) == ("sink", "l1", p.address("sink"))
    assert (web.server_host, web.client_host, web.target) == ("l2", "sink", p.address("l2"))
    assert bulk.client_argv(__import__("pathlib").Path("/o"))[:3] == ["iperf3", "-c", p.address("sink")]


def test_tcp_groups_use_their_own_or_the_experiments_congestion_control_and_udp_none():
    exp = loads("""
[experiment]
duration = "10s"
global = "10mbit"
congestion_control = "reno"
allocators = ["fps"]
[hosts]
l1 = "limiter"
sink = "sink"
[[link]]
ends = ["l1", "sink"]
[[traffic]]
kind = "tcp"
from = "l1"
[[traffic]]
kind = "tcp"
from = "l1"
congestion_control = "bbr"
[[traffic]]
kind = "udp"
from = "l1"
rate = "1mbit"
""")
    tcp, own, udp = (g.client_argv(Path("/o")) for g in place(plan(exp, run="lb0001")))
    assert tcp[-2:] == ["-C", "reno"] and own[-2:] == ["-C", "bbr"] and "-C" not in udp
    unpinned = place(plan(dataclasses.replace(exp, congestion_control=None), run="lb0001"))
    assert ["-C" in g.client_argv(Path("/o")) for g in unpinned] == [False, True, False]


def test_long_names_are_refused():
    from drl.lab.errors import LabError
    from drl.lab.reader import loads
    text = "[experiment]\nduration = 5\nglobal = '1mbit'\nallocators = ['fps']\n[hosts]\nabcdef = 'limiter'\nsink = 'sink'\n" + \
        "".join(f"[[link]]\nends = ['abcdef', 'x{i}']\n" for i in range(100)) + "[[link]]\nends = ['abcdef', 'sink']\n"
    text = text.replace("[hosts]\n", "[hosts]\n" + "".join(f"x{i} = 'router'\n" for i in range(100)))
    with pytest.raises(LabError, match="longer than 15"):
        plan(loads(text), run="lb0001")


@pytest.mark.parametrize("name", sorted(builtin()))
def test_agent_argv_is_accepted_by_drl_agent(name):
    """Every agent command the lab would run parses under the real `drl-agent up` options."""
    from drl.cli.agent import main as drl_agent
    exp = resolve(name)
    for alloc in exp.allocators:
        p = plan(exp, run="lb0001", central=alloc == "ctb")
        for host in p.agent_ifaces():
            argv = agent_argv(p, host, alloc, "/k", "/s")
            ctx = drl_agent.commands["up"].make_context("up", argv[2:])
            assert ctx.params["allocator"] == alloc and ctx.params["iface"] == p.agent_ifaces()[host].name


def test_code_topologies_keep_the_kernel_tests_names():
    from drl.lab.topology import pair, star

    s = star(3, run="dp0a1b", rto_min="10ms")
    assert s.namespaces == ["dp0a1b-h1", "dp0a1b-h2", "dp0a1b-h3", "dp0a1b-sw"]
    assert [(s.address(h), s.address6(h)) for h in ("h1", "h3", "sw")] == [
        ("10.0.0.1", "fd00::1"), ("10.0.0.3", "fd00::3"), (None, None)]
    cmds = s.build_commands()
    assert ["ip", "-n", "dp0a1b-sw", "link", "set", "h2", "master", "br0"] in cmds
    assert ["ip", "-n", "dp0a1b-h3", "-6", "route", "replace", "fd00::/64", "dev", "eth0", "metric", "256",
            "rto_min", "10ms"] in cmds
    assert not any("ethtool" in c for c in cmds), "code topologies keep the veth's offloads"
    p = pair(run="dp0a1b")
    assert p.build_commands()[4] == ["ip", "link", "add", "eth0", "netns", "dp0a1b-h1",
                                     "type", "veth", "peer", "name", "eth0", "netns", "dp0a1b-h2"]
    assert not any("route" in c for c in p.build_commands())


def test_an_agent_that_exits_on_its_own_is_told_apart_from_one_a_fault_killed(tmp_path):
    """lab/runner.py voids a run whose agent exits on its own (it crashed: the run looked
    plausible at 1/N); a fault's SIGKILL is no such exit."""
    import signal
    import subprocess

    from drl.lab.agents import Agent

    log = tmp_path / "agent-l1.log"
    log.write_text("level=info event=started\nlevel=error event=crashed error=\"ValueError: boom\"\n")
    crashed = Agent("l1", "s", subprocess.Popen(["sh", "-c", "exit 1"]), log)
    crashed.proc.wait()
    assert crashed.exit_note() == 'drl-agent on l1 exited (1): level=info event=started / level=error ' \
                                  'event=crashed error="ValueError: boom"'
    killed = Agent("l2", "s", subprocess.Popen(["sleep", "30"], start_new_session=True), tmp_path / "none.log")
    assert killed.exit_note() is None                       # running
    assert killed.kill(signal.SIGKILL) == -signal.SIGKILL and killed.exit_note() is None
