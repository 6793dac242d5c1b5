"""bpf/police.h's lock-free bucket (take_tokens, rescale) modelled in Python with the C's
integer math, against a reference token bucket in exact fractions, on random traces.

The model is a line-by-line copy of the C (u64 wrap-around, signed differences, the
same shifts and divisions); agent/kernel/bucket.py, which prices rates for the program, is used
as is.  Times are what the program's clock reads (the coarse clock only makes them step).
"""
from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from drl.agent import abi
from drl.agent.kernel.bucket import bucket_times, cost_ns, ns_per_byte

U64 = 2**64 - 1
BOOT_NS = 10**12                     # the clock at the first packet: a fresh bucket (tat 0) is full
MAX_LEN = 65_536 + 66 * 44           # a 64 KiB GSO skb as wire bytes


def s64(x: int) -> int:
    x &= U64
    return x - 2**64 if x >= 2**63 else x


def convert_ns(ns: int, frm: int, to: int, cap_ns: int) -> int:
    ns = min(ns, abi.MAX_DEPTH_NS)
    assert ns << abi.NS_FRAC_BITS <= U64
    b = (ns << abi.NS_FRAC_BITS) // frm
    if b >= (cap_ns << abi.NS_FRAC_BITS) // to:
        return cap_ns
    assert b * to <= U64
    return cost_ns(b, to)


class Bucket:
    """limiter.h struct bucket with police.h take_tokens and rescale, one CPU at a time."""

    def __init__(self, tat: int = 0) -> None:
        self.tat, self.seen = tat, 0

    def rescale(self, per_byte: int, depth_ns: int, now: int) -> None:
        was, self.seen = self.seen, per_byte
        if not was:
            return
        if s64(now - self.tat) >= 0:
            self.tat = (now - convert_ns((now - self.tat) & U64, was, per_byte, depth_ns)) & U64
        else:
            self.tat = (now + convert_ns((self.tat - now) & U64, was, per_byte, abi.MAX_DEPTH_NS)) & U64

    def take(self, length: int, now: int, per_byte: int, depth_ns: int) -> bool:
        if not per_byte:
            return False
        if self.seen != per_byte:
            self.rescale(per_byte, depth_ns, now)
        tat = self.tat
        if s64(now - tat) <= 0:
            return False
        cost = cost_ns(length, per_byte)
        assert length * per_byte + (1 << abi.NS_FRAC_BITS) <= U64
        full = (now - depth_ns) & U64
        self.tat = ((full if s64(tat - full) < 0 else tat) + cost) & U64
        return True


class Reference:
    """A token bucket in bytes, exact: refill rate x dt up to burst, pass while tokens > 0, debt allowed."""

    def __init__(self, rate: int, burst: int) -> None:
        self.rate, self.burst, self.tokens, self.last = Fraction(rate), burst, Fraction(burst), None

    def take(self, length: int, now: int) -> bool:
        if self.last is not None:
            self.tokens = min(Fraction(self.burst), self.tokens + self.rate * (now - self.last) / 10**9)
        self.last = now
        if self.tokens <= 0:
            return False
        self.tokens -= length
        return True


rates = st.integers(1_000, 50 * 10**9)                      # 8 kbit/s .. 400 Gbit/s, bytes/s
lengths = st.integers(64, MAX_LEN)


