"""Datapath's classification maps: set_rules writes a compiled rule set (agent/kernel/classify.py)
into marks, dst_nets and src_nets (bpf/classify.h) and the settings that list their masks and
lengths, while packets flow."""
from __future__ import annotations

from typing import Sequence

from drl.agent.classes.spec import ClassRule
from drl.agent.kernel.classify import ClassifyError, Compiled, Prefix, compile_rules, key_prefixlen
from drl.agent.kernel.maps import DatapathError, next_gen, words


class RuleMaps:
    """Datapath's part for the classification maps; keeps ``_rules`` (the compiled set
    installed) and ``_rules_gen`` (settings.rules_gen)."""

    def set_rules(self, rules: Sequence[tuple[ClassRule, int]]) -> None:
        """Install ``(rule, class_id)`` pairs in place of the current ones, while packets flow.

        Map updates are atomic per key.  The order, in three steps:

        1. entries that are new or changed are written (unchanged ones are
           not touched);
        2. one settings write: mark masks and prefix lengths;
        3. entries no longer needed are deleted;
        4. one settings write: rules_gen moves on, which ends every class a
           CPU remembered for a flow (flows.h classify_memo), those found
           during steps 1-3 too.  Nothing changed: nothing is written.

        So a newly listed mask or length has all its entries at once, and no
        probe is spent on entries already gone.  A class whose rules did not
        change keeps its packets throughout, and would in any order: its
        entries are never deleted; every entry is, at any moment, the old
        set's or the new set's, and either carries, after its own rules,
        those of every prefix covering it in that set, its rules among them;
        a probe of a length without entries (yet, or any more) only misses;
        and its mask or length keeps its slot (agent/kernel/classify.py), so a
        packet that reads the slots while they are copied (an array update
        is a copy in place, not atomic) sees every slot old or new, each of
        which lists it.
        """
        for _, class_id in rules:
            self._check_class(class_id)
        try:
            new = compile_rules(rules, self._rules)
        except ClassifyError as e:
            raise DatapathError(str(e)) from None
        old = self._rules
        if new == old:
            return
        tables = self._classification_tables(old, new)
        for table, encode, before, after in tables:
            for key, entry in after.items():
                if before.get(key) != entry:
                    table[encode(table.Key(), key)] = _encode_list(table.Leaf(), entry)
        slots = {name: getattr(new, name) for name in ("mark_masks", "dst_lengths", "src_lengths")
                 if getattr(new, name) != getattr(old, name)}
        if slots:
            self._write_settings(**slots)
        for table, encode, before, after in tables:
            for key in before.keys() - after.keys():
                del table[encode(table.Key(), key)]
        # last: the classes each CPU remembered per flow (flows.h classify_memo) end here
        self._rules_gen = next_gen(self._rules_gen)
        self._write_settings(rules_gen=self._rules_gen)
        self._rules = new

    def _classification_tables(self, old: Compiled, new: Compiled) -> list:
        """(bcc table, key encoder, old entries, new entries) per classification map."""
        return [(self._bpf[b"marks"], _encode_mark, old.marks, new.marks),
                (self._bpf[b"dst_nets"], _encode_prefix, old.dst, new.dst),
                (self._bpf[b"src_nets"], _encode_prefix, old.src, new.src)]


def _net_words(net) -> tuple[list[int], list[int]]:
    if net is None:
        return [0] * 4, [0] * 4
    pad = bytes(16 - len(net.network_address.packed))
    return words(net.network_address.packed + pad), words(net.netmask.packed + pad)


def _encode_rule(leaf, rule: ClassRule, class_id: int):
    for name, net in (("src", rule.src), ("dst", rule.dst)):
        addr, mask = _net_words(net)
        getattr(leaf, name)[:] = addr
        getattr(leaf, name + "_mask")[:] = mask
    for name, bits in (("sport", 0xFFFF), ("dport", 0xFFFF), ("family", 0xFF), ("proto", 0xFF)):
        value = getattr(rule, name) or 0         # None / 0: any
        setattr(leaf, name, value)
        setattr(leaf, name + "_mask", bits if value else 0)
    leaf.class_id = class_id
    return leaf


def _encode_list(leaf, entry):
    leaf.n = len(entry)
    for slot, (rule, class_id) in zip(leaf.rules, entry):
        _encode_rule(slot, rule, class_id)
    return leaf


def _encode_prefix(key, prefix: Prefix):
    """A net_key: the one a packet in the prefix builds at its length (classify.h net_key)."""
    key.prefixlen = key_prefixlen(prefix)
    if prefix is not None:
        key.family = prefix.version
        key.addr[:] = _net_words(prefix)[0]
    return key


def _encode_mark(key, mask_mark: tuple[int, int]):
    key.mask, key.mark = mask_mark
    return key
