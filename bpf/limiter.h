/* Structs shared by bpf/ and agent/kernel/ (Datapath's parts, agent/kernel/datapath.py).
 *
 * Python never re-declares these layouts: agent/kernel/ reads and writes
 * every map through bcc's table.Key / table.Leaf types, which bcc builds from
 * the definitions below.  Keep them fixed-width with explicit padding so the
 * layout is the same on every compiler.
 */
#pragma once

#include <linux/types.h>

/* The array lengths below (RULES_PER_KEY, MAX_MARK_MASKS, ...) come from agent/abi.py
 * as -D flags, like every constant shared with Python (consts.h). */
#include "consts.h"

/* One rule of a classification entry (agent/kernel/classify.py places them).
 * Written by agent/kernel/rule_maps.py (_encode_rule) from agent/classes/spec.py ClassRule.
 * A field matches when (packet ^ value) & mask == 0: a zero mask matches
 * anything (classify.h rule_matches says why masks, not "0 = any").
 * Addresses are in network byte order; an IPv4 address uses word 0 only. */
struct rule {
	__u32 src[4];
	__u32 src_mask[4];
	__u32 dst[4];
	__u32 dst_mask[4];
	__u16 sport;        /* host byte order */
	__u16 sport_mask;
	__u16 dport;        /* host byte order */
	__u16 dport_mask;
	__u8  family;       /* 4 or 6 */
	__u8  family_mask;
	__u8  proto;        /* IPPROTO_* */
	__u8  proto_mask;
	__u32 class_id;
};

/* Value of every classification map: rules[i], i < n, tried in
 * order; the first match wins.  An entry carries its own rules, then those
 * of the shorter prefixes covering it (agent/kernel/classify.py, push-down). */
struct rule_list {
	__u32 n;
	__u32 pad0;
	struct rule rules[RULES_PER_KEY];
};

/* Key of the prefix hashes dst_nets and src_nets: a prefix of prefixlen
 * bits, where the family byte counts as the first 8 (as in an LPM trie key):
 * "any address" is prefixlen 0 (family 0 too), an IPv4 /24 is 8 + 24.  The
 * address is masked to the prefix, so a packet finds the entry of its
 * prefix of a given length by masking its own address (classify.h net_key).
 * Written by agent/kernel/rule_maps.py (_encode_prefix). */
struct net_key {
	__u32 prefixlen;
	__u32 addr[4];      /* network byte order, as in rule; IPv4 uses word 0 */
	__u8  family;       /* 4 or 6; 0 for prefixlen 0 */
	__u8  pad0[3];
};

/* Key of marks: a rule for skb->mark & mask == mark. */
struct mark_key {
	__u32 mask;
	__u32 mark;
};

/* settings[0]: run-time knobs that are not per class.  Written by
 * agent/kernel/ (rule_maps.py set_rules, client_maps.py, datapath.py: the rest).
 * With abi.py's 4 masks and 8 lengths there is no padding.
 * An update of an array value is a copy in place, not atomic: a packet may
 * read some slots before it and some after.  So mark masks and prefix
 * lengths keep their slot while they are in use (agent/kernel/classify.py): a slot
 * read mid-update holds the old or the new value, each of them safe
 * (Datapath.set_rules says why). */
struct settings {
	/* What every packet reads (classify.h exempt, classify_memo) first, in the
	 * value's first cache line (the map is BPF_F_MMAPABLE: the value starts a page). */
	__u32 rules_gen;                         /* moved on after every change of the rules; 0 = no memo (flows.h classify_memo) */
	__u32 gossip_mark;                       /* the agent's own gossip: skb->mark == gossip_mark */
	__u16 gossip_port;                       /*   and UDP from this port; 0 = nothing is exempt */
	__u16 registry_port;                     /*   or TCP to this port (etcd); 0 = none */
	__u32 client_gen;                        /* moved on by a new ban or throttled client; never 0 (clients.h clients) */
	__u64 sample_prob;                       /* out of PROB_ONE: chance that a new flow enters the flow table (FPS) */
	__u32 mark_masks[MAX_MARK_MASKS];        /* tried in order; 0 = free slot */
	__u8  dst_lengths[MAX_PREFIX_LENGTHS];   /* net_key prefixlens in dst_nets, any order; > 8 + 128 = free */
	__u8  src_lengths[MAX_PREFIX_LENGTHS];   /* the same for src_nets */
};

/* config[class_id]: what the agent decided for a class.
 * Written only by agent/kernel/class_maps.py (set_class); read by the program.
 * A rate is also kept as time, worked out by agent/kernel/bucket.py (bucket_times)
 * so that a packet never divides (police.h take_tokens): *ns_per_byte is
 * 1e9 / rate in 2^-NS_FRAC_BITS ns (0 = rate 0), *depth_ns the depth at that
 * price.  What a packet of a class without a client rule reads comes first,
 * in one cache line (the map is BPF_F_MMAPABLE, so its values start a page,
 * and the struct is 3 lines long): it read 3 lines before. */
