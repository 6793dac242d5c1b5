"""agent/service/control.py: the Unix control socket drlctl talks to."""
from __future__ import annotations

import socket
import threading

import pytest

from drl.agent.service.control import ControlError, ControlServer, request


@pytest.fixture
def server(tmp_path):
    srv = ControlServer(str(tmp_path / "agent.sock"))
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            srv.handle_one({"status": lambda req: {"ok": True, "status": {"node_id": "n1"}},
                            "boom": lambda req: {"ok": False, "error": "the agent says no"}})
            stop.wait(0.01)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv
    stop.set()
    thread.join()
    srv.close()


def test_status_round_trip(server):
    assert request(server.path, "status") == {"ok": True, "status": {"node_id": "n1"}}


def test_refusals_and_unknown_commands_are_control_errors(server):
    with pytest.raises(ControlError, match="the agent says no"):
        request(server.path, "boom")
    with pytest.raises(ControlError, match="unknown command 'dance'"):
        request(server.path, "dance")


def test_no_agent_names_the_path(tmp_path):
    with pytest.raises(ControlError, match="no agent socket at .*missing.sock"):
        request(str(tmp_path / "missing.sock"), "status")


def test_a_second_server_on_a_live_socket_is_refused(server):
    with pytest.raises(ControlError, match="already running"):
        ControlServer(server.path)


def test_a_stale_socket_file_is_replaced_and_close_removes_it(tmp_path):
    path = tmp_path / "agent.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))            # a crashed agent's leftover: the file, nobody listening
    dead.close()
    with pytest.raises(ControlError, match="stale socket"):
        request(str(path), "status")
    srv = ControlServer(str(path))
    assert path.exists() and oct(path.stat().st_mode & 0o777) == "0o600"
    srv.close()
    assert not path.exists()


def test_a_socket_directory_that_cannot_be_made_is_a_control_error(tmp_path):
    """A ControlError is drl-agent's startup_failed line; an OSError here was logged as a crash."""
    (tmp_path / "afile").write_text("")
    with pytest.raises(ControlError, match="cannot create control socket .*afile: File exists"):
        ControlServer(str(tmp_path / "afile" / "agent.sock"))


# -- a hostile or stuck client costs the agent nothing ---------------------------------------

def raw(path: str, data: bytes) -> dict:
    """Send ``data`` as it is, read the reply."""
    import json
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3.0)
    with s:
        s.connect(path)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        return json.loads(b"".join(iter(lambda: s.recv(65536), b"")))


@pytest.mark.parametrize("data, error", [
    (b"[" * 1500, "nested too deep"),                # crashed the agent: an uncaught RecursionError
    (b'{"cmd": "status", "x": "' + b"a" * 5000 + b'"}\n', "longer than 4096 bytes"),
    (b"{not json\n", "unreadable request"),
    (b"\xff\xfe\n", "unreadable request"),
    (b"[1, 2]\n", "a request is a JSON object"),
    (b'{"cmd": ["status"]}\n', "unknown command"),
])
def test_a_malformed_request_is_an_error_reply_and_the_server_goes_on(server, data, error):
    reply = raw(server.path, data)
    assert reply["ok"] is False and error in reply["error"] and "\n" not in reply["error"]
    assert request(server.path, "status")["ok"]


def test_a_handler_that_raises_is_an_error_reply_naming_the_command(tmp_path):
    srv = ControlServer(str(tmp_path / "agent.sock"))

    def broken(req):
        raise OverflowError("cannot convert float infinity to integer")
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(srv.path)
        s.sendall(b'{"cmd": "set"}\n')
        for _ in range(3):
            srv.handle_one({"set": broken})
        assert s.recv(4096) == b'{"ok": false, "error": "set: cannot convert float infinity to integer"}'
    finally:
        s.close()
        srv.close()


def test_an_idle_client_never_holds_the_server(tmp_path):
    """Each idle connection held the tick loop for 1 s."""
    import time
    srv = ControlServer(str(tmp_path / "agent.sock"))
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(4)]
    try:
        for s in idle:
            s.connect(srv.path)
        idle[0].sendall(b'{"cmd": "sta')                  # half a request, then nothing
        start = time.monotonic()
        for _ in range(20):
            srv.handle_one({"status": lambda req: {"ok": True}})
        assert time.monotonic() - start < 0.05
    finally:
        for s in idle:
            s.close()
        srv.close()