@st.composite
def traces(draw, max_packets: int = 150):
    """(rate, burst, [(time, length)]): gaps from 0 to a few packets' time at the rate."""
    rate = draw(rates)
    burst = draw(st.integers(1_500, 4 * MAX_LEN))
    n = draw(st.integers(1, max_packets))
    now, out = BOOT_NS, []
    for _ in range(n):
        length = draw(lengths)
        now += draw(st.integers(0, max(1, 3 * length * 10**9 // rate)))
        out.append((now, length))
    return rate, burst, out


def admitted(rate: int, burst: int, trace) -> list[bool]:
    per_byte, depth_ns = bucket_times(rate, burst)
    b = Bucket()
    return [b.take(length, now, per_byte, depth_ns) for now, length in trace]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(traces())
def test_never_more_than_rate_times_time_plus_depth_over_any_interval(case):
    """Over any run of packets i..j: passed <= rate x (t_j - t_i) + depth + one packet (the
    debt a GSO skb may take), as for the reference bucket."""
    rate, burst, trace = case
    passed = admitted(rate, burst, trace)
    ref = Reference(rate, burst)
    ref_passed = [ref.take(length, now) for now, length in trace]
    for verdicts in (passed, ref_passed):
        for i in range(len(trace)):
            total = 0
            for j in range(i, len(trace)):
                total += trace[j][1] if verdicts[j] else 0
                assert total <= Fraction(rate * (trace[j][0] - trace[i][0]), 10**9) + burst + MAX_LEN


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(traces())
def test_never_more_than_the_reference_bucket_by_more_than_a_packet(case):
    rate, burst, trace = case
    ref = Reference(rate, burst)
    ours = theirs = 0
    for (now, length), ok in zip(trace, admitted(rate, burst, trace)):
        ours += length if ok else 0
        theirs += length if ref.take(length, now) else 0
        assert ours <= theirs + MAX_LEN


@settings(max_examples=300, deadline=None)
@given(st.integers(1_000, 50 * 10**9), st.integers(1_500, 4 * MAX_LEN),
       st.lists(st.integers(64, MAX_LEN), min_size=2, max_size=300), st.data())
def test_offered_more_it_passes_the_rate_less_one_packet(rate, burst, sizes, data):
    """Backlogged (the next packet comes before the last one's time at the rate is up):
    passed >= rate x time - one packet - rounding (<= 1 ns + a 2^-16 of the per-byte
    price per packet, rounded up both)."""
    now, trace = BOOT_NS, []
    for length in sizes:
        trace.append((now, length))
        now += data.draw(st.integers(0, max(0, 64 * 10**9 // rate)))
    passed = sum(length for (_, length), ok in zip(trace, admitted(rate, burst, trace)) if ok)
    span = trace[-1][0] - trace[0][0]
    slack_ns = len(trace) * (2 + MAX_LEN / 2**abi.NS_FRAC_BITS)
    assert passed >= rate * (span - slack_ns) / 10**9 - MAX_LEN


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(traces(max_packets=80), rates, st.integers(1_500, 4 * MAX_LEN), st.data())
def test_a_rate_change_holds_from_the_next_packet_without_a_burst(case, new_rate, new_burst, data):
    """After the agent writes a new rate, the bucket keeps its credit (or debt) as bytes, at
    most the new depth: from the change on, passed <= min(credit before, new depth) + new
    rate x time + one packet."""
    rate, burst, trace = case
    per_byte, depth_ns = bucket_times(rate, burst)
    b = Bucket()
    for now, length in trace:
        b.take(length, now, per_byte, depth_ns)
    start = trace[-1][0]
    credit_bytes = max(0, s64(start - b.tat)) / (per_byte / 2**abi.NS_FRAC_BITS)
    new_pb, new_depth = bucket_times(new_rate, new_burst)
    now, total = start, 0
    for _ in range(data.draw(st.integers(1, 80))):
        length = data.draw(lengths)
        if b.take(length, now, new_pb, new_depth):
            total += length
        elapsed = now - start
        assert total <= min(credit_bytes, new_burst) + new_rate * elapsed / 10**9 + MAX_LEN + 2
        now += data.draw(st.integers(0, max(1, 3 * length * 10**9 // new_rate)))


def test_debt_at_the_floor_is_not_carried_as_time_into_a_raise():
    """A 64 KiB skb at 15 KB/s is 4.4 s of debt; raised to 10 MB/s the class owes 64 KiB,
    i.e. 6.6 ms, not 4.4 s."""
    b = Bucket(tat=BOOT_NS)                          # reset_class: empty at now
    slow, fast = bucket_times(15_000, 15_000), bucket_times(10_000_000, 3_000_000)
    assert b.take(1500, BOOT_NS + 10**8, *slow)      # 100 ms of credit: passes, into debt
    assert b.take(65_536, BOOT_NS + 10**8, *slow) is False
    assert b.take(65_536, BOOT_NS + 2 * 10**8, *slow)   # debt ~4.3 s at the floor
    assert not b.take(1500, BOOT_NS + 3 * 10**8, *slow)
    assert not b.take(1500, BOOT_NS + 3 * 10**8, *fast)   # converted: ~62 KB of debt = 6.2 ms
    assert b.take(1500, BOOT_NS + 3 * 10**8 + 7 * 10**6, *fast)


def test_a_fresh_bucket_is_full_and_a_reset_one_empty():
    per_byte, depth_ns = bucket_times(1_000_000, 100_000)
    full, empty = Bucket(), Bucket(tat=BOOT_NS)
    assert sum(full.take(1000, BOOT_NS, per_byte, depth_ns) for _ in range(200)) == 100   # 100 x 1000 B: then no credit left
    assert not empty.take(1000, BOOT_NS, per_byte, depth_ns)


def test_prices_round_up_and_fit_in_64_bits():
    for rate in (1, 7, 8, 1_000, 1_250_000, 12_500_000_000, 50 * 10**9, 2**40):
        per_byte = ns_per_byte(rate)
        assert per_byte * rate >= 10**9 << abi.NS_FRAC_BITS or per_byte == abi.MAX_NS_PER_BYTE
        assert (2**20 - 1) * per_byte + (1 << abi.NS_FRAC_BITS) < 2**64
    assert ns_per_byte(0) == 0
    assert bucket_times(1, 10**12)[1] == abi.MAX_DEPTH_NS
    assert cost_ns(1500, ns_per_byte(12_500_000)) == 120_000     # 100 Mbit/s: 120 us, exact


def test_two_cpus_racing_add_at_most_one_packet_each():
    """Both CPUs read tat (credit left), then both add: one packet of debt per CPU, and
    every passed packet still pays its whole cost (the long-run rate is exact)."""
    per_byte, depth_ns = bucket_times(1_000_000, 10_000)
    tat, now, passed = BOOT_NS, BOOT_NS, 0
    for step in range(1000):
        now += 1_000_000                              # 1 ms: 1,000 bytes of credit
        seen = [s64(now - tat) > 0 for _cpu in range(2)]   # both read before either adds
        for ok in seen:
            if ok:
                tat += cost_ns(1500, per_byte)
                passed += 1500
        assert s64(tat - now) <= 2 * cost_ns(1500, per_byte)
    assert passed <= 1_000_000 * (now - BOOT_NS) / 10**9 + 2 * 1500
