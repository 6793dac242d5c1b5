"""--class spec parsing (agent/classes/spec.py): pure, no root."""
from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, strategies as st

from drl.agent.classes.spec import ClassRule, ClassSpecError, parse_class, parse_classes


def test_full_spec():
    rule = parse_class("dst=10.0.0.0/8,dport=80,proto=tcp")
    assert rule == ClassRule(dst=ipaddress.ip_network("10.0.0.0/8"), proto=6, dport=80)
    assert rule.family == 4


def test_sport_is_its_own_field_not_dport():
    """A server's replies leave from its port: sport must reach the rule as sport."""
    rule = parse_class("sport=8080,proto=tcp")
    assert rule == ClassRule(proto=6, sport=8080) and rule.dport is None
    assert parse_class("sport=53") == ClassRule(sport=53)
    both = parse_class("proto=udp,sport=53,dport=4000")
    assert (both.proto, both.sport, both.dport) == (17, 53, 4000)
    assert str(parse_class("sport=8080,proto=tcp")) == "proto=6,sport=8080"


def test_ipv6_source_and_host_address():
    assert parse_class("src=fd00::/64").family == 6
    assert parse_class("dst=10.1.2.3").dst == ipaddress.ip_network("10.1.2.3/32")


def test_all_matches_everything():
    assert parse_class("all") == ClassRule()
    assert ClassRule().family == 0


def test_mark_with_and_without_mask():
    assert parse_class("mark=0x10") == ClassRule(mark=0x10)
    assert parse_class("mark=0x10/0xff") == ClassRule(mark=0x10, mark_mask=0xFF)


def test_class_ids_follow_flag_order():
    rules = parse_classes(["proto=udp", "all"])
    assert rules == [ClassRule(proto=17), ClassRule()]


@pytest.mark.parametrize("spec, words", [
    ("", "empty"),
    ("dst", "key=value"),
    ("port=80", "unknown key 'port'"),
    ("dst=10.0.0.0/33", "not an address"),
    ("src=10.0.0.0/8,dst=fd00::/8", "IPv4 but dst is IPv6"),
    ("proto=gre2", "proto='gre2'"),
    ("dport=0", "not a port"),
    ("dport=70000", "not a port"),
    ("sport=0", "sport='0' is not a port"),
    ("sport=http", "sport='http' is not a port"),
    ("proto=icmp,sport=80", "ports need proto=tcp"),
    ("proto=icmp,dport=80", "ports need proto=tcp"),
    ("mark=0x100/0xff", "mark inside mask"),
    ("mark=zz", "mark='zz'"),
    ("dport=1,dport=2", "given twice"),
])
def test_bad_specs_say_what_is_wrong_in_one_line(spec, words):
    with pytest.raises(ClassSpecError) as err:
        parse_class(spec)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def _networks(version):
    bits = 32 if version == 4 else 128
    addr = st.integers(0, 2**bits - 1).map(lambda n: ipaddress.ip_address(n) if version == 4
                                          else ipaddress.IPv6Address(n))
    return st.builds(lambda a, p: ipaddress.ip_network(f"{a}/{p}", strict=False), addr, st.integers(0, bits))


marks = st.just((None, 0xFFFFFFFF)) | st.tuples(st.integers(0, 0xFF), st.just(0xFF))

rules = st.sampled_from([4, 6]).flatmap(lambda v: st.builds(
    lambda src, dst, proto, sport, dport, mark: ClassRule(src, dst, proto, sport, dport, *mark),
    st.none() | _networks(v), st.none() | _networks(v), st.sampled_from([None, 6, 17]),
    st.none() | st.integers(1, 65535), st.none() | st.integers(1, 65535), marks))


@given(rules)
def test_a_rule_round_trips_through_its_spec(rule):
    assert parse_class(str(rule)) == rule
