"""Compile class rules into the datapath's classification maps: pure Python, no bcc, no root.

The datapath (bpf/classify.h classify) finds a packet's class in at most
MAX_MARK_MASKS + 2 x MAX_PREFIX_LENGTHS hash lookups, whatever the number of
classes (one per mask and per prefix length in use):

1. mark rules: for each installed mask, ``marks[(mask, skb->mark & mask)]``;
2. the longest destination prefix: ``dst_nets[(length, address & length)]``
   for each length in ``dst_lengths``, the longest hit wins;
3. the longest source prefix: the same in ``src_nets`` with ``src_lengths``.

Each entry holds a short ordered list of rules (at most abi.RULES_PER_KEY);
the first whose other fields (ports, protocol, the other address) match
wins.  A rule goes to ``marks`` if it has a mark, else to ``dst`` if it has
a destination, else to ``src`` if it has a source, else to ``dst`` at the
prefix ``None`` (any address).  So that a packet that matches a long prefix
but none of its rules still finds the rules of a shorter covering prefix,
every entry also carries, after its own rules, those of every prefix that
covers it, longest first (push-down)::

    >>> from drl.agent.classes.spec import parse_class
    >>> c = compile_rules([(parse_class("dst=10.0.0.0/8"), 1), (parse_class("dst=10.1.0.0/16,dport=80"), 2)])
    >>> [class_id for _, class_id in c.dst[parse_class("dst=10.1.0.0/16").dst]]
    [2, 1]
    >>> c.dst_lengths[:3]                   # key lengths: 8 + /16, 8 + /8, free
    (24, 16, 255)

Mark masks and prefix lengths keep their slot across :func:`compile_rules`
calls (``previous`` passes the installed slots in), so a runtime change
never moves the mask or length of a class whose rules did not change; a new
one takes a free slot.  Masks are tried in slot order; lengths in any order
(the program keeps the longest hit), but a fresh rule set gets them longest
first, so the first hit usually ends the search.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from drl.agent import abi
from drl.agent.classes.spec import ClassRule, Network

Entry = tuple[tuple[ClassRule, int], ...]   # (rule, class_id), in the order they are tried
Prefix = Network | None                     # None: any address of either family


class ClassifyError(ValueError):
    """A rule set the datapath's maps cannot hold; the message is one line."""


@dataclass(frozen=True)
class Compiled:
    """What the datapath's classification maps hold for one rule set."""
    dst: dict[Prefix, Entry]
    src: dict[Prefix, Entry]
    marks: dict[tuple[int, int], Entry]     # (mask, mark & mask)
    mark_masks: tuple[int, ...]             # slot i is tried i-th; 0 = free
    dst_lengths: tuple[int, ...]            # key_prefixlen of dst's prefixes; abi.NO_PREFIX_LENGTH = free
    src_lengths: tuple[int, ...]

    def class_ids(self) -> set[int]:
        return {class_id for table in (self.dst, self.src, self.marks)
                for entry in table.values() for _, class_id in entry}


NO_LENGTHS = (abi.NO_PREFIX_LENGTH,) * abi.MAX_PREFIX_LENGTHS
EMPTY = Compiled({}, {}, {}, (0,) * abi.MAX_MARK_MASKS, NO_LENGTHS, NO_LENGTHS)


