"""Constants shared by bpf/ and Python: their one table.

Every public upper-case integer of this module is one constant, declared here
once with what it is; :func:`cflags` hands each to the compiler as a ``-D``
flag (with DRL_ABI, which bpf/consts.h checks), so the C side never restates a
name or a value and can never disagree with what Python writes into the maps.
The dicts (``CLIENT_SIDES``, ``MEASURES``, ...) are Python's views of them.
tests/unit/kernel/test_abi.py checks that every name the C code uses comes
from here, a kernel header or bpf/consts.h, and from one of them only.
"""
from __future__ import annotations

import platform
from pathlib import Path

# Map sizes (defaults; MAX_FLOWS, MAX_CLASSES and MAX_CLIENTS are load-time choices of the agent).
MAX_FLOWS = 4096
MAX_CLASSES = 4096
# Per-client state (bpf/clients.h): MAX_CLIENTS sliding windows in the
# client_windows LRU map, which preallocates (an LRU cannot be BPF_F_NO_PREALLOC): ~16 MiB of
# kernel memory at 131,072 (bench/HISTORY.md, "Per-client accounting").  Heavy clients
# (client_heavy: flagged by the program, drained by the agent every tick), throttled and
# banned clients (client_limits, client_bans) and exempt prefixes (client_exempt) are few and
# take memory only for what they hold (BPF_F_NO_PREALLOC).
MAX_CLIENTS = 131072
MAX_CLIENT_HEAVY = 16384
MAX_CLIENT_LIMITS = 16384
MAX_CLIENT_BANS = 16384
MAX_CLIENT_EXEMPT = 1024
# Entries of each classification map (dst_nets, src_nets, marks): twice the
# classes, so that Datapath.set_rules can write a whole new rule set before
# it deletes the old one.
KEYS_PER_CLASS = 2
# Rules one classification entry holds, its own and those pushed down from
# covering prefixes (agent/kernel/classify.py).
RULES_PER_KEY = 8
# Distinct mark masks a rule set may use (each costs a hash lookup per packet).
MAX_MARK_MASKS = 4
# Distinct prefix lengths per direction (destination, source) a rule set may
# use, counted as keys count them (agent/kernel/classify.py key_prefixlen: an IPv4
# and an IPv6 /24 are one length, "any" is 0).  Each length in use costs a
# packet at most one hash lookup per direction; free slots cost nothing.
MAX_PREFIX_LENGTHS = 8
# A free slot of settings.dst_lengths / src_lengths: longer than any key
# (8 + 128), so the program skips it with the lengths its family cannot have.
NO_PREFIX_LENGTH = 0xFF
# The socket mark (SO_MARK) of the agent's gossip socket.  bpf/classify.h
# exempts a packet from policing only when it is UDP from the agent's listen
# port *and* carries this mark, so other traffic to or from that port is
# policed like any other, and a mark alone exempts nothing either.  Setting
# a mark needs CAP_NET_ADMIN.  The mark also reaches netfilter and policy
# routing (ip rule fwmark), so it must not be one the host's own rules give
# meaning to: "D1D1" in the high half and nothing in the low 16 bits, which
# kube-proxy (0x4000, 0x8000), wg-quick (0xca6c) and firewalld use.  Change it
# with --gossip-mark (any value but 0).  A rule that rewrites the mark of the
# gossip on its way out makes the gossip policed (errs low, never high).
GOSSIP_MARK = 0xD1D1_0000

# Fixed-point probabilities, out of PROB_ONE = 2^32: a packet is chosen when
# bpf_get_prandom_u32() < p, so p = PROB_ONE means always and 0 never.
PROB_ONE = 1 << 32
# safe_rate_Bps meaning "no fail-safe limit".
UNLIMITED = 2**64 - 1

# The bucket in virtual time (bpf/police.h take_tokens, agent/kernel/bucket.py): a byte's
# price is 1e9 / rate in units of 2^-NS_FRAC_BITS ns.  MAX_NS_PER_BYTE (~7.5 bytes/s)
# keeps len * ns_per_byte within 64 bits for any skb (< 2^20 bytes); MAX_DEPTH_NS
# (~18 min) bounds a depth, and the credit police.h rescale converts.
NS_FRAC_BITS = 16
MAX_NS_PER_BYTE = 1 << 43
MAX_DEPTH_NS = 1 << 40
# The flow table (flows.h tally_flow, settle): each CPU tallies a flow's
# passed bytes in its memo slot, and the tally visits the table once per epoch
# of 2^FLOW_EPOCH_SHIFT ns (16.8 ms) in which the flow sends, or when another flow
# takes the slot.  A tally of fewer packets than the CPU's packets of the class
# per FLOW_VISIT_NS (at most FLOW_MAX_GAP) visits with a chance instead, and
# counts for that many: under ~4,000 packets/s per CPU and class every tally
# visits, and a CPU visits at most ~8,000 times a second per class however
# many flows share it.
FLOW_EPOCH_SHIFT = 24
FLOW_VISIT_NS = 250_000
FLOW_MAX_GAP = 256
# Each CPU keeps up to 2^MEMO_BITS flows (flows.h memo_of), one slot per flow
# hash: 64 KiB per CPU at 10 bits.  MEMO_CLASS 1: a slot remembers its flow's
# class too (flows.h classify_memo), which needs loads in order (flows.h
# reads the rules' generation before the rules with no load-acquire): x86.
MEMO_BITS = 10
MEMO_CLASS = int(platform.machine() == "x86_64")
# The program's clock: 1 = bpf_ktime_get_coarse_ns (CLOCK_MONOTONIC_COARSE, one
# jiffy of resolution, ~30 ns cheaper per packet here), 0 = bpf_ktime_get_ns.
CLOCK_COARSE = 1
# bench/datapath.py only: build the program without parts of the pipeline to
# attribute its cost (consts.h SKIP_*: 1 flow table, 2 police, 4 clock, 8 classification).  0 in the agent.
BENCH_SKIP = 0

