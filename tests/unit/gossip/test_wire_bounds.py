"""Issue 44, the codec half: whatever values a sender has, every Batch and Sums it encodes
decodes (one wild value, an FPS weight of 1e288 gone out as float32 infinity, made every Batch
of its sender undecodable for every peer), and whatever decode yields, from any datagram a key
holder can build, the encoder sends unchanged: decoding never yields a value the encoder cannot send."""
from __future__ import annotations

import hashlib
import hmac

from hypothesis import given, settings, strategies as st

from drl.agent.gossip import drl_pb2
from drl.agent.gossip.wire import (MAX_SUM_NODES, MAX_VALUE, Batch, ClassValue, Header, Message, Reason, Sums,
                                   SumKind, decode, encode)

KEY = b"k" * 32
H = Header(cluster="c", node="n1", dst="n2", seq=1, incarnation=1, sent_at=0.0)
any_float = st.floats(width=64)                      # NaN and both infinities included
keys = st.integers(0, 2**32 - 1)


def _round_trip(payload):
    msg = decode(encode(Message(H, payload), KEY), KEY, "c")
    assert not isinstance(msg, Reason), msg
    assert decode(encode(msg, KEY), KEY, "c") == msg         # what decode yields is sent unchanged
    return msg.payload


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(keys, any_float, any_float), max_size=20))
def test_a_batch_of_any_values_decodes_and_every_value_is_within_its_bound(values):
    batch = _round_trip(Batch(tuple(ClassValue(k, 1, v, 0, local) for k, v, local in values)))
    assert all(-MAX_VALUE <= v.value <= MAX_VALUE and 0.0 <= v.local_Bps <= (2**32 - 1) * 1000.0
               for v in batch.values)


def test_a_weight_of_1e288_goes_out_as_the_largest_value_not_as_infinity():
    [v] = _round_trip(Batch((ClassValue(1, 1, 1e288),))).values
    assert v.value == MAX_VALUE


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(SumKind)), st.integers(-5, 2**40), st.lists(st.tuples(keys, any_float), max_size=20),
       st.lists(st.text(max_size=8), max_size=5))
def test_sums_of_any_values_decode_within_their_node_count_times_the_largest_value(kind, nodes, values, summers):
    sums = _round_trip(Sums(kind, nodes, tuple(values), tuple(summers)))
    assert 0 <= sums.nodes <= (1 if kind == SumKind.LEAF else MAX_SUM_NODES)
    assert all(0.0 <= v <= sums.nodes * MAX_VALUE for _, v in sums.values)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5), st.integers(0, 2**32 - 1), st.lists(st.tuples(keys, any_float), max_size=20),
       st.lists(st.text(max_size=8), max_size=5))
def test_any_sums_a_key_holder_builds_decodes_to_what_the_encoder_sends_or_not_at_all(kind, nodes, values, summers):
    dg = drl_pb2.Datagram.FromString(encode(Message(H, Sums(SumKind.LEAF, 0)), None))
    dg.sums.kind, dg.sums.nodes = kind, nodes
    dg.sums.keys.extend(k for k, _ in values)
    dg.sums.values.extend(v for _, v in values)
    dg.sums.summers.extend(summers)
    body = dg.SerializeToString()
    msg = decode(body + hmac.new(KEY, body, hashlib.sha256).digest(), KEY, "c")
    if not isinstance(msg, Reason):
        assert decode(encode(msg, KEY), KEY, "c") == msg
        assert all(0.0 <= v <= msg.payload.nodes * MAX_VALUE for _, v in msg.payload.values)