def test_idle_clients_do_not_keep_another_from_its_answer(server):
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(4)]
    try:
        for s in idle:
            s.connect(server.path)
        assert request(server.path, "status", timeout_s=0.5)["ok"]
    finally:
        for s in idle:
            s.close()


def test_connections_beyond_the_cap_close_the_oldest(tmp_path):
    from drl.agent.service import control
    srv = ControlServer(str(tmp_path / "agent.sock"))
    socks = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(control.MAX_CONNS + 3)]
    try:
        for s in socks:
            s.connect(srv.path)
            srv.handle_one({})
        assert len(srv._conns) == control.MAX_PER_PEER      # one process: its own cap (test_control_churn.py)
        socks[0].settimeout(1.0)
        assert socks[0].recv(10) == b""                      # closed by the agent
    finally:
        for s in socks:
            s.close()
        srv.close()


def test_an_idle_client_costs_the_daemons_tick_loop_nothing(tmp_path, signals_kept):
    """Four idle clients for 20 s let the agent tick 28 times instead of ~230: an idle client
    connected for 2 s while the agent ticks every 100 ms must leave >= 15 ticks."""
    import time
    from daemon_harness import FakeDatapath, agent, config
    cfg = config(tmp_path, "--global", "12mbit", "--allocator", "static", "--interval", "100ms")
    with agent(cfg, FakeDatapath()) as a:
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stop = threading.Timer(2.0, lambda: setattr(a, "stopping", True))
        try:
            idle.connect(cfg.socket_path)
            stop.start()
            start = time.monotonic()
            assert a.serve() == 0
            assert time.monotonic() - start < 2.5
        finally:
            stop.cancel()
            idle.close()
        assert a.ticks >= 15


def test_an_agent_that_dies_before_its_reply_is_a_control_error(tmp_path):
    """An agent killed with our request unread resets the connection: callers that poll a dying
    agent (the lab's status poller) get the one-line error, not ConnectionResetError."""
    path = str(tmp_path / "dying.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def die():
        conn, _ = srv.accept()
        conn.recv(1, socket.MSG_PEEK)      # the request has arrived; closing now leaves it unread
        conn.close()

    thread = threading.Thread(target=die, daemon=True)
    thread.start()
    try:
        with pytest.raises(ControlError, match="closed the connection before its reply"):
            request(path, "status", timeout_s=2.0)
    finally:
        thread.join()
        srv.close()


def _full_queue(path: str) -> tuple[socket.socket, list[socket.socket]]:
    """A listener that never accepts, its accept queue filled (an agent compiling at start)."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(0)
    queued = []
    while True:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            c.connect(path)
        except BlockingIOError:
            c.close()
            return srv, queued
        queued.append(c)


def test_a_full_accept_queue_is_waited_out_then_a_control_error(tmp_path):
    """connect() on a full queue fails at once with EAGAIN: the client waits for room up to its
    timeout and then says the agent did not answer, never BlockingIOError."""
    path = str(tmp_path / "busy.sock")
    srv, queued = _full_queue(path)
    try:
        with pytest.raises(ControlError, match="did not answer within 0.3 s"):
            request(path, "status", timeout_s=0.3)
    finally:
        for c in queued:
            c.close()
        srv.close()


def test_a_client_gets_its_answer_once_the_agent_drains_its_queue(tmp_path):
    path = str(tmp_path / "late.sock")
    srv, queued = _full_queue(path)

    def start_late():      # the agent's loop begins: it accepts what queued, then answers
        threading.Event().wait(0.3)
        srv.settimeout(3.0)
        for _ in range(len(queued) + 1):
            conn, _ = srv.accept()
            if conn.recv(4096):
                conn.sendall(b'{"ok": true, "status": {"node_id": "n1"}}\n')
            conn.close()

    thread = threading.Thread(target=start_late, daemon=True)
    thread.start()
    try:
        for c in queued:       # the clients that gave up while it compiled
            c.close()
        assert request(path, "status", timeout_s=2.0)["status"] == {"node_id": "n1"}
    finally:
        thread.join(5.0)
        srv.close()


def test_a_busy_agent_with_a_full_queue_is_still_a_live_agent(tmp_path):
    """A second agent on the socket of one that compiles must neither hang nor take its socket."""
    path = str(tmp_path / "busy.sock")
    srv, queued = _full_queue(path)
    try:
        with pytest.raises(ControlError, match="another agent is already running"):
            ControlServer(path)
    finally:
        for c in queued:
            c.close()
        srv.close()
