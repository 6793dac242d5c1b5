"""agent/gossip/wire.py: schema freshness, round trips, every rejection reason, fuzzing, replay window, key files."""
from __future__ import annotations

import hashlib
import hmac
import importlib.util
import logging
import math
import os
import pathlib
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from drl.agent import units
from drl.agent.clients.reports import MAX_BAN_NOTES, REPORT_K, BanNote, ClientReport
from drl.agent.model import LeaseGrant, LeaseRequest, Report, Transfer, TransferAck
from drl.agent.gossip import drl_pb2
from drl.agent.gossip.keys import KeyFileError, load_key
from drl.agent.gossip.lives import SeqWindow
from drl.agent.gossip.wire import (MAX_DATAGRAM, MAX_SUM_NODES, MAX_VALUE, TAG_BYTES, Batch, ClassClients, ClassValue,
                                   ClientReports, Header, LimitNote, Message, Reason, Sums, SumKind, decode, encode,
                                   pack_reports, pack_sums)

ROOT = pathlib.Path(__file__).resolve().parents[3]
KEY = b"k" * 32
CLUSTER = "prod"


def header(**kw) -> Header:
    base = dict(cluster=CLUSTER, node="10.0.0.1:7000", dst="10.0.0.2:7000", class_id=1, seq=42,
                sent_at=1234.5, incarnation=1_760_000_000_000)
    return Header(**{**base, **kw})


def update(value: float) -> Batch:
    """One class's value, as the agent gossips it."""
    return Batch((ClassValue(key=0xC0FFEE, seq=9, value=value, version=2, local_Bps=625_000.0),))


def clients(v6_len: int = 64) -> ClientReports:
    """Two classes' per-client reports: IPv4 and IPv6 clients, a ban and a tombstone (counts
    and times float32-exact: they travel as 4-byte floats)."""
    v6 = bytes.fromhex("20010db8000700000000000000000000")
    report = ClientReport((24, v6_len), ((bytes([198, 51, 100, 0]), 250_000.0), (v6, 1.5)),
                          (BanNote(bytes([203, 0, 113, 0]), 3, 59.5), BanNote(v6, 2**40, 10.25, lifted=True)))
    return ClientReports((ClassClients(0xC0FFEE, report), ClassClients(7, ClientReport((32, 64)))))


PAYLOADS = [update(1_250_000.0), update(0.0), Batch(), Batch((), (LimitNote(5, 2, 1.25e6),)), Transfer(7, 1e6, 3e6),
            TransferAck(7, False, 3e6), TransferAck(8, True, 0.0), LeaseRequest(5e5),
            LeaseGrant(4e5, 10.0, 2.5), Report(1e9, 2e9), clients(), clients(v6_len=128),
            Sums(SumKind.LEAF, 1, ((7, 2.5), (0xC0FFEE, 1.25e6))), Sums(SumKind.LEAF, 0),
            Sums(SumKind.PARTIAL, 32, ((7, 80.0),), ("n0000", "n0032")), Sums(SumKind.TOTAL, 999, ((7, 1e-300),))]


def test_checked_in_code_is_current(tmp_path):
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpc_tools missing: pip install grpcio-tools==1.85.1")
    subprocess.run([str(ROOT / "scripts/gen_proto.sh"), str(tmp_path)], check=True,
                   env={**os.environ, "PYTHON": sys.executable})
    assert (tmp_path / "drl_pb2.py").read_text() == (ROOT / "agent/gossip/drl_pb2.py").read_text(), \
        "agent/gossip/drl_pb2.py is stale: run scripts/gen_proto.sh"


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
@pytest.mark.parametrize("key", [KEY, None], ids=["hmac", "insecure"])
def test_round_trip(payload, key):
    msg = Message(header(), payload)
    assert decode(encode(msg, key), key, CLUSTER) == msg


