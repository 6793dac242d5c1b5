"""Replies made a slice at a time between ticks (service/slices.py) and streamed to the client:
a reply far longer than the connection timeout to make is read whole, and a status of many
classes never holds the loop past its tick."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from daemon_harness import FakeDatapath, file_agent
from drl.agent.service import control
from drl.agent.service.control import ControlServer, request
from drl.agent.service.slices import SLICE_S, Slices
from drl.agent.service.status import PART_CLASSES, agent_status, status_reply

HEAD = ('[agent]\nmax_classes = 65536\niface = "lo"\nnode_id = "a"\nlisten = "10.0.0.1:7470"\ninsecure = true\n'
        'interval = "{interval}"\nallocator = "static"\nenforce = "police"\n')


def many_classes(n: int, interval: str = "1s") -> str:
    return HEAD.format(interval=interval) + "".join(
        f'[[class]]\nname = "c{i}"\nmatch = "dst=10.0.{i // 256}.{i % 256}/32"\nglobal = "10mbit"\n' for i in range(n))


def test_slices_take_turns_and_stop_at_the_deadline():
    slices, done = Slices(), []

    def job(name, steps, cost_s):
        for i in range(steps):
            time.sleep(cost_s)
            done.append((name, i))
            yield
    slices.add(job("a", 3, 0.0))
    slices.add(job("b", 100, 0.002))
    slices.run(time.monotonic() + 0.0)      # at least one step, then the deadline
    assert done == [("a", 0)]
    slices.run(time.monotonic() + 0.02)
    assert done[1:5] == [("b", 0), ("a", 1), ("b", 1), ("a", 2)] and len(done) < 20
    while slices:
        slices.run(time.monotonic() + 1)
    assert len(done) == 103


def test_a_reply_slower_to_make_than_the_connection_timeout_is_read_whole(tmp_path, monkeypatch):
    """20,000 classes took longer than CONN_TIMEOUT_S, and the agent closed the connection on
    the 219 KB the client had not read yet: a reply still growing holds no clock."""
    monkeypatch.setattr(control, "CONN_TIMEOUT_S", 0.3)
    srv = ControlServer(str(tmp_path / "agent.sock"))
    parts = 400                     # ~1.2 s to make, 4 MB

    def slow(req):
        yield b'{"ok": true, "items": ['
        for i in range(parts):
            time.sleep(0.003)
            yield (b", " if i else b"") + json.dumps(["x" * 10_000, i]).encode()
        yield b"]}"
    stop, longest = threading.Event(), []

    def serve():
        while not stop.is_set():
            srv.handle_one({"status": slow})
            t = time.monotonic()
            srv.slices.run(t + SLICE_S)
            longest.append(time.monotonic() - t)
            stop.wait(0.001)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        t = time.monotonic()
        reply = request(srv.path, "status", timeout_s=1.0)
        took = time.monotonic() - t
    finally:
        stop.set()
        thread.join()
        srv.close()
    assert [i for _, i in reply["items"]] == list(range(parts)) and took > 0.3 * 2
    assert max(longest) < SLICE_S + 0.02, max(longest)     # each slice ends at its deadline (plus one part)


def test_the_streamed_status_is_the_status(tmp_path):
    agent, _ = file_agent(tmp_path, many_classes(3 * PART_CLASSES + 7), FakeDatapath())
    agent.tick(1.0)
    agent.tick(2.0)
    whole = agent_status(agent, time.monotonic())
    streamed = json.loads(b"".join(status_reply(agent)))
    assert streamed["ok"] is True
    for st in (whole, streamed["status"]):
        st.pop("uptime_s")
    assert streamed["status"] == whole and len(whole["classes"]) == 3 * PART_CLASSES + 7


def test_a_class_removed_while_its_status_is_made_is_left_out(tmp_path):
    agent, _ = file_agent(tmp_path, many_classes(2 * PART_CLASSES), FakeDatapath())
    agent.tick(1.0)
    parts = status_reply(agent)
    head, first = next(parts), next(parts)
    agent._apply_classes(agent.cfg.classes[:PART_CLASSES])      # a reload drops the second half
    st = json.loads(head + first + b"".join(parts))["status"]
    assert [c["name"] for c in st["classes"]] == [f"c{i}" for i in range(PART_CLASSES)]


# drlctl status without pause, in a process of its own (parsing MBs of JSON holds the GIL)
ASKER = """
import sys, time
from drl.agent.service.control import request
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    print(len(request(sys.argv[1], "status", timeout_s=5.0)["status"]["classes"]), flush=True)
"""


@pytest.mark.slow
def test_status_of_4000_classes_served_in_a_loop_keeps_every_tick_on_time(tmp_path, signals_kept):
    """The loop ticks every 500 ms while a client asks for the status of 4,000 classes without
    pause: made in one go (~0.4 s here) it made ticks 0.1-0.3 s late; between ticks, a tick
    starts within a slice of its due time."""
    agent, _ = file_agent(tmp_path, many_classes(4000, "500ms"), FakeDatapath())
    with agent:
        asker = subprocess.Popen([sys.executable, "-c", ASKER, agent.cfg.socket_path, "3.5"], stdout=subprocess.PIPE,
                                 text=True)
        stop = threading.Timer(4.0, lambda: setattr(agent, "stopping", True))
        stop.start()
        try:
            assert agent.serve() == 0
        finally:
            stop.cancel()
            out, _ = asker.communicate(timeout=10)
        late_ms = agent.tick_stats.as_dict()["late_max_ms"]
    replies = [int(n) for n in out.split()]
    assert len(replies) >= 3 and set(replies) == {4000}, replies
    assert late_ms < 0.1 * 500, late_ms
