"""Many classes in few datagrams: agent/gossip/wire.py pack() and the Batch codec."""
from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings, strategies as st

from drl.agent import units
from drl.agent.cluster.limits import Limit, LimitBook
from drl.agent.gossip import drl_pb2
from drl.agent.gossip.wire import (MAX_DATAGRAM, MAX_VALUE, Batch, ClassValue, Header, LimitNote, Message, Reason, decode, encode,
                        pack)

KEY = b"0123456789abcdef0123456789abcdef"
HEADER = Header(cluster="drl", node="node-with-a-long-name", dst="receiver-node", seq=2**40, sent_at=1e9,
                incarnation=2**45)

f32 = st.floats(-MAX_VALUE, MAX_VALUE, width=32)       # what the encoder sends unclamped
kbps = st.integers(0, 2**32 - 1).map(lambda k: 1000.0 * k)          # what the wire carries: whole kB/s
versions = st.integers(0, units.MAX_VERSION - 1)                       # one more must still fit
values = st.builds(ClassValue, st.integers(0, 2**32 - 1), st.integers(1, 2**63), f32, versions, kbps)
notes = st.builds(LimitNote, st.integers(0, 2**32 - 1), st.integers(0, units.MAX_VERSION - 2),
                  st.floats(units.MIN_RATE_Bps, units.MAX_RATE_Bps))


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
    vals = [ClassValue(0xFFFFFFFF - i, 16_000 + i % 383, 1.25e6 + i, 3, local_Bps=4.2e5) for i in range(1000)]
    wire = [len(d) + 28 for d in datagrams(vals, [])]        # + IPv4 and UDP headers
    assert sum(wire) / len(vals) <= 16


@given(st.lists(values, min_size=1, max_size=5), st.integers(0, 3))
def test_a_batch_with_arrays_of_different_lengths_is_garbage(vals, drop):
    data = encode(Message(HEADER, Batch(tuple(vals))), None)
    dg = drl_pb2.Datagram()
    dg.ParseFromString(data)
    del dg.batch.seqs[:min(drop + 1, len(vals))]
    assert decode(dg.SerializeToString(), None, "drl") == Reason.GARBAGE


@pytest.mark.parametrize("batch", [      # an inf or NaN value is clamped at encode (test_wire_bounds.py)
    Batch((ClassValue(1, 1, 1.0, version=units.MAX_VERSION),)),
    Batch((ClassValue(1, 1, 1.0, version=2**64 - 1),)),
    Batch((), (LimitNote(1, 1, -5.0),)), Batch((), (LimitNote(1, 1, 0.0),)),
    Batch((), (LimitNote(1, 1, 1e300),)), Batch((), (LimitNote(1, 1, float("inf")),)),
    Batch((), (LimitNote(1, 1, float("nan")),)),
    Batch((), (LimitNote(1, 2**64 - 1, 7.5e6),)),          # a forged top version, adopted for good before
    Batch((), (LimitNote(1, units.MAX_VERSION, 7.5e6),)),
    Batch((), (LimitNote(1, units.MAX_VERSION - 1, 7.5e6),)),   # a set after it would not fit
], ids=["value-version-top", "value-version-max", "negative-limit", "zero-limit", "huge-limit",
        "inf-limit", "nan-limit", "limit-version-max", "limit-version-top", "limit-version-last"])
def test_values_and_limits_outside_their_bounds_are_out_of_range(batch):
    assert decode(encode(Message(HEADER, batch), KEY), KEY, "drl") == Reason.OUT_OF_RANGE


def test_limits_at_their_bounds_pass():
    batch = Batch((ClassValue(1, 1, 1.0, version=units.MAX_VERSION - 1),),
                  (LimitNote(1, units.MAX_VERSION - 2, units.MAX_RATE_Bps), LimitNote(2, 0, units.MIN_RATE_Bps)))
    assert decode(encode(Message(HEADER, batch), KEY), KEY, "drl").payload == batch


def test_local_limits_travel_as_kilobytes_rounded_up():
    [data] = datagrams([ClassValue(1, 1, 0.0, local_Bps=1234.5)], [])
    assert decode(data, KEY, "drl").payload.values[0].local_Bps == 2000.0    # never below what it may send


def test_values_travel_as_32_bit_floats():
    v = 1234567.891
    [data] = datagrams([ClassValue(1, 1, v)], [])
    assert decode(data, KEY, "drl").payload.values[0].value == struct.unpack("f", struct.pack("f", v))[0]