def test_update_size():
    """Measured: the paper's update is 48 B with IP+UDP ([Raghavan07] §3.1);
    ours is header + one class's value + 32-byte tag; the numbers go into bench/RESULTS.md."""
    ours = encode(Message(header(), update(1_250_000.0)), KEY)
    insecure = encode(Message(header(), update(1_250_000.0)), None)
    assert len(ours) == len(insecure) + TAG_BYTES
    assert len(ours) == 116     # with 13-character node ids for sender and receiver
    short = encode(Message(header(node="n1", dst="n2", cluster="c", seq=9), update(1.5)), KEY)
    assert len(short) == 91


def valid() -> bytes:
    return encode(Message(header(), update(1.0)), KEY)


def authentic(body: bytes) -> bytes:
    """Bytes with a valid tag, as only a key holder could make them."""
    return body + hmac.new(KEY, body, hashlib.sha256).digest()


def forged_value(value: float) -> bytes:
    """A Batch whose value the encoder would have clamped, built past it by a key holder."""
    dg = drl_pb2.Datagram.FromString(encode(Message(header(), update(1.0)), None))
    dg.batch.values[0] = value
    return authentic(dg.SerializeToString())


@pytest.mark.parametrize("data,reason", [
    (b"x" * (MAX_DATAGRAM + 1), Reason.OVERSIZED),
    (b"", Reason.TRUNCATED),
    (b"x" * TAG_BYTES, Reason.TRUNCATED),
    (valid()[:-1], Reason.FORGED),
    (valid()[:-1] + bytes([valid()[-1] ^ 1]), Reason.FORGED),
    (bytes([valid()[0] ^ 0x40]) + valid()[1:], Reason.FORGED),
    (encode(Message(header(), update(1.0)), b"w" * 32), Reason.FORGED),
    (encode(Message(header(), update(1.0)), None), Reason.FORGED),
    (authentic(b"\xff\xff\xff"), Reason.GARBAGE),
    (authentic(b"\x1a\x00"), Reason.GARBAGE),
    (forged_value(math.nan), Reason.OUT_OF_RANGE),
    (encode(Message(header(), LeaseGrant(math.inf, 1.0, 1.0)), KEY), Reason.OUT_OF_RANGE),
    (encode(Message(header(node=""), update(1.0)), KEY), Reason.GARBAGE),
    (encode(Message(header(seq=0), update(1.0)), KEY), Reason.GARBAGE),
    (encode(Message(header(version=1), update(1.0)), KEY), Reason.UNKNOWN_VERSION),
    (encode(Message(header(cluster="staging"), update(1.0)), KEY), Reason.WRONG_CLUSTER),
], ids=["oversized", "empty", "tag-only", "cut", "tag-bit", "body-bit", "wrong-key", "untagged",
        "junk", "no-header", "nan", "inf", "no-node", "seq0", "version", "cluster"])
def test_rejections(data, reason):
    assert decode(data, KEY, CLUSTER) is reason


def test_insecure_mode_rejects_garbage_and_headerless():
    assert decode(b"", None, CLUSTER) is Reason.TRUNCATED
    assert decode(b"\xff\xff", None, CLUSTER) is Reason.GARBAGE
    payload_only = encode(Message(header(), update(1.0)), None)[-20:]   # the batch field alone
    assert decode(payload_only, None, CLUSTER) is Reason.GARBAGE


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=MAX_DATAGRAM + 8))
def test_fuzz_arbitrary_bytes_never_raise(data):
    assert isinstance(decode(data, KEY, CLUSTER), Reason)       # no forgery by chance
    assert isinstance(decode(data, None, CLUSTER), (Message, Reason))


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(PAYLOADS), st.data())
def test_fuzz_mutated_datagrams(payload, data):
    good = encode(Message(header(), payload), KEY)
    pos = data.draw(st.integers(0, len(good) - 1))
    mutation = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
    byte = data.draw(st.integers(1, 255))
    bad = {"flip": good[:pos] + bytes([good[pos] ^ byte]) + good[pos + 1:],
           "cut": good[:pos],
           "insert": good[:pos] + bytes([byte]) + good[pos:],
           "delete": good[:pos] + good[pos + 1:]}[mutation]
    assert isinstance(decode(bad, KEY, CLUSTER), Reason)
    # Without a MAC, mutations may parse; they must still never raise.
    insecure = encode(Message(header(), payload), None)
    cut = insecure[:pos % len(insecure)] + bytes([byte]) + insecure[pos % len(insecure) + 1:]
    assert isinstance(decode(cut, None, CLUSTER), (Message, Reason))