struct class_config {
	__u64 ns_per_byte;         /* the bucket's price */
	__u64 depth_ns;
	__u64 floor_ns_per_byte;   /* 0 = no floor (police.h policy_of) */
	__u64 updated_ns;          /* bpf_ktime_get_ns() clock (CLOCK_MONOTONIC) at the agent's last write */
	__u64 timeout_ns;          /* 0 = never; timeout_ns after the later of updated_ns and heartbeat[0]
	                            * (the agent's last tick) the safe rate applies (police.h stale) */
	__u64 drop_prob;           /* MODE_DROP, out of PROB_ONE */
	__u32 mode;                /* MODE_* */
	__u32 quota_seq;           /* 0 = no quota; agent/kernel/class_maps.py bumps it on every new allowance */
	__u32 shape_prio;          /* 0 = police; else the class's HTB handle, set as skb->priority (police.h shape) */
	__u8  shadow;              /* 1 = a would-be drop is counted as dropped but passed (police.h refuse) */
	/* The class's client rule (agent/clients/table.py ClientRule; clients.h clients), written by
	 * set_client_rule and kept by set_class.  client_side 0: no rule, the only field a
	 * packet of the class then reads. */
	__u8  client_side;         /* 0, CLIENT_DST or CLIENT_SRC: the address that is the client */
	__u16 client_flags;        /* CLIENT_HAS_*: the class has entries in client_limits, client_bans, client_exempt */
	/* 64 bytes: the rest is read when the rates above do not apply, or by a client rule. */
	__u64 rate_Bps;            /* token refill rate, bytes/s */
	__u64 burst_bytes;         /* bucket depth */
	__u64 safe_rate_Bps;       /* fail-safe bucket rate when the agent is silent; UNLIMITED = pass */
	__u64 safe_burst_bytes;
	__u64 safe_ns_per_byte;
	__u64 safe_depth_ns;
	__u64 floor_rate_Bps;      /* a bucket never refills slower: FPS slow start (police.h policy_of) */
	__u64 floor_depth_ns;
	__u64 quota_bytes;         /* byte allowance, loaded when quota_seq changes */
	__u8  client_measure;      /* MEASURE_*: the unit a client_limits bucket charges */
	__u8  pad0[3];
	__u32 client_mask4;        /* the client's prefix of an IPv4 address: addr & mask (network order) */
	__u32 client_mask6[4];     /* the same for IPv6 */
	__u64 client_window_ns;    /* the threshold's sliding window (clients.h count_client) */
	__u64 client_line;         /* a client whose count reaches it goes into client_heavy; in the measure's units */
	__u64 client_hold_ns_per_unit;  /* and is held at T/N from then on (clients.h hold_client); 0 = not */
	__u64 client_hold_depth_ns;
};

/* A token bucket as virtual time (police.h take_tokens), a class's or a client's. */
struct gcra {
	__u64 tat;                 /* virtual time (GCRA): credit is now - tat ns at ns_per_byte, < 0 = debt */
	__u64 ns_per_byte;         /* the price tat was last charged at (per byte, or per unit of a client
	                            * rule's measure); 0 = fresh (police.h rescale) */
};

/* buckets[class_id]: bucket and quota state, written by the program (two
 * CPUs may police the same class at once: tat with atomics, the quota under
 * the lock).  agent/kernel/class_maps.py reads quota_left (read_quota) and writes
 * tat = now in reset_class (an empty bucket). */
struct bucket {
	struct bpf_spin_lock lock; /* quota only */
	__u32 quota_seq;           /* config.quota_seq that quota_left was loaded from */
	struct gcra gcra;
	__u64 quota_left;          /* bytes the class may still pass (when config.quota_seq != 0) */
	__u64 pad0[4];             /* a line of its own: two CPUs charging two classes never share one */
};

/* counters[class_id] (per CPU) and bypass_counters[0] (per CPU; unmatched or exempt
 * packets, dropped_* stay 0).  Written by the program; agent/kernel/class_maps.py
 * sums the CPUs (read_counters, read_bypass).  Bytes are what the limit
 * counts: see wire_bytes() in count.h. */
struct counters {
	__u64 passed_bytes;
	__u64 passed_packets;
	__u64 dropped_bytes;
	__u64 dropped_packets;
	/* The program's own (flows.h visit_every): this CPU's packets of the class
	 * per FLOW_VISIT_NS, which a tally must reach to visit the flow table whole. */
	__u32 flow_every;          /* 0 = not measured yet */
	__u32 pad0;
	__u64 flow_mark_ns;        /* start of the window the packet rate is measured over */
	__u64 flow_mark_packets;   /* passed + dropped packets at flow_mark_ns */
	/* Refused by the class's client rule (clients.h refuse_client), neither passed nor
	 * dropped: last, off the cache line every packet of the class touches. */
	__u64 throttled_bytes;     /* over a client_limits bucket (egress) */
	__u64 throttled_packets;
	__u64 banned_bytes;        /* from or to a client in client_bans (egress and ingress) */
	__u64 banned_packets;
};

