"""The lab's delay line (lab/delay.py) on real namespaces: the RTT it adds under load, TCP's view
of it, its loss and its cleanup.  It is tested with ``netem=False``, so it runs even on kernels
that have netem.  About 25 s."""
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drl.lab.netns import Lab, remove_run
from drl.lab.preflight import require_root
from drl.lab.errors import LabError
from drl.lab.topology import new_run, pair

pytestmark = pytest.mark.kernel
try:   # no bcc needed: nothing here loads BPF
    require_root()
    REASON = None if shutil.which("ping") else "needs ping (apt install iputils-ping)"
except LabError as e:
    REASON = str(e)
if REASON:
    pytest.skip(REASON, allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
RTT_MS = 40.0          # asked: delay = "20ms", each direction
TOLERANCE_MS = 1.0     # the goal for ping's median (docs/lab.md "Delay and loss")


def ping_ms(host, addr: str, count: int, interval: float) -> tuple[list[float], int]:
    """Round-trip times (ms) of the replies, and how many of ``count`` echo requests went unanswered."""
    out = subprocess.run(host.argv("ping", "-n", "-c", str(count), "-i", str(interval), "-W", "1", addr),
                         capture_output=True, text=True).stdout
    rtts = [float(x) for x in re.findall(r"time=([0-9.]+) ms", out)]
    return rtts, count - len(rtts)


def data_conn(host, port: int) -> dict | None:
    """``ss -ti``'s rtt, minrtt and reordering counters of the busiest TCP connection to ``port``
    (None: there is none)."""
    out = host.run("ss", "-tinH", "state", "established", f"( dport = :{port} )")
    best = {}
    for info in re.findall(r"\n?\s+(\S.*rtt:.*)", out):
        acked = int(m.group(1)) if (m := re.search(r"bytes_acked:(\d+)", info)) else 0
        if acked >= best.get("bytes_acked", -1):
            best = {"bytes_acked": acked, "srtt_ms": float(re.search(r"\brtt:([0-9.]+)/", info).group(1)),
                    "minrtt_ms": float(re.search(r"minrtt:([0-9.]+)", info).group(1)),
                    "reord_seen": int(m.group(1)) if (m := re.search(r"reord_seen:(\d+)", info)) else 0}
    return best or None


def udp_received(h1, h2, rate: str, seconds: int) -> dict:
    """What h2's iperf3 server counted of a UDP flow from h1: packets, lost_packets, out_of_order
    (only the receiver sees the order)."""
    # iperf3 sets a UDP stream up with one datagram each way and never resends it
    # (esnet/iperf#351): on a lossy line the loss of either one hangs both ends, so a run
    # that has not ended well after its length is dropped and made again
    for attempt in range(3):
        server = h2.popen("iperf3", "-s", "-1", "-p", "5202", "-J", capture=True)
        time.sleep(0.3)
        try:
            subprocess.run(h1.argv("iperf3", "-c", "10.0.0.2", "-p", "5202", "-u", "-b", rate, "-l", "1400",
                                   "-t", str(seconds)), capture_output=True, timeout=seconds + 10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            continue
        end = json.loads(server.communicate(timeout=10)[0])["end"]
        return {**end["sum"], "out_of_order": sum(s["udp"]["out_of_order"] for s in end["streams"])}
    pytest.fail(f"iperf3 -u hung {attempt + 1} times in a row: more than its setup's loss explains")


@pytest.fixture
def built():
    """Factory: Lab(pair with the delay line), torn down after the test; the Labs are kept for
    their final relay counts."""
    labs = []

    def make(**impairment):
        lab = Lab(pair(new_run("dl"), netem=False, **impairment))
        lab.__enter__()
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.teardown()


def test_forty_ms_rtt_holds_under_50_mbit_of_tcp(built):
    lab = built(delay="20ms")
    h1, h2 = lab.hosts
    h2.popen("iperf3", "-s", "-1", "-p", "5201")
    time.sleep(0.3)
    client = h1.popen("iperf3", "-c", "10.0.0.2", "-p", "5201", "-t", "9", "-b", "50M", "-C", "cubic", "-J",
                      capture=True)
    time.sleep(2.0)                         # past slow start
    pinger = subprocess.Popen(h1.argv("ping", "-n", "-c", "250", "-i", "0.02", "10.0.0.2"),
                              stdout=subprocess.PIPE, text=True)
    tcp = []
    while pinger.poll() is None:
        tcp.append(data_conn(h1, 5201))
        time.sleep(0.5)
    tcp = [s for s in tcp if s]
    rtts = [float(x) for x in re.findall(r"time=([0-9.]+) ms", pinger.stdout.read())]
    report = json.loads(client.communicate(timeout=30)[0])
    received_bps = report["end"]["sum_received"]["bits_per_second"]
    stats = lab.delay_stats()[0]

    median = statistics.median(rtts)
    srtt = statistics.median(s["srtt_ms"] for s in tcp)
    print(f"ping median {median:.2f} ms (n={len(rtts)}), srtt median {srtt:.2f} ms, "
          f"minrtt {tcp[-1]['minrtt_ms']:.2f} ms, {received_bps / 1e6:.1f} Mbit/s, "
          f"relay cpu {stats['cpu_s'] / stats['uptime_s']:.1%}")
    assert received_bps > 45e6, "the delay line must carry 50 Mbit/s"
    assert len(tcp) >= 5, "ss -ti saw the iperf3 connection"
    assert len(rtts) >= 248, "no echo lost on a lossless line"
    assert abs(median - RTT_MS) <= TOLERANCE_MS, (median, rtts)
    assert abs(tcp[-1]["minrtt_ms"] - RTT_MS) <= TOLERANCE_MS, tcp[-1]
    assert RTT_MS - 1 <= srtt <= RTT_MS + 5, tcp   # srtt also holds delayed ACKs and the VM's hiccups (41.7-42.1)
    assert all(s["reord_seen"] == 0 for s in tcp), "no reordering without jitter"
    for label, d in stats["directions"].items():
        assert d["lost"] == d["overflow"] == d["socket_drops"] == d["send_errors"] == 0, (label, d)
    assert stats["cpu_s"] / stats["uptime_s"] < 0.5, "the relay must leave the CPUs to the traffic"


def test_one_percent_loss_each_way_and_no_reordering(built):
    lab = built(delay="1ms", loss="1%")
    h1, h2 = lab.hosts
    _, echoes_lost = ping_ms(h1, "10.0.0.2", 500, 0.005)
    # an echo is lost when its request or its reply is: 1 - 0.99^2 per echo
    p_echo = 1 - 0.99 ** 2
    assert abs(echoes_lost - 500 * p_echo) <= 4 * (500 * p_echo * (1 - p_echo)) ** 0.5 + 1, echoes_lost

    udp = udp_received(h1, h2, "40M", seconds=4)
    n, lost = udp["packets"], udp["lost_packets"]
    sigma = (n * 0.01 * 0.99) ** 0.5
    print(f"ping: {echoes_lost} of 500 echoes lost; udp: {lost} of {n} datagrams lost ({lost / n:.2%})")
    assert n > 10_000
    assert abs(lost - n * 0.01) <= 4 * sigma, (lost, n)
    assert udp["out_of_order"] == 0, "no reordering without jitter"
    d = lab.delay_stats()[0]["directions"]["h1->h2"]
    assert abs(d["lost"] - d["received"] * 0.01) <= 4 * (d["received"] * 0.01 * 0.99) ** 0.5, d
    assert d["overflow"] == d["socket_drops"] == d["send_errors"] == 0, d


def test_jitter_spreads_the_delay_and_may_reorder(built):
    lab = built(delay="20ms", jitter="2ms")
    h1, h2 = lab.hosts
    ping_ms(h1, "10.0.0.2", 1, 0.01)         # resolve h2's address first: ARP crosses the line too
    rtts, lost = ping_ms(h1, "10.0.0.2", 400, 0.01)
    assert lost == 0
    # each way 20 ms +- 2 ms, uniform: the round trip is triangular on 36..44 ms, shifted late by
    # the relay's own 0.3-0.5 ms, so the spread of its deciles is judged, not where they sit:
    # 4.42 ms expected, 0.19 ms standard error at 400 echoes
    r = sorted(rtts)
    spread = r[len(r) * 9 // 10] - r[len(r) // 10]
    print(f"jitter: deciles {r[len(r) // 10]} / {r[len(r) * 9 // 10]} ms, spread {spread:.2f} ms")
    assert r[0] >= 36.0 and 3.6 <= spread <= 5.5, (spread, r)
    assert abs(statistics.median(rtts) - RTT_MS) <= TOLERANCE_MS
    udp = udp_received(h1, h2, "40M", seconds=2)
    assert udp["out_of_order"] > 0, "frames 0.3 ms apart with +-2 ms of jitter overtake each other"


def _traces(run: str) -> dict:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {"netns": [l.split()[0] for l in netns.splitlines() if l.startswith(run + "-")],
            "links": [l for l in links.splitlines() if run in l],
            "state": (Path("/run/drl-lab") / run).exists()}


NOTHING = {"netns": [], "links": [], "state": False}


def test_nothing_is_left_after_a_lab_or_a_killed_owner():
    t = pair(new_run("dl"), delay="5ms", netem=False)
    with Lab(t) as lab:
        relay = lab.relays[0].pid
        assert sorted(_traces(t.run)["netns"]) == [f"{t.run}-dl-0", f"{t.run}-h1", f"{t.run}-h2"]
        assert Path(f"/proc/{relay}").exists()
    assert _traces(t.run) == NOTHING
    assert not Path(f"/proc/{relay}").exists()
    assert lab.delay_stats()[0]["directions"]["h1->h2"]["received"] >= 0   # the final counts outlive the Lab

    # the owner SIGKILLed: the relay lives on in its namespace until `drl-lab clean` (remove_run)
    run = new_run("dl")
    code = ("import time\nfrom drl.lab.netns import Lab\nfrom drl.lab.topology import pair\n"
            f"lab = Lab(pair({run!r}, delay='5ms', netem=False)).__enter__()\n"
            "print(lab.relays[0].pid, flush=True)\ntime.sleep(60)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        relay = int(owner.stdout.readline())
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert Path(f"/proc/{relay}").exists()
        remove_run(run)
        assert _traces(run) == NOTHING
        assert not Path(f"/proc/{relay}").exists() or "zombie" in Path(f"/proc/{relay}/status").read_text()
    finally:
        owner.kill()
        remove_run(run)
