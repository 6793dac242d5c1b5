"""20,000 classes in a real agent: `drlctl status --json` answers whole, and serving it holds no tick.

Made in one go, a status of 20,000 classes held the loop for seconds (21 s before the shaper's
rates were read once per status): ticks went late, the kernel fell back to its safe rate and
peers marked the agent stale, and the connection's timeout cut the reply.  It is now made a
slice at a time between ticks and streamed (agent/service/slices.py, control.py)."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from drl.lab.agents import READY_TIMEOUT_S, Agent, drl_agent, installed

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

N_CLASSES = 20_000
INTERVAL_S = 1.0        # a tick of 20,000 classes takes 0.6-1.1 s here


def config(n: int) -> str:
    head = f'[agent]\nallocator = "static"\ninterval = "{INTERVAL_S:g}s"\nmax_classes = {n}\nenforce = "police"\n'
    return head + "".join(f'[[class]]\nname = "c{i}"\nglobal = "10mbit"\nmatch = "dst=10.64.{i // 256}.{i % 256}/32"\n'
                          for i in range(n))


def test_status_of_20000_classes_is_whole_and_no_tick_is_late_while_it_is_served(net, tmp_path):
    h1 = net.hosts[0]
    (tmp_path / "drl.toml").write_text(config(N_CLASSES))
    sock, log = str(tmp_path / "a.sock"), tmp_path / "agent.log"
    proc = h1.popen(drl_agent(), "up", "--iface", "eth0", "--config", str(tmp_path / "drl.toml"), "--socket", sock,
                    "--state-dir", str(tmp_path), log=log)
    agent = Agent(h1.name, sock, proc, log)
    agent.wait_ready(time.monotonic() + READY_TIMEOUT_S)
    t = time.monotonic()
    out = subprocess.run([installed("drlctl"), "--socket", sock, "status", "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert len(st["classes"]) == N_CLASSES and {c["name"] for c in st["classes"]} == {f"c{i}" for i in range(N_CLASSES)}
    print(f"drlctl status --json: {len(out.stdout) / 1e6:.1f} MB in {time.monotonic() - t:.1f} s, "
          f"last tick {st['tick']['last_s']:.2f} s")
    late_ms = agent.status()["tick"]["late_max_ms"]     # since start: the status above was served meanwhile
    print(f"tick late_max_ms {late_ms:.0f}")
    # the goal is 2 intervals; made in one go the status held the loop 1.5-2.5 s here, made a 10-ms
    # slice at a time between ticks of ~0.6 s it leaves them ~1 ms late quiet, 511 ms in a loaded CI
    # run (ticks of 0.6 s of work at 1 s leave little slack): one interval fails the one-go build
    assert late_ms <= INTERVAL_S * 1000, late_ms
    agent.kill(15)