def test_window_in_order_loss_reorder_replay():
    w = SeqWindow()
    assert w.accept(10) == 0          # first seen starts the window, no loss before it
    assert w.accept(9) is None
    assert w.accept(11) == 0
    assert w.accept(14) == 2          # 12 and 13 lost ...
    assert w.accept(12) == -1         # ... until 12 turns up late
    assert w.accept(12) is None       # replay
    assert w.accept(14) is None
    assert w.accept(14 - SeqWindow.SIZE) is None      # left of the window
    assert w.accept(13) == -1
    assert w.accept(200) == 185       # a long outage
    assert w.accept(199) == -1


def test_a_seq_far_ahead_moves_the_window_without_building_its_shift():
    """An authenticated datagram 2^41 ahead once made the agent exit with MemoryError."""
    w = SeqWindow()
    assert w.accept(5) == 0
    assert w.accept(5 + (1 << 41)) == (1 << 41) - 1
    assert w.bits == 1 and w.accept(5 + (1 << 41)) is None
    assert w.accept((1 << 64) - 1) is not None       # the uint64 seq's last value
    assert w.accept(5) is None


@given(st.lists(st.integers(1, 300), max_size=200))
def test_window_accepts_each_seq_at_most_once_and_loss_is_consistent(seqs):
    w, accepted, lost = SeqWindow(), set(), 0
    for seq in seqs:
        delta = w.accept(seq)
        if delta is not None:
            assert seq not in accepted
            accepted.add(seq)
            lost += delta
    if accepted:
        span = max(accepted) - min(accepted) + 1
        assert lost == span - len(accepted)


def test_load_key(tmp_path, caplog):
    path = tmp_path / "drl.key"
    path.write_bytes(b"  c2VjcmV0LXNlY3JldC1zZWNyZXQ=\n")
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="drl.keys"):
        assert load_key(path) == b"c2VjcmV0LXNlY3JldC1zZWNyZXQ="
        assert not caplog.records
        path.chmod(0o644)
        load_key(path)
    assert "readable by every user" in caplog.text


@pytest.mark.parametrize("setup,message", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "is not readable: Is a directory"),
    (lambda p: os.mkfifo(p), "is not a regular file"),            # opening it must not wait for a writer
    (lambda p: p.symlink_to("/dev/zero"), "is not a regular file"),   # nor read until memory runs out
    (lambda p: p.write_bytes(b"k" * 5000), "larger than 4096 bytes"),
    (lambda p: p.write_bytes(b" \n"), "is empty"),
    (lambda p: p.write_bytes(b"short\n"), "holds 5 bytes; need at least 16"),
])
def test_load_key_errors(tmp_path, setup, message):
    path = tmp_path / "drl.key"
    setup(path)
    with pytest.raises(KeyFileError, match=message) as err:
        load_key(path)
    assert "\n" not in str(err.value)


def test_the_module_example_runs():
    import doctest

    import drl.agent.gossip.wire
    assert doctest.testmod(drl.agent.gossip.wire).failed == 0


