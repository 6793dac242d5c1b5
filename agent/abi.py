"""Constants shared by bpf/limiter.c and Python: their one source.

agent/kernel/datapath.py passes every name in :func:`cflags` to the compiler as a
``-D`` flag; bpf/limiter.h refuses to compile without them, so the C side can
never disagree with what Python writes into the maps.
"""
from __future__ import annotations

import platform
from pathlib import Path

# Map sizes (defaults; MAX_FLOWS, MAX_CLASSES and MAX_CLIENTS are load-time choices of the agent).
MAX_FLOWS = 4096
MAX_CLASSES = 4096
# Per-client state (bpf/limiter.c, "Clients"): MAX_CLIENTS sliding windows in the
# client_windows LRU map, which preallocates (an LRU cannot be BPF_F_NO_PREALLOC): ~16 MiB of
# kernel memory at 131,072 (bench/README.md, "Per-client accounting").  Heavy clients
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
# The socket mark (SO_MARK) of the agent's gossip socket.  bpf/limiter.c
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

# Fixed-point probabilities: a packet is chosen when bpf_get_prandom_u32() < p.
PROB_ONE = 1 << 32
# safe_rate_Bps meaning "no fail-safe limit".
UNLIMITED = 2**64 - 1

# The bucket in virtual time (bpf/limiter.c take_tokens, agent/kernel/bucket.py): a byte's
# price is 1e9 / rate in units of 2^-NS_FRAC_BITS ns.  MAX_NS_PER_BYTE (~7.5 bytes/s)
# keeps len * ns_per_byte within 64 bits for any skb (< 2^20 bytes); MAX_DEPTH_NS
# (~18 min) bounds a depth, and the credit limiter.c rescale converts.
NS_FRAC_BITS = 16
MAX_NS_PER_BYTE = 1 << 43
MAX_DEPTH_NS = 1 << 40
# The flow table (limiter.c tally_flow, settle): each CPU tallies a flow's
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
# Each CPU keeps up to 2^MEMO_BITS flows (limiter.c memo_of), one slot per flow
# hash: 64 KiB per CPU at 10 bits.  MEMO_CLASS 1: a slot remembers its flow's
# class too (limiter.c classify_memo), which needs loads in order (limiter.c
# reads the rules' generation before the rules with no load-acquire): x86.
MEMO_BITS = 10
MEMO_CLASS = int(platform.machine() == "x86_64")
# The program's clock: 1 = bpf_ktime_get_coarse_ns (CLOCK_MONOTONIC_COARSE, one
# jiffy of resolution, ~30 ns cheaper per packet here), 0 = bpf_ktime_get_ns.
CLOCK_COARSE = 1
# bench/datapath.py only: build the program without parts of the pipeline to
# attribute its cost (limiter.c SKIP_*: 1 flow table, 2 police, 4 clock, 8 classification).  0 in the agent.
BENCH_SKIP = 0

# A class's client rule (limiter.h class_config.client_*; agent/clients/table.py ClientRule):
# which address is the client (0: the class has no client rule), what its bucket counts,
# and which per-client maps the program looks in for the class.
CLIENT_SIDES = {"dst": 1, "src": 2}
MEASURES = {"bytes": 0, "packets": 1, "conns": 2}
CLIENT_HAS_LIMITS = 1
CLIENT_HAS_BANS = 2
CLIENT_HAS_EXEMPT = 4
# The dearest price a client bucket's unit may have, so that units x price stays within 64
# bits (limiter.c cost_ns): bytes as for a class (MAX_NS_PER_BYTE); packets are charged
# gso_segs (< 2^16) each, so at least ~0.23 packets/s; a connection is charged one unit, and
# costs at most MAX_DEPTH_NS (~18 min), the most a bucket's time can hold.
# The longest sliding window a client rule may have in the kernel (limiter.c sliding: the
# weight (W - into) << 16 stays within 64 bits): 2^47 ns, 39 hours.
MAX_CLIENT_WINDOW_NS = 1 << 47
MAX_NS_PER_UNIT = {"bytes": MAX_NS_PER_BYTE, "packets": 1 << 48, "conns": MAX_DEPTH_NS << NS_FRAC_BITS}

# Class modes (agent/model.py Mode).
MODE_PASS = 0
MODE_BUCKET = 1
MODE_DROP = 2

# tc actions for a policed packet.
DROP_ACTIONS = {"shot": 2, "stolen": 4}   # TC_ACT_SHOT, TC_ACT_STOLEN


def possible_cpus() -> int:
    """1 + the highest CPU number the kernel may ever run (/sys/devices/system/cpu/possible,
    e.g. "0-7"): the memo has 2^MEMO_BITS slots for each CPU, in one array, so that each
    slot is one cache line (limiter.h flow_memo)."""
    ranges = Path("/sys/devices/system/cpu/possible").read_text().strip().split(",")
    return max(int(r.split("-")[-1]) for r in ranges) + 1


def cflags(**sizes: int) -> list[str]:
    """``-DNAME=value`` for every shared constant; ``sizes`` overrides the map sizes
    (e.g. ``MAX_CLASSES=256``; MAX_KEYS follows it; ``MAX_CLIENTS``) and adds load-time choices such as
    ``DROP_ACTION``."""
    values = {"MAX_FLOWS": MAX_FLOWS, "MAX_CLASSES": MAX_CLASSES, "RULES_PER_KEY": RULES_PER_KEY,
              "MAX_CLIENTS": MAX_CLIENTS, "MAX_CLIENT_LIMITS": MAX_CLIENT_LIMITS,
              "MAX_CLIENT_BANS": MAX_CLIENT_BANS, "MAX_CLIENT_EXEMPT": MAX_CLIENT_EXEMPT,
              "MAX_CLIENT_HEAVY": MAX_CLIENT_HEAVY,
              "CLIENT_DST": CLIENT_SIDES["dst"], "CLIENT_SRC": CLIENT_SIDES["src"],
              "MEASURE_BYTES": MEASURES["bytes"], "MEASURE_PACKETS": MEASURES["packets"],
              "MEASURE_CONNS": MEASURES["conns"], "CLIENT_HAS_LIMITS": CLIENT_HAS_LIMITS,
              "CLIENT_HAS_BANS": CLIENT_HAS_BANS, "CLIENT_HAS_EXEMPT": CLIENT_HAS_EXEMPT,
              "MAX_MARK_MASKS": MAX_MARK_MASKS,
              "MAX_PREFIX_LENGTHS": MAX_PREFIX_LENGTHS,
              "PROB_ONE": f"{PROB_ONE}ULL", "UNLIMITED": f"{UNLIMITED}ULL",
              "MODE_PASS": MODE_PASS, "MODE_BUCKET": MODE_BUCKET, "MODE_DROP": MODE_DROP,
              "NS_FRAC_BITS": NS_FRAC_BITS, "MAX_DEPTH_NS": f"{MAX_DEPTH_NS}ULL",
              "FLOW_VISIT_NS": FLOW_VISIT_NS, "FLOW_MAX_GAP": FLOW_MAX_GAP,
              "FLOW_EPOCH_SHIFT": FLOW_EPOCH_SHIFT, "CLOCK_COARSE": CLOCK_COARSE,
              "MEMO_BITS": MEMO_BITS, "MEMO_CLASS": MEMO_CLASS, "MAX_CPUS": possible_cpus(), "BENCH_SKIP": BENCH_SKIP}
    values.update(sizes)
    values.setdefault("MAX_KEYS", KEYS_PER_CLASS * values["MAX_CLASSES"])
    return [f"-D{name}={value}" for name, value in values.items()]
