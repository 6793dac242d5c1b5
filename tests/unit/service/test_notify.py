"""agent/service/notify.py against a real AF_UNIX datagram socket, as systemd's NOTIFY_SOCKET is."""
from __future__ import annotations

import os
import socket
import uuid

import pytest

from drl.agent.service.notify import Notifier, socket_address, watchdog_s


@pytest.fixture
def listener(tmp_path):
    """A bound datagram socket in tmp_path: (its NOTIFY_SOCKET value, a function returning what arrived)."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)

    def received() -> list[str]:
        out = []
        while True:
            try:
                out.append(sock.recv(4096).decode())
            except BlockingIOError:
                return out

    yield path, received
    sock.close()


def test_states_arrive_as_one_datagram_each(listener):
    path, received = listener
    note = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert note.ready() and note.reloading() and note.ready() and note.stopping()
    got = received()
    note.close()
    assert got[0] == "READY=1\nSTATUS=limiting" and got[2] == got[0] and got[3] == "STOPPING=1"
    reloading, stamp = got[1].split("\n")
    assert reloading == "RELOADING=1" and int(stamp.removeprefix("MONOTONIC_USEC=")) > 0


def test_an_abstract_socket_name_starts_with_a_nul():
    name = f"drl-test-{uuid.uuid4().hex}"
    assert socket_address("@" + name) == b"\0" + name.encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    try:
        Notifier.from_env({"NOTIFY_SOCKET": "@" + name}).ready()
        assert sock.recv(4096) == b"READY=1\nSTATUS=limiting"
    finally:
        sock.close()


def test_watchdog_beats_at_most_every_quarter_of_the_timeout(listener):
    path, received = listener
    note = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    assert note.watchdog_s == 2.0
    beats = [note.watchdog(t / 10) for t in range(0, 21)]         # a 100 ms tick for 2 s
    assert [t / 10 for t, beat in enumerate(beats) if beat] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert received() == ["WATCHDOG=1"] * 5


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({"WATCHDOG_USEC": "10000000"}, 10.0),
    ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "PID"}, 10.0),
    ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "1"}, None),      # meant for another process
])
def test_watchdog_usec_and_pid(env, expected):
    env = {k: v.replace("PID", str(os.getpid())) for k, v in env.items()}
    assert watchdog_s(env, os.getpid()) == expected


def test_without_notify_socket_nothing_is_sent_and_nothing_fails():
    note = Notifier.from_env({"WATCHDOG_USEC": "1000000"})
    assert not note.ready() and not note.watchdog(0.0) and not note.stopping()


def test_a_vanished_socket_is_not_an_error(tmp_path):
    note = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert note.ready() is False
