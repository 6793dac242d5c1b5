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
