"""What agents tell each other about clients: a class's report and its ban notes, and their size.

A report must fit one datagram on its own (agent/gossip/wire.py never splits one), so its
encoded size is worked out here from the protobuf rules, without encoding it.
"""
from __future__ import annotations

from dataclasses import dataclass

from drl.agent.clients.rules import Client

# Reports: one class's report fits one 1,200-byte datagram behind the longest
# header (report_bytes; docs/clients.md "Report size").
REPORT_K = 32                 # clients per class and round
MAX_BAN_NOTES = 6             # ban notes per class and round, rotating through all bans


@dataclass(frozen=True)
class BanNote:
    """A ban (or its tombstone, ``lifted``) as gossiped; time relative, so clocks need not agree."""
    client: Client
    version: int            # grows with every ban and unban of this client; the higher wins
    remaining_s: float      # until - sender's now
    lifted: bool = False


@dataclass(frozen=True)
class ClientReport:
    """One class's heavy clients as one sender counts them (top-K, largest first) and its bans.
    ``lengths`` is the sender's (IPv4, IPv6) key: a receiver with another key ignores the report."""
    lengths: tuple[int, int]
    counts: tuple[tuple[Client, float], ...] = ()
    bans: tuple[BanNote, ...] = ()


def _varint_bytes(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def _packed_bytes(payload: int) -> int:
    """A packed repeated field: tag, length varint, payload; nothing when empty."""
    return 1 + _varint_bytes(payload) + payload if payload else 0


def _uint_bytes(value: int) -> int:
    """A proto3 integer field: tag and varint, nothing when 0."""
    return 1 + _varint_bytes(value) if value else 0


def ban_note_bytes(note: BanNote) -> int:
    """One BanNote in the proposed wire message (docs/clients.md), its tag and length included."""
    body = (2 + len(note.client) + _uint_bytes(note.version)
            + (5 if note.remaining_s else 0) + (2 if note.lifted else 0))
    return 1 + _varint_bytes(body) + body


def report_bytes(report: ClientReport) -> int:
    """The proposed ClientReport's encoded body (docs/clients.md "Report size"; without the tag and
    length that frame it): the class key, the key lengths, packed parallel arrays (IPv4 fixed32
    prefixes, IPv6 fixed64 halves, float counts), then the ban notes."""
    v4_len, v6_len = report.lengths
    n4 = sum(1 for c, _ in report.counts if len(c) == 4)
    n6 = len(report.counts) - n4
    body = 5 + _uint_bytes(v4_len) + _uint_bytes(v6_len) + 2 * _packed_bytes(4 * n4)
    body += _packed_bytes(8 * n6) * (2 if v6_len > 64 else 1) + _packed_bytes(4 * n6)
    return body + sum(map(ban_note_bytes, report.bans))
