"""Rule compilation for the datapath's classification maps (agent/kernel/classify.py): pure, no root."""
from __future__ import annotations

import ipaddress

import pytest

from drl.agent import abi
from drl.agent.classes.spec import parse_class
from drl.agent.kernel.classify import ClassifyError, compile_rules, key_prefixlen


def net(text: str):
    return ipaddress.ip_network(text)


def ids(entry) -> list[int]:
    return [class_id for _, class_id in entry]


def compiled(*specs: str, **kw):
    return compile_rules([(parse_class(s), i) for i, s in enumerate(specs)], **kw)


def test_each_rule_goes_to_its_map():
    c = compiled("mark=0x10", "dst=10.0.0.0/8,src=10.1.0.0/16", "src=fd00::/64", "proto=udp")
    assert ids(c.marks[(0xFFFFFFFF, 0x10)]) == [0]
    assert ids(c.dst[net("10.0.0.0/8")]) == [1, 3]         # a rule with no address ends every dst entry
    assert ids(c.src[net("fd00::/64")]) == [2]
    assert ids(c.dst[None]) == [3]
    assert c.class_ids() == {0, 1, 2, 3}


def test_longer_prefixes_carry_the_rules_of_covering_ones_longest_first():
    c = compiled("dst=10.0.0.0/8", "dst=10.1.0.0/16,dport=80", "dst=10.1.2.0/24,proto=udp", "dst=10.2.0.0/16")
    assert ids(c.dst[net("10.1.2.0/24")]) == [2, 1, 0]
    assert ids(c.dst[net("10.1.0.0/16")]) == [1, 0]
    assert ids(c.dst[net("10.2.0.0/16")]) == [3, 0]
    assert ids(c.dst[net("10.0.0.0/8")]) == [0]


def test_within_one_prefix_rules_keep_their_order():
    c = compiled("dst=10.0.0.0/8,dport=80", "dst=10.0.0.0/8", "dst=10.0.0.0/8,dport=443")
    assert ids(c.dst[net("10.0.0.0/8")]) == [0, 1, 2]


def test_families_do_not_cover_each_other():
    c = compiled("dst=0.0.0.0/0", "dst=::/0", "dst=fd00::/8", "all")
    assert ids(c.dst[net("fd00::/8")]) == [2, 1, 3]
    assert ids(c.dst[net("0.0.0.0/0")]) == [0, 3]


def test_key_prefixlen_counts_the_family_byte():
    assert key_prefixlen(None) == 0
    assert key_prefixlen(net("10.0.0.0/24")) == 32
    assert key_prefixlen(net("fd00::/128")) == 136


def test_an_overflowing_entry_names_its_prefix():
    specs = [f"dst=10.0.0.0/{8 + i}" for i in range(abi.RULES_PER_KEY + 1)]
    with pytest.raises(ClassifyError, match=r"destination prefix 10.0.0.0/16: 9 rules .* at most 8"):
        compiled(*specs)
    compiled(*specs[:-1])


def test_an_overflowing_mark_entry_names_its_mark():
    with pytest.raises(ClassifyError, match=r"mark 0x1/0xff: 9 rules"):
        compiled(*[f"mark=0x1/0xff,dport={p}" for p in range(1, 10)])


def test_at_most_four_mark_masks_in_one_line():
    specs = [f"mark=0x1/{(1 << i) | 1:#x}" for i in range(1, 6)]
    with pytest.raises(ClassifyError, match="5 distinct mark masks") as err:
        compiled(*specs)
    assert "\n" not in str(err.value)


def test_mark_masks_keep_their_slot_across_changes():
    first = compiled("mark=0x1/0xf", "mark=0x10/0xf0")
    assert first.mark_masks == (0xF, 0xF0, 0, 0)
    second = compiled("mark=0x100/0xf00", "mark=0x10/0xf0", previous=first)
    assert second.mark_masks == (0xF00, 0xF0, 0, 0)      # 0xf0 stays in slot 1; 0xf00 takes the freed one
    assert compiled(previous=second).mark_masks == (0, 0, 0, 0)


FREE = abi.NO_PREFIX_LENGTH


def lengths(slots) -> list[int]:
    return [n for n in slots if n != FREE]


def test_prefix_lengths_of_a_fresh_rule_set_go_longest_first():
    c = compiled("dst=10.0.0.0/16", "dst=10.1.2.3", "all", "dst=10.9.0.0/24", "src=fd00::/64", "dst=fd00::/24")
    assert c.dst_lengths == (40, 32, 24, 0) + (FREE,) * (abi.MAX_PREFIX_LENGTHS - 4)   # v4 and v6 /24: one
    assert lengths(c.src_lengths) == [72]


def test_prefix_lengths_keep_their_slot_across_changes():
    first = compiled("dst=10.0.0.0/16", "dst=10.1.2.3", "dst=10.9.0.0/24")
    assert lengths(first.dst_lengths) == [40, 32, 24]
    second = compiled("dst=10.1.2.3", "dst=10.8.0.0/13", "dst=10.2.0.0/16", "dst=10.3.0.0/28", previous=first)
    assert lengths(second.dst_lengths) == [40, 36, 24, 21]       # /32, /16 stay; /28 takes /24's slot
    assert compiled(previous=second).dst_lengths == (FREE,) * abi.MAX_PREFIX_LENGTHS


def test_too_many_prefix_lengths_in_one_line_naming_them():
    specs = [f"dst=10.{n}.0.0/{n},proto=udp" if n < 16 else f"dst=fd00::/{n}" for n in range(9, 17)]
    compiled(*specs)                                              # 8 lengths: the most
    with pytest.raises(ClassifyError, match=r"destination: 9 distinct prefix lengths "
                                            r"\(/16, .*, /9, any\), at most 8") as err:
        compiled(*specs, "proto=tcp")
    assert "\n" not in str(err.value)
    with pytest.raises(ClassifyError, match="source: 9 distinct"):
        compiled(*[s.replace("dst", "src") for s in specs], "src=10.1.2.3")


def test_4096_host_classes_each_end_with_the_any_rule():
    rules = [(parse_class(f"dst=10.1.{i >> 8}.{i & 255}"), i) for i in range(4096)] + [(parse_class("all"), 4096)]
    c = compile_rules(rules)
    assert len(c.dst) == 4097 and all(ids(e)[-1] == 4096 for e in c.dst.values())


def test_covering_prefixes_are_looked_up_only_at_the_lengths_in_use(monkeypatch):
    """20,000 /24s under one /16: each /24 looks at one supernet (/16), not at its 24, which
    made a 20,000-class reload block the tick for seconds."""
    calls = []
    supernet = ipaddress.IPv4Network.supernet
    monkeypatch.setattr(ipaddress.IPv4Network, "supernet", lambda self, **kw: calls.append(1) or supernet(self, **kw))
    rules = [(parse_class(f"dst=10.{i // 250}.{i % 250}.0/24"), i) for i in range(20_000)]
    rules.append((parse_class("dst=10.3.0.0/16"), 20_000))
    compiled = compile_rules(rules)
    assert len(calls) == 20_000
    assert [c for _, c in compiled.dst[ipaddress.ip_network("10.3.7.0/24")]] == [757, 20_000]
    assert [c for _, c in compiled.dst[ipaddress.ip_network("10.4.7.0/24")]] == [1007]