# A class's client rule (limiter.h class_config.client_*; agent/clients/table.py ClientRule):
# which address is the client (0: the class has no client rule), what its bucket counts,
# and which per-client maps the program looks in for the class.
CLIENT_DST = 1
CLIENT_SRC = 2
CLIENT_SIDES = {"dst": CLIENT_DST, "src": CLIENT_SRC}
MEASURE_BYTES = 0
MEASURE_PACKETS = 1
MEASURE_CONNS = 2
MEASURES = {"bytes": MEASURE_BYTES, "packets": MEASURE_PACKETS, "conns": MEASURE_CONNS}
CLIENT_HAS_LIMITS = 1
CLIENT_HAS_BANS = 2
CLIENT_HAS_EXEMPT = 4
# The dearest price a client bucket's unit may have, so that units x price stays within 64
# bits (police.h cost_ns): bytes as for a class (MAX_NS_PER_BYTE); packets are charged
# gso_segs (< 2^16) each, so at least ~0.23 packets/s; a connection is charged one unit, and
# costs at most MAX_DEPTH_NS (~18 min), the most a bucket's time can hold.
# The longest sliding window a client rule may have in the kernel (clients.h sliding: the
# weight (W - into) << 16 stays within 64 bits): 2^47 ns, 39 hours.
MAX_CLIENT_WINDOW_NS = 1 << 47
MAX_NS_PER_UNIT = {"bytes": MAX_NS_PER_BYTE, "packets": 1 << 48, "conns": MAX_DEPTH_NS << NS_FRAC_BITS}

# Class modes (agent/model.py Mode): MODE_PASS counts only, MODE_BUCKET is a token bucket
# at rate_Bps (GTB/FPS, [Raghavan07] §3.2), MODE_DROP drops at random with drop_prob (GRD,
# same paper, Fig. 1).
MODE_PASS = 0
MODE_BUCKET = 1
MODE_DROP = 2

# What a policed packet gets, a load-time choice passed as DROP_ACTION: TC_ACT_STOLEN by
# default, TC_ACT_SHOT on request.  SHOT returns NET_XMIT_DROP to the local TCP stack, which
# enters CWR on every drop; STOLEN looks like a loss on the wire.  Measured in
# bench/HISTORY.md ("drop action").
DROP_ACTIONS = {"shot": 2, "stolen": 4}   # TC_ACT_SHOT, TC_ACT_STOLEN


def possible_cpus() -> int:
    """1 + the highest CPU number the kernel may ever run (/sys/devices/system/cpu/possible,
    e.g. "0-7"): the memo has 2^MEMO_BITS slots for each CPU, in one array, so that each
    slot is one cache line (limiter.h flow_memo)."""
    ranges = Path("/sys/devices/system/cpu/possible").read_text().strip().split(",")
    return max(int(r.split("-")[-1]) for r in ranges) + 1


def shared() -> dict[str, int]:
    """Every constant of the table: this module's public upper-case integers, by name."""
    return {name: value for name, value in globals().items()
            if name.isupper() and not name.startswith("_") and type(value) is int}


# Chosen when the program is loaded, not constants of the table: the CPUs the memo is sized
# for (possible_cpus()), the classification maps' entries (KEYS_PER_CLASS x MAX_CLASSES) and
# what a policed packet gets (a value of DROP_ACTIONS).
LOAD_TIME = ("MAX_CPUS", "MAX_KEYS", "DROP_ACTION")


def cflags(**sizes: int) -> list[str]:
    """``-DNAME=value`` for every constant of the table, and DRL_ABI; ``sizes`` overrides
    constants (e.g. ``MAX_CLASSES=256``; MAX_KEYS follows it; ``MAX_CLIENTS``) and gives the
    LOAD_TIME choices such as ``DROP_ACTION``.  A name neither in the table nor LOAD_TIME is
    refused: a constant is declared here or nowhere."""
    unknown = sizes.keys() - shared().keys() - set(LOAD_TIME)
    if unknown:
        raise ValueError(f"not constants of agent/abi.py: {', '.join(sorted(unknown))}")
    values = {**shared(), "MAX_CPUS": possible_cpus(), **sizes}
    values.setdefault("MAX_KEYS", KEYS_PER_CLASS * values["MAX_CLASSES"])
    # above 2^31 a plain literal would be a long (or not fit): say unsigned 64 bits
    return ["-DDRL_ABI=1", *(f"-D{name}={value}ULL" if value >= 2**31 else f"-D{name}={value}"
                             for name, value in values.items())]
