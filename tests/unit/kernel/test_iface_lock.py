"""Without a kernel datapath: the interface lock (agent/kernel/lock.py), the gossip mark's
option and checks, and the netlink parse of ensure_attached (agent/kernel/attach.py)."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys

import click
import pytest

from drl.agent import abi
from drl.agent.kernel import lock
from drl.agent.config.build import ConfigError, _gossip_mark
from drl.cli.agent import MARK, up


def test_the_lock_is_named_by_namespace_inode_and_ifindex(tmp_path):
    assert lock.lock_path(3, 4026531840, tmp_path) == tmp_path / "iface-4026531840-3.lock"
    assert lock.lock_path(3, 1, tmp_path) != lock.lock_path(3, 2, tmp_path) != lock.lock_path(4, 2, tmp_path)
    assert lock.netns_inode() == os.stat("/proc/self/ns/net").st_ino
    with pytest.raises(ValueError):
        lock.lock_path(0, 1, tmp_path)


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    held = lock.InterfaceLock.take("eth0", 7, directory=tmp_path)
    with pytest.raises(lock.LockError, match=rf"another drl-agent \(pid {os.getpid()}\) already runs on eth0"):
        lock.InterfaceLock.take("eth0", 7, directory=tmp_path)
    lock.InterfaceLock.take("eth1", 8, directory=tmp_path).release()      # another interface: free
    held.release()
    lock.InterfaceLock.take("eth0", 7, directory=tmp_path).release()       # released: free again
    assert oct(os.stat(held.path).st_mode & 0o777) == "0o600"


def test_a_lock_left_by_a_killed_process_does_not_block_a_restart(tmp_path):
    code = ("import sys, time; from drl.agent.kernel import lock; "
            "lock.InterfaceLock.take('eth0', 7, directory=sys.argv[1]); print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(lock.LockError, match=f"pid {proc.pid}"):
            lock.InterfaceLock.take("eth0", 7, directory=tmp_path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lock.InterfaceLock.take("eth0", 7, directory=tmp_path).release()       # the file is still there; the lock is not


def test_an_unusable_lock_directory_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(lock.LockError, match="cannot create the interface lock"):
        lock.InterfaceLock.take("eth0", 7, directory=tmp_path / "file")


def test_gossip_mark_option_takes_hex_or_decimal_and_refuses_zero():
    assert MARK.convert("0xd1d10000", None, None) == 0xD1D10000 == MARK.convert(str(0xD1D10000), None, None)
    assert MARK.convert(0x10, None, None) == 0x10                            # from a TOML file
    for bad in ("0", "0x100000000", "-1", "mark"):
        with pytest.raises(click.BadParameter):
            MARK.convert(bad, None, None)
    opts = up.make_context("up", ["--iface", "lo", "--global", "10mbit"]).params
    assert opts["gossip_mark"] == abi.GOSSIP_MARK
    assert up.make_context("up", ["--gossip-mark", "0x42"]).params["gossip_mark"] == 0x42
    assert _gossip_mark(None) == abi.GOSSIP_MARK
    with pytest.raises(ConfigError, match="gossip-mark"):
        _gossip_mark(0)


def test_the_default_mark_leaves_the_low_bits_others_use_alone():
    """kube-proxy 0x4000/0x8000, wg-quick 0xca6c, firewalld: all in the low 16 bits."""
    assert abi.GOSSIP_MARK & 0xFFFF == 0 and abi.GOSSIP_MARK >> 16 == 0xD1D1


def test_gossip_exemption_checks():
    from drl.agent.kernel.datapath import DatapathError, _gossip_exemption
    assert _gossip_exemption(None, abi.GOSSIP_MARK) == (0, 0)               # no gossip socket: nothing exempt
    assert _gossip_exemption(7470, 5) == (7470, 5)
    for port, mark in ((0, 5), (65536, 5), (7470, 0), (7470, 2**32)):
        with pytest.raises(DatapathError):
            _gossip_exemption(port, mark)


class FakeNetlink:
    """Answers one dump with the given messages (the request's seq copied in), then DONE."""

    def __init__(self, filters):
        self.filters, self.replies = filters, []

    def send(self, req):
        seq = struct.unpack_from("=I", req, 8)[0]
        msgs = b"".join(_filter_msg(seq, *f) for f in self.filters)
        self.replies = [msgs, struct.pack("=IHHII", 20, 3, 2, seq, 0) + bytes(4)]

    def recv(self, n):
        return self.replies.pop(0)


def _attr(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + bytes(-len(payload) % 4)


def _filter_msg(seq: int, handle: int, prio: int, kind: bytes, prog_id: int | None) -> bytes:
    opts = _attr(7, b"drl_egress\0") + (_attr(11, struct.pack("=I", prog_id)) if prog_id is not None else b"")
    body = struct.pack("=BxxxiIII", 0, 2, handle, 0xFFFFFFF3, prio << 16 | 0x0300)
    body += _attr(1, kind + b"\0") + _attr(2 | 0x8000, opts)
    return struct.pack("=IHHII", 16 + len(body), 44, 2, seq, 0) + body


def test_the_egress_dump_finds_our_programs_id_and_the_filters_ahead_of_it():
    from drl.agent.kernel import filters
    from drl.agent.kernel.attach import FILTER_HANDLE, FILTER_PRIO
    assert filters.dump(FakeNetlink([]), 2, 0xFFFFFFF3) == []
    found = [(0, FILTER_PRIO, b"bpf", None), (FILTER_HANDLE, 7, b"bpf", 11), (0, 7, b"bpf", None),
             (0x800, 1, b"u32", None), (FILTER_HANDLE, FILTER_PRIO, b"bpf", 42), (1, FILTER_PRIO + 1, b"u32", None)]
    dumped = filters.dump(FakeNetlink(found), 2, 0xFFFFFFF3)
    assert filters.find(dumped, FILTER_PRIO, FILTER_HANDLE).prog == 42
    assert filters.ahead(dumped, FILTER_PRIO, FILTER_HANDLE) == (1, 7)       # behind ours (prio 210) runs never
    dumped = filters.dump(FakeNetlink([(FILTER_HANDLE, FILTER_PRIO, b"u32", 42)]), 2, 0xFFFFFFF3)
    assert filters.find(dumped, FILTER_PRIO, FILTER_HANDLE).prog is None     # not a bpf program: no id