/* clock_cache[0] (per CPU): the coarse clock as of the jiffy it was read in
 * (clock.h clock_ns); the program's own, nobody else reads it. */
struct clock_cache {
	__u64 jiffies;
	__u64 ns;
};

/* flows: key of the LRU flow table (FPS's sample set). Addresses as in rule. */
struct flow_key {
	__u32 src[4];
	__u32 dst[4];
	__u16 sport;               /* host byte order; 0 when not TCP/UDP */
	__u16 dport;
	__u8  family;              /* 4 or 6 */
	__u8  proto;
	__u16 pad0;
};

/* memos[cpu << MEMO_BITS | slot]: what a CPU keeps of the last flow whose
 * packets took the slot (flows.h memo_of): its class as classify found it
 * while settings.rules_gen was gen (flows.h classify_memo), and the tally of
 * its passed bytes not yet in the flow table (flows.h tally_flow).  The
 * program's own.  One cache line: the map is BPF_F_MMAPABLE, so its values
 * start a page (a per-CPU array's may start anywhere, and a slot took two). */
struct flow_memo {
	struct flow_key key;
	__u32 mark;                /* skb->mark: mark rules classify by it */
	__u32 gen;                 /* settings.rules_gen class_id was found in; 0 = none */
	__s32 class_id;            /* or NO_CLASS (-1) */
	__u32 packets;             /* passed since the tally began */
	__u32 bytes;               /* one CPU's of one flow in one epoch: 2^32 would take 2 Tbit/s */
	__u16 epoch;               /* now >> FLOW_EPOCH_SHIFT (its low 16 bits) when the tally began */
	__u16 pad0;
};

/* flows: value.  Created by the program for a sampled new flow, updated on
 * a later visit (flows.h visit), started over when the rules move the
 * flow to another class, and copied to flows_visited then; agent/kernel/flows.py
 * reads both (read_flows).  bytes/packets count what passed the limiter. */
struct flow_stats {
	__u64 bytes;
	__u64 packets;
	__u64 first_ns;
	__u64 last_ns;
	__u32 class_id;
	__u32 rules_gen;           /* settings.rules_gen class_id was found in (flow_memo.gen) */
};

/* Key of every per-client map but client_exempt: a client of a class, its address cut to
 * the class's prefix (class_config.client_mask*).  Written by agent/kernel/client_maps.py
 * (_client_key) and the program (clients.h client_of); read_heavy decodes it. */
struct client_key {
	__u32 class_id;
	__u8  family;              /* 4 or 6 */
	__u8  pad0[3];
	__u32 addr[4];             /* network byte order; IPv4 uses word 0 */
};

/* client_windows: a client's sliding window counter ([RLDesign] "Sliding window counter
 * algorithm") in its class's measure: the count of the fixed window [index W, (index + 1) W)
 * of the program's clock and of the one before, as agent/clients/table.py Windows keeps them.
 * Arrivals (throttled or not; not what a ban dropped, nor exempt addresses).  Written by
 * the program (atomic adds); the agent reads the entries of the clients it follows
 * (client_counts) and deletes those whose count must start over (forget_clients). */
struct client_window {
	__u64 index;               /* now / client_window_ns of the window cur counts */
	__u64 prev;                /* the count of window index - 1 */
	__u64 cur;
	__u64 flagged;             /* index + 1 of the window it went into client_heavy in; 0 = never */
	__u64 clear_gen;           /* the program's: settings.client_gen in which the client was found
	                            * neither banned nor throttled; 0 = not (clients.h clients); 64 bits:
	                            * moved by compare-and-swap, which bcc's LLVM has for 64 bits only */
};

/* client_limits: a held or throttled client's bucket.  The prices and depths are written by
 * agent/kernel/client_maps.py set_client_limits (agent/kernel/bucket.py unit_times, per unit of the
 * class's client_measure), or by the program at the class's hold price (clients.h hold_client);
 * gcra is the program's, set empty (tat = now) on a new entry. */
struct client_bucket {
	struct gcra gcra;
	__u64 ns_per_unit;         /* the client's share of the threshold as a price; 0 = rate 0 */
	__u64 depth_ns;
	__u64 safe_ns_per_unit;    /* when the class's config is stale (police.h stale): T/N */
	__u64 safe_depth_ns;
};

/* client_exempt: an LPM trie of exempt prefixes per class.  The data compared is class_id,
 * family, then the address, so prefixlen is 64 + the prefix's length.  Written by
 * agent/kernel/client_maps.py set_client_rule; the value is unused (1). */
struct exempt_key {
	__u32 prefixlen;
	__u32 class_id;
	__u32 family;              /* 4 or 6 */
	__u32 addr[4];             /* network byte order; IPv4 uses word 0 */
};