def compile_rules(rules: Iterable[tuple[ClassRule, int]], previous: Compiled = EMPTY) -> Compiled:
    """Place, push down and check ``(rule, class_id)`` pairs; ``previous``: what is installed now
    (its mask and length slots are kept)."""
    dst: dict[Prefix, list] = {}
    src: dict[Prefix, list] = {}
    marks: dict[tuple[int, int], list] = {}
    for rule, class_id in rules:
        if rule.mark is not None:
            marks.setdefault((rule.mark_mask, rule.mark), []).append((rule, class_id))
        elif rule.dst is not None or rule.src is None:
            dst.setdefault(rule.dst, []).append((rule, class_id))
        else:
            src.setdefault(rule.src, []).append((rule, class_id))
    compiled = Compiled(_push_down(dst, "destination"), _push_down(src, "source"),
                        {k: tuple(v) for k, v in marks.items()}, _mask_slots(marks, previous.mark_masks),
                        _length_slots(dst, previous.dst_lengths, "destination"),
                        _length_slots(src, previous.src_lengths, "source"))
    for (mask, mark), entry in compiled.marks.items():
        _check_length(entry, f"mark {mark:#x}/{mask:#x}")
    return compiled


def key_prefixlen(prefix: Prefix) -> int:
    """The prefix length of its key (struct net_key): the family byte counts 8 bits, so None (any) is 0."""
    return 0 if prefix is None else 8 + prefix.prefixlen


def _covering(prefix: Prefix, table: dict, lengths: dict[int, list[int]]) -> list[Prefix]:
    """The shorter prefixes in table that contain prefix, longest first; ``lengths``: the
    prefix lengths the table holds per IP version, longest first (only those can cover, and
    there are few: 20,000 /24s have one, so no supernet is made for them)."""
    if prefix is None:
        return []
    found = [prefix.supernet(new_prefix=n) for n in lengths[prefix.version] if n < prefix.prefixlen]
    return [p for p in found if p in table] + ([None] if None in table else [])


def _push_down(table: dict[Prefix, list], direction: str) -> dict[Prefix, Entry]:
    lengths: dict[int, list[int]] = {4: [], 6: []}
    for n, version in sorted({(p.prefixlen, p.version) for p in table if p is not None}, reverse=True):
        lengths[version].append(n)
    out = {}
    for prefix, own in table.items():
        entry = tuple(own) + tuple(r for p in _covering(prefix, table, lengths) for r in table[p])
        out[prefix] = _check_length(entry, f"{direction} prefix {prefix or 'any'}")
    return out


def _check_length(entry: Entry, where: str) -> Entry:
    if len(entry) > abi.RULES_PER_KEY:
        raise ClassifyError(f"{where}: {len(entry)} rules with those of covering prefixes, "
                            f"at most {abi.RULES_PER_KEY} (use fewer overlapping rules)")
    return entry


def _mask_slots(marks: dict[tuple[int, int], list], previous: tuple[int, ...]) -> tuple[int, ...]:
    """Masks in use keep their slot; a new mask takes the first slot no mask in use holds."""
    wanted = list(dict.fromkeys(mask for mask, _ in marks))
    if len(wanted) > abi.MAX_MARK_MASKS:
        raise ClassifyError(f"{len(wanted)} distinct mark masks ({', '.join(map(hex, wanted))}), "
                            f"at most {abi.MAX_MARK_MASKS}")
    slots = [m if m in wanted else 0 for m in previous]
    for mask in wanted:
        if mask not in slots:
            slots[slots.index(0)] = mask
    return tuple(slots)


def _length_slots(table: dict[Prefix, list], previous: tuple[int, ...], direction: str) -> tuple[int, ...]:
    """Lengths in use keep their slot; new ones, longest first, take the first free slots."""
    wanted = sorted({key_prefixlen(p) for p in table}, reverse=True)
    if len(wanted) > abi.MAX_PREFIX_LENGTHS:
        shown = ", ".join("any" if n == 0 else f"/{n - 8}" for n in wanted)
        raise ClassifyError(f"{direction}: {len(wanted)} distinct prefix lengths ({shown}), "
                            f"at most {abi.MAX_PREFIX_LENGTHS} (an IPv4 and an IPv6 /n count as one)")
    slots = [n if n in wanted else abi.NO_PREFIX_LENGTH for n in previous]
    for n in wanted:
        if n not in slots:
            slots[slots.index(abi.NO_PREFIX_LENGTH)] = n
    return tuple(slots)