def test_the_longest_client_report_fits_one_datagram_behind_the_longest_header():
    """docs/clients.md "Report size": 32 IPv6 /128 clients and 6 IPv6 tombstones with 64-bit
    versions, behind 64-character cluster and node ids and 64-bit sequence and incarnation."""
    v6 = [bytes([0xFF] * 16)] * REPORT_K
    report = ClientReport((32, 128), tuple((c, 3.4e38) for c in v6),
                          tuple(BanNote(bytes([0xFF] * 16), 2**64 - 1, 3.4e38, True) for _ in range(MAX_BAN_NOTES)))
    long = header(cluster="c" * 64, node="n" * 64, dst="d" * 64, seq=2**64 - 1, incarnation=2**64 - 1,
                  class_id=0)
    data = encode(Message(long, ClientReports((ClassClients(2**32 - 1, report),))), KEY)
    assert len(data) <= MAX_DATAGRAM
    assert decode(data, KEY, "c" * 64) is Reason.OUT_OF_RANGE       # the longest encodings are beyond the bounds
    report = ClientReport((32, 128), tuple((c, float(units.MAX_AMOUNT)) for c in v6),
                          tuple(BanNote(bytes([0xFF] * 16), units.MAX_VERSION - 1, 3e8, True)
                                for _ in range(MAX_BAN_NOTES)))
    data = encode(Message(long, ClientReports((ClassClients(2**32 - 1, report),))), KEY)
    assert decode(data, KEY, "c" * 64).payload.reports[0].report.counts[0][0] == v6[0]


_client = st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16))
_report = st.builds(
    lambda counts, bans: ClientReport((32, 128), tuple(counts), tuple(bans)),
    st.lists(st.tuples(_client, st.integers(0, 2**20).map(float)), max_size=REPORT_K),
    st.lists(st.builds(BanNote, _client, st.integers(1, units.MAX_VERSION - 1), st.integers(1, 2**20).map(float),
                       st.booleans()), max_size=MAX_BAN_NOTES))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), _report), max_size=12))
def test_client_reports_are_packed_into_datagrams_that_fit_and_carry_each_report_once(reports):
    entries = [ClassClients(key, r) for key, r in reports]
    h = header(dst="", class_id=0)
    room = MAX_DATAGRAM - len(encode(Message(h, Batch()), KEY))
    out = []
    for payload in pack_reports(entries, room):
        data = encode(Message(h, payload), KEY)
        assert len(data) <= MAX_DATAGRAM and payload.reports
        out += decode(data, KEY, CLUSTER).payload.reports
    # the wire keeps IPv4 and IPv6 clients in arrays of their own: each family's order stays
    by_family = [ClassClients(e.key, ClientReport(e.report.lengths, tuple(sorted(e.report.counts,
                 key=lambda cv: len(cv[0]))), e.report.bans)) for e in entries]
    assert out == by_family


@pytest.mark.parametrize("body", [
    Transfer(7, -1e6, 3e6), Transfer(7, 1e6, -3e6), Transfer(7, math.nan, 0.0), TransferAck(7, True, -1.0),
    LeaseRequest(-5e5), LeaseRequest(1e300), LeaseGrant(-4e5, 10.0, 2.5), LeaseGrant(1e300, 10.0, 2.5),
    LeaseGrant(4e5, -10.0, 2.5), LeaseGrant(4e5, 1e300, 2.5), LeaseGrant(4e5, 10.0, math.inf),
    Report(-1e9, 2e9), Report(1e9, -2e9), Report(1e300, 0.0),
])
def test_a_body_number_that_is_negative_or_beyond_its_ceiling_is_out_of_range(body):
    assert decode(encode(Message(header(), body), KEY), KEY, CLUSTER) is Reason.OUT_OF_RANGE


def _report_with(count: float = 1.0, version: int = 3, remaining_s: float = 59.5) -> ClientReports:
    report = ClientReport((24, 64), ((bytes([198, 51, 100, 0]), count),),
                          (BanNote(bytes([203, 0, 113, 0]), version, remaining_s),))
    return ClientReports((ClassClients(7, report),))