# -- the gossip core: which classes go to whom ------------------------------------------------

import random

from drl.agent.gossip.core import ANNOUNCE_ROUNDS, REFRESH_ROUNDS, REPEATS, GossipCore, Outgoing
from drl.agent.gossip.membership import Membership


def pair():
    a = GossipCore("A", "c", KEY, ["b"], 3, 1, random.Random(1))
    b = GossipCore("B", "c", KEY, ["a"], 3, 1, random.Random(2))
    return a, b


def keys_received(core, sent, src="a"):
    rxs = [core.receive(data, src, 0.0) for _, data in sent]
    return [v.key for rx in rxs for v in rx.payload.values]


def test_quiet_classes_rest_after_repeats_active_and_changed_ones_go_every_round():
    a, b = pair()
    rounds = []
    for r in range(REPEATS + 3):
        classes = {1: Outgoing(5.0, active=False), 2: Outgoing(7.0, active=True),
                   3: Outgoing(float(r), active=False)}
        rounds.append(sorted(keys_received(b, a.publish(classes, r))))
    assert rounds[:REPEATS] == [[1, 2, 3]] * REPEATS
    assert rounds[REPEATS:] == [[2, 3]] * 3           # class 1 said it REPEATS times and rests


def test_a_resting_class_is_refreshed_and_a_restarted_peer_hears_everything_again():
    a, b = pair()
    quiet = {1: Outgoing(5.0, active=False)}
    got = [keys_received(b, a.publish(quiet, r)) for r in range(REPEATS + REFRESH_ROUNDS)]
    assert [i for i, keys in enumerate(got) if keys] == [*range(REPEATS), REFRESH_ROUNDS]
    a.receive(b.publish({}, 0)[0][1], "b", 0.0)
    reborn = GossipCore("B", "c", KEY, ["a"], 3, 2, random.Random(3))
    a.receive(reborn.publish({}, 0)[0][1], "b", 0.0)  # b restarted: it forgot our values
    assert keys_received(reborn, a.publish(quiet, 0)) == [1]


def test_a_limit_change_reaches_every_peer_not_only_this_rounds_targets():
    peers = list("bcdefgh")
    a = GossipCore("A", "c", KEY, peers, 1, 1, random.Random(1))
    note = LimitNote(9, 4, 1e6)
    a.announce(note)
    for r in range(ANNOUNCE_ROUNDS + 1):
        sent = a.publish({}, r)
        noted = {addr for addr, data in sent if decode(data, KEY, "c").payload.limits == (note,)}
        assert noted == (set(peers) if r < ANNOUNCE_ROUNDS else set())
    a.announce(note, addr="e")
    assert {addr for addr, data in a.publish({}, 9) if decode(data, KEY, "c").payload.limits} == {"e"}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(2, 6), st.sampled_from([0.0, 0.3]), st.randoms(use_true_random=False))
def test_every_class_arrives_once_and_in_order_under_loss_and_reordering(n_classes, rounds, loss, rnd):
    """Class k's value in round r is r * 1000 + k: the value a receiver holds must only grow."""
    a, b = pair()
    members = Membership("B", ["a"], timeout_s=100.0)
    in_flight = []
    for r in range(rounds):
        datagrams = a.publish({k: Outgoing(float(r * 1000 + k)) for k in range(n_classes)}, r)
        assert all(len(data) <= MAX_DATAGRAM for _, data in datagrams)
        in_flight += [data for _, data in datagrams if rnd.random() >= loss]
    rest = in_flight[1:]
    rnd.shuffle(rest)                                  # the first datagram seen starts the replay window
    in_flight = in_flight[:1] + rest
    held = {k: -1.0 for k in range(n_classes)}
    arrivals = {k: 0 for k in range(n_classes)}
    for data in in_flight:
        rx = b.receive(data, "a", 0.0)
        members.observe(rx, 0.0)
        for v in rx.payload.values:
            arrivals[v.key] += 1
        for k in range(n_classes):
            now = members.view(k, 0.0).remote_sum if members.view(k, 0.0).peers["A"].value else held[k]
            assert now >= held[k]
            held[k] = now
    if loss == 0.0:
        assert all(n == rounds for n in arrivals.values())
        assert all(held[k] == (rounds - 1) * 1000 + k for k in range(n_classes))


