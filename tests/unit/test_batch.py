"""Many classes in few datagrams: agent/wire.py pack() and the Batch codec."""
from __future__ import annotations

import struct

from hypothesis import given, settings, strategies as st

from agent import drl_pb2
from agent.wire import (MAX_DATAGRAM, Batch, ClassValue, Header, LimitNote, Message, Reason, decode, encode,
                        pack)

KEY = b"0123456789abcdef0123456789abcdef"
HEADER = Header(cluster="drl", node="node-with-a-long-name", dst="receiver-node", seq=2**40, sent_at=1e9,
                incarnation=2**45)

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
values = st.builds(ClassValue, st.integers(0, 2**32 - 1), st.integers(1, 2**63), f32, st.integers(0, 2**63))
notes = st.builds(LimitNote, st.integers(0, 2**32 - 1), st.integers(0, 2**63), st.floats(0, 1e15))


def datagrams(vals, lims):
    room = MAX_DATAGRAM - len(encode(Message(HEADER, Batch()), KEY))
    return [encode(Message(HEADER, b), KEY) for b in pack(vals, lims, room)]


@settings(max_examples=60, deadline=None)
@given(st.lists(values, max_size=400), st.lists(notes, max_size=40))
def test_every_class_arrives_once_in_order_and_every_datagram_fits(vals, lims):
    got_v, got_l = [], []
    for data in datagrams(vals, lims):
        assert len(data) <= MAX_DATAGRAM
        msg = decode(data, KEY, "drl")
        got_v += msg.payload.values
        got_l += msg.payload.limits
    assert got_v == vals
    assert got_l == lims


def test_an_empty_batch_is_one_heartbeat():
    [data] = datagrams([], [])
    assert decode(data, KEY, "drl").payload == Batch()


def test_a_class_costs_at_most_16_bytes_on_the_wire_with_headers_shared():
    vals = [ClassValue(0xFFFFFFFF - i, 200_000 + i, 1.25e6 + i, 3) for i in range(1000)]
    wire = [len(d) + 28 for d in datagrams(vals, [])]        # + IPv4 and UDP headers
    assert sum(wire) / len(vals) <= 16


@given(st.lists(values, min_size=1, max_size=5), st.integers(0, 3))
def test_a_batch_with_arrays_of_different_lengths_is_garbage(vals, drop):
    data = encode(Message(HEADER, Batch(tuple(vals))), None)
    dg = drl_pb2.Datagram()
    dg.ParseFromString(data)
    del dg.batch.seqs[:min(drop + 1, len(vals))]
    assert decode(dg.SerializeToString(), None, "drl") == Reason.GARBAGE


def test_non_finite_values_and_negative_limits_are_garbage():
    for batch in (Batch((ClassValue(1, 1, float("inf")),)), Batch((), (LimitNote(1, 1, -5.0),))):
        assert decode(encode(Message(HEADER, batch), KEY), KEY, "drl") == Reason.GARBAGE


def test_values_travel_as_32_bit_floats():
    v = 1234567.891
    [data] = datagrams([ClassValue(1, 1, v)], [])
    assert decode(data, KEY, "drl").payload.values[0].value == struct.unpack("f", struct.pack("f", v))[0]
