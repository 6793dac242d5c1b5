"""A real agent scraped by a real Prometheus (Debian's /usr/bin/prometheus).

h1's agent limits its eth0 egress to 10 Mbit/s and serves ``--metrics`` on
10.0.0.1; a Prometheus server runs in h1's namespace too (scrapes go over lo,
so they are not policed traffic), scraping every second into a temporary
TSDB.  One iperf3 TCP flow h1 -> h2 runs through the limit, and
``rate(drl_passed_bytes_total[10s])`` from Prometheus's HTTP API is compared
with iperf3's own count over the same 10 s.

Like with like: the agent counts L2 frames (``skb->wire_len``: Ethernet, IP
and TCP headers of every segment), iperf3 counts payload written.  A bulk TCP
flow sends full-sized segments, each ``mss`` payload bytes in an
``mtu + 14``-byte frame, so iperf3's bytes become L2 bytes by that factor
(1514/1448).  Retransmissions need no term of their own: nearly all resend a
segment the limiter dropped (counted in ``drl_dropped_bytes_total``), so each
payload byte passes once.  The interface's tx counter would not do: on a veth
with GSO it counts one set of headers per 64 KB super-packet.  In steady state
(after slow start fills the send buffer) iperf3's per-second writes follow
the acknowledged data, so its seconds 3-13 are compared with the rate over
the same 10 s of wall clock.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import textwrap
import time
import urllib.parse

import pytest

from drl.lab.metrics import within
from drl.lab.netns import stop
from drl.lab.traffic import client_argv

pytestmark = pytest.mark.kernel

METRICS = "10.0.0.1:9470"
PROMETHEUS = "127.0.0.1:9090"       # inside h1's namespace
ETHERNET_HEADER = 14
WINDOW = (3, 13)                    # iperf3 seconds compared: after slow start, before the end


@contextlib.contextmanager
def prometheus(host, tmp_path):
    """A Prometheus server in ``host``'s namespace scraping the agent every second; always stopped."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (apt-get install prometheus; scripts/setup.sh does)")
    config = tmp_path / "prometheus.yml"
    config.write_text(textwrap.dedent(f"""\
        global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}
        scrape_configs:
          - job_name: drl
            static_configs: [{{targets: ["{METRICS}"]}}]
        """))
    proc = host.popen(binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                      f"--web.listen-address={PROMETHEUS}", "--log.level=warn", log=tmp_path / "prometheus.log")
    try:
        yield proc
    finally:
        stop(proc)


def query(host, promql: str, at: float | None = None) -> list[dict]:
    """An instant query through Prometheus's HTTP API (/api/v1/query), from inside ``host``."""
    params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
    out = host.run("curl", "-sf", "--max-time", "3", f"http://{PROMETHEUS}/api/v1/query?" + urllib.parse.urlencode(params))
    reply = json.loads(out)
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


def wait_scraped(host, timeout_s: float) -> None:
    """Until Prometheus has scraped the agent successfully (its startup takes a few seconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if [r["value"][1] for r in query(host, 'up{job="drl"}')] == ["1"]:
                return
        time.sleep(0.3)
    pytest.fail(f"Prometheus did not scrape the agent within {timeout_s:g} s")


def iperf3_l2_Bps(report: dict, mtu: int) -> float:
    """iperf3's sender bytes over WINDOW as L2 bytes/s (see the module docstring)."""
    mss = report["start"]["tcp_mss_default"]
    payload = sum(iv["sum"]["bytes"] for iv in report["intervals"] if WINDOW[0] <= round(iv["sum"]["start"]) < WINDOW[1])
    return payload * (mtu + ETHERNET_HEADER) / mss / (WINDOW[1] - WINDOW[0])


def test_prometheus_rate_of_passed_bytes_matches_iperf3(net, cluster, server, tmp_path):
    h1, h2 = net.hosts
    with prometheus(h1, tmp_path):      # starts while bcc compiles the agent's program
        agent = cluster(net).start(h1, [], "static", "10mbit", "--metrics", METRICS)
        wait_scraped(h1, 20)
        body = h1.run("curl", "-sf", "--max-time", "3", f"http://{METRICS}/metrics")
        lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True)
        assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint.stdout + lint.stderr
        started = time.time()
        client = h1.popen(*client_argv(h2.addr4, server.port, WINDOW[1] + 1, 1, "-J", cc="cubic"), capture=True)
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        time.sleep(1.5)                 # one more scrape after the window's end
        at = started + WINDOW[1]
        prom = query(h1, 'rate(drl_passed_bytes_total{class="default"}[10s])', at)
        drops = query(h1, 'sum(drl_dropped_bytes_total{class="default"}) by (reason)')
        status = agent.status()
    prom_Bps = float(prom[0]["value"][1])
    mtu = int(h1.run("cat", "/sys/class/net/eth0/mtu"))
    iperf_Bps = iperf3_l2_Bps(json.loads(out), mtu)
    print(f"prometheus rate {prom_Bps * 8 / 1e6:.3f} Mbit/s, iperf3 (L2) {iperf_Bps * 8 / 1e6:.3f} Mbit/s, "
          f"ratio {prom_Bps / iperf_Bps:.4f}; drops by reason {drops}")
    assert within(prom_Bps, iperf_Bps, 0.10), (prom_Bps, iperf_Bps)
    assert within(prom_Bps, 10e6 / 8, 0.10), prom_Bps                     # and the limit holds
    assert {r["metric"]["reason"] for r in drops} == {"bucket", "random_drop", "quota"}
    assert status["tick"]["count"] > 0 and status["dropped_bytes"] == sum(status["dropped_bytes_by_reason"].values())


def test_a_busy_metrics_port_is_one_line_and_nothing_attached(net, cluster):
    h1, _ = net.hosts
    host, port = METRICS.split(":")
    hold = h1.popen("python3", "-c", f"import socket,time; s=socket.socket(); s.bind(('{host}', {port})); s.listen();"
                                     "print('bound', flush=True); time.sleep(60)", capture=True)
    try:
        assert hold.stdout.readline().strip() == "bound"
        argv = cluster(net).argv(h1, [], "static", "10mbit", "--metrics", METRICS)
        out = subprocess.run(h1.argv(*argv), capture_output=True, text=True, timeout=60)
    finally:
        stop(hold)
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot serve metrics on {METRICS}: port already in use" in lines[0], out.stderr
    assert "clsact" not in h1.run("tc", "qdisc", "show", "dev", "eth0")