def test_class_sequence_numbers_wrap_and_still_order():
    from drl.agent.gossip.core import CLASS_SEQS, class_seq_gap
    assert class_seq_gap(5, 0) == 0 and class_seq_gap(6, 5) == 0 and class_seq_gap(9, 5) == 3
    assert class_seq_gap(5, 6) is None and class_seq_gap(5, 5) is None
    assert class_seq_gap(1, CLASS_SEQS) == 0 and class_seq_gap(2, CLASS_SEQS - 1) == 2   # across the wrap
    assert class_seq_gap(CLASS_SEQS, 1) is None                                           # older, across it


def test_a_long_lived_link_keeps_class_seqs_at_two_bytes():
    a, b = pair()
    for r in range(20_000):
        sent = a.publish({7: Outgoing(float(r))}, r)
    v = decode(sent[0][1], KEY, "c").payload.values[0]
    assert v.seq == 20_000 % 16_383


# -- bounds the core judges: the sign of a class's value ---------------------------------------

def test_a_negative_weight_is_dropped_and_counted_never_summed():
    """One peer publishing -max(weights) gave FPS 2.04x its limit: a negative weight took from
    the sum every peer's share is computed from."""
    a, b = pair()
    members = Membership("B", ["a"], 10.0)
    honest = b.receive(a.publish({1: Outgoing(5e5)}, 0.0)[0][1], "a", 0.0)
    members.observe(honest, 0.0)
    forged = a.publish({1: Outgoing(-5e5)}, 0.1)
    assert [b.receive(data, "a", 0.1) for _, data in forged] == [None]
    assert b.stats.rejected == {"out_of_range": 1}
    assert members.view(1, 0.1).remote_sum == 5e5


def test_a_class_that_may_publish_below_0_gets_its_value():
    a, b = pair()
    b.signed = lambda key: key == 2              # a GDRL indicator: spare capacity, fill ratio
    [(_, data)] = a.publish({2: Outgoing(-3.5)}, 0.0)
    assert b.receive(data, "a", 0.0).payload.values[0].value == -3.5
    [(_, data)] = a.publish({1: Outgoing(-3.5), 2: Outgoing(-4.0)}, 0.1)
    assert b.receive(data, "a", 0.1) is None and b.stats.rejected == {"out_of_range": 1}


_any_f32 = st.floats(width=32)
_any_version = st.one_of(st.integers(0, 2**64 - 1), st.integers(units.MAX_VERSION - 3, units.MAX_VERSION + 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), _any_f32, _any_version), max_size=6),
       st.lists(st.tuples(st.integers(1, 4), _any_version, st.floats()), max_size=3))
def test_absurd_batch_numbers_never_raise_and_never_reach_membership_or_the_book(vals, lims):
    """Whatever numbers an authenticated peer puts in a Batch, the receiver either drops the
    datagram (counted) or every value it hands on is finite, not negative for a class that
    may not publish one, at a version that can still be incremented, and every limit within
    the rate bounds."""
    body = drl_pb2.Datagram()
    for name in ("cluster", "node", "seq", "incarnation", "sent_at"):
        setattr(body.header, name, {"cluster": "c", "node": "A", "seq": 1, "incarnation": 1, "sent_at": 0.0}[name])
    body.header.version = HEADER.version
    body.batch.SetInParent()
    for i, (key, value, version) in enumerate(vals):
        body.batch.keys.append(key), body.batch.seqs.append(i + 1), body.batch.values.append(value)
        body.batch.versions.append(version), body.batch.locals.append(0)
    for key, version, rate in lims:
        body.batch.limits.add(key=key, version=version, global_Bps=rate)
    b = GossipCore("B", "c", None, ["a"], 3, 1, random.Random(2))
    b.signed = lambda key: key == 4
    rx = b.receive(body.SerializeToString(), "a", 0.0)
    if rx is None:
        assert sum(b.stats.rejected.values()) == 1
        return
    for v in rx.payload.values:
        assert math.isfinite(v.value) and (v.value >= 0 or v.key == 4) and v.version < units.MAX_VERSION
    book = LimitBook()
    book.configure("c", 1e6)
    for note in rx.payload.limits:
        assert note.version + 1 < units.MAX_VERSION and units.MIN_RATE_Bps <= note.global_Bps <= units.MAX_RATE_Bps
        book.merge("c", Limit(note.version, note.global_Bps))
    assert book.set("c", 2e6).version <= units.MAX_VERSION - 1        # one more always fits