@pytest.mark.parametrize("payload", [
    _report_with(count=-1.0), _report_with(count=math.inf), _report_with(count=1e20),
    _report_with(version=units.MAX_VERSION), _report_with(version=2**64 - 1),     # an unban is one up: 2^64
    _report_with(remaining_s=math.nan), _report_with(remaining_s=1e30),
])
def test_a_client_report_outside_its_bounds_is_out_of_range(payload):
    assert decode(encode(Message(header(), payload), KEY), KEY, CLUSTER) is Reason.OUT_OF_RANGE
    assert decode(encode(Message(header(), _report_with()), KEY), KEY, CLUSTER).payload == _report_with()


def forged_sums(kind: int, nodes: int, values=(), summers=()) -> bytes:
    """A Sums as a key holder can build it past the encoder's clamps."""
    dg = drl_pb2.Datagram.FromString(encode(Message(header(), Sums(SumKind.LEAF, 0)), None))
    dg.sums.kind, dg.sums.nodes = kind, nodes
    dg.sums.keys.extend(k for k, _ in values)
    dg.sums.values.extend(v for _, v in values)
    dg.sums.summers.extend(summers)
    return authentic(dg.SerializeToString())


@pytest.mark.parametrize("data,reason", [
    (forged_sums(SumKind.TOTAL, 9, ((7, -1.0),)), Reason.OUT_OF_RANGE),        # would take from every total
    (forged_sums(SumKind.TOTAL, 9, ((7, math.nan),)), Reason.OUT_OF_RANGE),
    (forged_sums(SumKind.PARTIAL, 9, ((7, math.inf),)), Reason.OUT_OF_RANGE),
    (forged_sums(SumKind.PARTIAL, 1, ((7, 1e300),)), Reason.OUT_OF_RANGE),     # more than 1 limiter can publish
    (forged_sums(SumKind.PARTIAL, 0, ((7, 1.0),)), Reason.OUT_OF_RANGE),       # a sum over nobody
    (forged_sums(SumKind.LEAF, 2, ((7, 1.0),)), Reason.OUT_OF_RANGE),          # a LEAF is one limiter
    (forged_sums(SumKind.PARTIAL, MAX_SUM_NODES + 1, ((7, 1.0),)), Reason.OUT_OF_RANGE),
    (forged_sums(0, 9, ((7, 1.0),)), Reason.GARBAGE),                           # no such kind
    (forged_sums(4, 9, ((7, 1.0),)), Reason.GARBAGE),
    (forged_sums(SumKind.PARTIAL, 9, ((7, 1.0),), ("n1", "")), Reason.GARBAGE),  # an empty summer id
], ids=["negative", "nan", "inf", "above-nodes-max", "over-nobody", "leaf-of-two", "nodes", "kind0", "kind4",
        "empty-summer"])
def test_sums_outside_their_bounds_are_refused(data, reason):
    assert decode(data, KEY, CLUSTER) is reason


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 5000), summers=st.lists(st.text(min_size=1, max_size=64), max_size=80),
       kind=st.sampled_from(list(SumKind)))
def test_sums_are_packed_into_datagrams_that_fit_and_carry_every_class_once(n, summers, kind):
    """Thousands of classes and as many long summer ids as a PARTIAL can name, behind the longest
    header: every part fits, carries the kind and count, and the classes arrive once, in order."""
    values = tuple((key, MAX_VALUE * key / 5000) for key in range(n))
    nodes = 1 if kind == SumKind.LEAF else MAX_SUM_NODES      # a LEAF counts its sender alone
    h = header(cluster="c" * 64, node="n" * 64, dst="d" * 64, seq=2**64 - 1, incarnation=2**64 - 1, class_id=0)
    room = MAX_DATAGRAM - len(encode(Message(h, Batch()), KEY))
    parts = pack_sums(Sums(kind, nodes, values, tuple(summers)), room)
    got = []
    for part in parts:
        data = encode(Message(h, part), KEY)
        assert len(data) <= MAX_DATAGRAM
        back = decode(data, KEY, "c" * 64).payload
        assert (back.kind, back.nodes) == (kind, nodes)
        got += back.values
    assert tuple(got) == values
    assert summers[:len(parts[0].summers)] == list(parts[0].summers) and all(not p.summers for p in parts[1:])
