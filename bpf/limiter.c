/* drl's datapath: a tc egress classifier (clsact, direct-action) for IPv4/IPv6.
 *
 * Every packet goes classify -> clients -> police -> count -> tally, from map
 * state alone: the kernel never waits for Python (design.md).  agent/kernel/datapath.py
 * compiles this file with bcc, attaches it at egress, writes `settings`,
 * the classification maps (agent/kernel/classify.py lays them out), `config`,
 * `heartbeat` and the client maps, and reads `counters`, `bypass_counters`,
 * `flows`, `flows_visited`, `client_windows` and `client_heavy`.  A second
 * entry point, drl_ingress, drops banned clients' packets on their way in
 * (docs/clients.md).
 * Layouts of every map value are in limiter.h.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/tcp.h>
#include "limiter.h"

/* Arrays every packet reads are BPF_F_MMAPABLE, not to map them but because
 * such a map's values start a page, so limiter.h can keep what a packet reads
 * of a value in one cache line (an array's values start at any multiple of 8
 * otherwise, per-CPU ones too). */
BPF_F_TABLE("array", int, struct settings, settings, 1, BPF_F_MMAPABLE); /* agent writes; classify, visit read */
/* Classification (agent/kernel/classify.py lays them out; the agent writes, classify
 * reads).  Every prefix of a direction sits in one hash, keyed by its length
 * and masked address, and settings lists the lengths in use: a packet costs
 * one hash lookup per length in use, whatever the number of classes.  An LPM
 * trie walks one node per level: 4,096 /24s cost +35 % per packet there
 * (bench/README.md, "classification"). */
BPF_F_TABLE("hash", struct net_key, struct rule_list, dst_nets, MAX_KEYS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct net_key, struct rule_list, src_nets, MAX_KEYS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct mark_key, struct rule_list, marks, MAX_KEYS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("array", int, struct flow_memo, memos, MAX_CPUS << MEMO_BITS, BPF_F_MMAPABLE); /* memo_of's own */
BPF_F_TABLE("array", int, struct class_config, config, MAX_CLASSES, BPF_F_MMAPABLE); /* agent writes; police reads */
BPF_ARRAY(heartbeat, __u64, 1);                          /* agent writes every tick; stale reads (8 bytes: one line anyway) */
BPF_F_TABLE("array", int, struct bucket, buckets, MAX_CLASSES, BPF_F_MMAPABLE); /* police writes; agent reads quota */
BPF_PERCPU_ARRAY(counters, struct counters, MAX_CLASSES); /* count writes; agent sums CPUs */
BPF_PERCPU_ARRAY(bypass_counters, struct counters, 1);   /* bypass writes; agent sums CPUs */
BPF_TABLE("lru_hash", struct flow_key, struct flow_stats, flows, MAX_FLOWS); /* visit writes; agent reads */
/* visit writes (an update, ~150 ns: preallocated, ~210 without); the agent drains */
BPF_TABLE("hash", struct flow_key, struct flow_stats, flows_visited, MAX_FLOWS);
BPF_PERCPU_ARRAY(clock_cache, struct clock_cache, 1);     /* clock_ns's own */
/* Per client (docs/clients.md; limiter.c clients): each client's sliding
 * window, and the clients whose count reached their class's line (heavy), so
 * that the agent reads those and the few it follows, never all of them.  LRU:
 * a flood of new clients (spoofed sources) evicts idle entries, not the
 * clients that keep sending; an LRU map is always preallocated (its memory:
 * bench/README.md, "Per-client accounting").  Bans are a plain hash: an
 * eviction would unban.  The others take memory only for what they hold. */
BPF_TABLE("lru_hash", struct client_key, struct client_window, client_windows, MAX_CLIENTS); /* clients write */
BPF_F_TABLE("hash", struct client_key, __u8, client_heavy, MAX_CLIENT_HEAVY,
	    BPF_F_NO_PREALLOC);                                 /* count_client adds; the agent drains */
BPF_F_TABLE("hash", struct client_key, struct client_bucket, client_limits, MAX_CLIENT_LIMITS,
	    BPF_F_NO_PREALLOC);                                 /* agent writes prices; throttle charges */
BPF_F_TABLE("hash", struct client_key, __u64, client_bans, MAX_CLIENT_BANS,
	    BPF_F_NO_PREALLOC);                                 /* agent writes until_ns; banned reads */
BPF_F_TABLE("lpm_trie", struct exempt_key, __u8, client_exempt, MAX_CLIENT_EXEMPT,
	    BPF_F_NO_PREALLOC);                                 /* agent writes; exempt_client reads */

/* TCP and UDP both start with the two ports.  l4 is where the transport
 * header would be; ports stay 0 for other protocols and short packets. */
static __always_inline void parse_ports(struct flow_key *k, struct udphdr *l4, void *end)
{
	if ((k->proto == IPPROTO_TCP || k->proto == IPPROTO_UDP) && (void *)(l4 + 1) <= end) {
		k->sport = bpf_ntohs(l4->source);
		k->dport = bpf_ntohs(l4->dest);
	}
}

/* Fill k from an IPv4 header at ip; < 0 when truncated.  Fragments carry
 * no ports (the first one does, but the rest of the datagram would not). */
static __always_inline int parse_ipv4(struct flow_key *k, struct iphdr *ip, void *end)
{
	if ((void *)(ip + 1) > end)
		return -1;
	k->family = 4;
	k->proto = ip->protocol;
	k->src[0] = ip->saddr;
	k->dst[0] = ip->daddr;
	if (!(ip->frag_off & bpf_htons(0x3fff)))  /* neither MF nor an offset */
		parse_ports(k, (void *)ip + ip->ihl * 4, end);
	return 0;
}

/* Fill k from an IPv6 header at ip6; < 0 when truncated.  Extension
 * headers are not walked: behind one, ports stay 0. */
static __always_inline int parse_ipv6(struct flow_key *k, struct ipv6hdr *ip6, void *end)
{
	if ((void *)(ip6 + 1) > end)
		return -1;
	k->family = 6;
	k->proto = ip6->nexthdr;
	__builtin_memcpy(k->src, &ip6->saddr, 16);
	__builtin_memcpy(k->dst, &ip6->daddr, 16);
	parse_ports(k, (void *)(ip6 + 1), end);
	return 0;
}

/* Fill k from the headers; < 0 for non-IP (ARP passes untouched). */
static __always_inline int parse(struct __sk_buff *skb, struct flow_key *k)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end)
		return -1;
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return parse_ipv4(k, (void *)(eth + 1), end);
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return parse_ipv6(k, (void *)(eth + 1), end);
	return -1;
}

/* Branch-free on purpose: every bit of a field under its mask must equal
 * the rule's.  With an early return per field, the verifier learns each
 * field's range on each path ("sport != 0") and cannot merge the paths of
 * one rule into the next: 8 rules x 6 lookups exceed its 1M-instruction
 * budget (E2BIG).  XOR/AND/OR teach it nothing, so the paths merge. */
static __always_inline int rule_matches(const struct rule *r, const struct flow_key *k)
{
	__u32 miss = ((k->sport ^ r->sport) & r->sport_mask) | ((k->dport ^ r->dport) & r->dport_mask) |
		     ((k->family ^ r->family) & r->family_mask) | ((k->proto ^ r->proto) & r->proto_mask);

	for (int w = 0; w < 4; w++)
		miss |= ((k->src[w] ^ r->src[w]) & r->src_mask[w]) | ((k->dst[w] ^ r->dst[w]) & r->dst_mask[w]);
	return miss == 0;
}

/* The class of an entry's first matching rule, or NO_CLASS.  A class id,
 * not a pointer into the entry: the verifier would follow every (map, rule
 * index) the pointer could be through the rest of the program. */
#define NO_CLASS -1

static __always_inline __s64 first_match(const struct rule_list *l, const struct flow_key *k)
{
	if (!l)
		return NO_CLASS;
	for (__u32 i = 0; i < RULES_PER_KEY; i++) {
		if (i >= l->n)
			break;
		if (rule_matches(&l->rules[i], k))
			return l->rules[i].class_id;
	}
	return NO_CLASS;
}

/* Mark rules, one hash lookup per installed mask, in slot order. */
static __always_inline __s64 by_mark(const struct settings *s, const struct flow_key *k, __u32 mark)
{
	for (__u32 i = 0; i < MAX_MARK_MASKS; i++) {
		struct mark_key mk = { .mask = s->mark_masks[i], .mark = mark & s->mark_masks[i] };
		__s64 class_id;

		if (!mk.mask)
			continue;
		class_id = first_match(marks.lookup(&mk), k);
		if (class_id != NO_CLASS)
			return class_id;
	}
	return NO_CLASS;
}

/* Hides x from the compiler's pattern matching (libbpf's barrier_var). */
#define opaque(x) asm volatile("" : "+r"(x))

/* The first `bits` bits (clamped to 0..32) of a word, as a mask in network
 * byte order.  Branch-free like rule_matches: x & ~(x >> 63) is max(x, 0),
 * and opaque() keeps clang from turning it back into a compare and jump,
 * which made the verifier walk every length x word case (E2BIG). */
static __always_inline __u32 word_mask(__s64 bits)
{
	__s64 sign = bits >> 63;

	opaque(sign);
	bits = 32 - (bits & ~sign);
	sign = bits >> 63;
	opaque(sign);
	bits &= ~sign;                  /* 32 - min(bits, 32): the bits to clear */
	return bpf_htonl((__u32)(0xFFFFFFFFULL << bits));
}

/* The key of the prefix of length len (net_key: family byte included, so
 * len is 0 or 8 + bits) that contains addr. */
static __always_inline void net_key(struct net_key *nk, __u32 len, __u8 family, const __u32 *addr)
{
	nk->prefixlen = len;
	nk->family = family & -(__s32)((len + 0xFF) >> 8);   /* 0 when len is 0 */
	for (int w = 0; w < 4; w++)
		nk->addr[w] = addr[w] & word_mask((__s64)len - 8 - 32 * w);
}

/* The entry of addr's longest prefix in dst_nets (src_nets if src), or NULL:
 * one lookup per length in use that is longer than the longest hit so far.
 * The agent fills the slots longest first, so usually the first hit ends
 * the search; slots keep their length while it is in use (limiter.h,
 * settings), so the order can be any after a change.  A length longer than
 * the family allows (free slots included) is skipped. */
static __always_inline struct rule_list *longest_prefix(const __u8 *lengths, const __u32 *addr, __u8 family,
							int src)
{
	__u32 max_len = 8 + 32 + 96 * (family >> 1 & 1);   /* 4: 8 + 32, 6: 8 + 128; no branch (see rule_matches) */
	struct rule_list *best = NULL;
	__s32 best_len = -1;

	for (__u32 i = 0; i < MAX_PREFIX_LENGTHS; i++) {
		__u32 len = lengths[i];
		struct net_key nk = {};
		struct rule_list *l;

		if (len > max_len || (__s32)len <= best_len)
			continue;
		net_key(&nk, len, family, addr);
		l = src ? src_nets.lookup(&nk) : dst_nets.lookup(&nk);
		if (l) {
			best = l;
			best_len = len;
		}
	}
	return best;
}

/* The packet's class, or NO_CLASS (bypass): mark rules, then the longest
 * destination prefix, then the longest source prefix (agent/kernel/classify.py).
 * An entry carries the rules of the prefixes covering it after its own, so
 * the longest prefix's entry is the only one to read. */
static __always_inline __s64 classify(const struct settings *s, const struct flow_key *k, __u32 mark)
{
	__s64 class_id = by_mark(s, k, mark);

	if (class_id != NO_CLASS)
		return class_id;
	class_id = first_match(longest_prefix(s->dst_lengths, k->dst, k->family, 0), k);
	if (class_id != NO_CLASS)
		return class_id;
	return first_match(longest_prefix(s->src_lengths, k->src, k->family, 1), k);
}

/* One clock read per policed packet, shared by police and the flow tally.  Coarse
 * (CLOCK_COARSE, agent/abi.py): CLOCK_MONOTONIC_COARSE, the time at the last
 * jiffy (4 ms at HZ=250), which changes once a jiffy, so each CPU reads it
 * once a jiffy and keeps it with the jiffy it belongs to: a packet pays
 * bpf_jiffies64 (one load) and a compare, not the ~15 ns of the timekeeper's
 * read, nor the ~35 ns of bpf_ktime_get_ns (bench/README.md, "per packet").
 * A packet that sees a new jiffy before the tick updated the timekeeper keeps
 * the old time for that jiffy: now lags by up to two jiffies.  The bucket
 * loses nothing but the lag (take_tokens); the fail-safe compares against the
 * agent's CLOCK_MONOTONIC stamp, late by 8 ms at most, and the flow table's
 * times are read at a 1 s scale (agent/estimator.py). */
static __always_inline __u64 clock_ns(void)
{
	struct clock_cache *c;
	__u32 zero = 0;
	__u64 j;

	if (!CLOCK_COARSE)
		return bpf_ktime_get_ns();
	c = clock_cache.lookup(&zero);
	if (!c)
		return bpf_ktime_get_coarse_ns();
	j = bpf_jiffies64();
	if (c->jiffies != j) {
		c->jiffies = j;
		c->ns = bpf_ktime_get_coarse_ns();
	}
	return c->ns;
}

/* The flow table (FPS's sample set, [Raghavan07] Fig. 2 FPS-HANDLE-PACKET
 * line 1).  A packet does not visit it: each CPU tallies a flow's passed
 * bytes in the flow's memo slot, a line the packet reads anyway, and the
 * tally visits the table once per epoch of 2^FLOW_EPOCH_SHIFT ns (16.8 ms) the
 * flow sends in, or when another flow takes the slot (tally_flow, memo_of).
 * A visit (an LRU lookup, atomic adds on a line other CPUs write, an update
 * of flows_visited) cost 500-900 ns live with its lines cold, and every CPU
 * paid ~4,000 a second when packets visited at random: at 16 TCP flows that
 * was most of the program's cost over a trivial one (bench/README.md, "Per
 * packet").  Now a flow sending on one CPU visits ~60 times a second, with
 * exact counts. */

/* This CPU's packets of the class per FLOW_VISIT_NS (at least 1, at most
 * FLOW_MAX_GAP), measured over windows of 16 ms or more: the smallest tally
 * that visits whole (settle).  One division per window. */
static __always_inline __u32 visit_every(struct counters *ctr, __u64 now)
{
	__u64 packets = ctr->passed_packets + ctr->dropped_packets, every;

	if (now - ctr->flow_mark_ns < 16000000 && ctr->flow_every)
		return ctr->flow_every;
	every = (packets - ctr->flow_mark_packets) * FLOW_VISIT_NS / (now - ctr->flow_mark_ns | 1);
	ctr->flow_mark_ns = now;
	ctr->flow_mark_packets = packets;
	ctr->flow_every = every < 1 ? 1 : every > FLOW_MAX_GAP ? FLOW_MAX_GAP : every;
	return ctr->flow_every;
}

/* The flow's entry as this visit left it, for the agent: it drains this map
 * every tick (one lookup-and-delete batch) and so reads the few hundred
 * entries visited, not the whole table (20,000 entries cost ~5 ms of
 * syscalls a tick: bench/README.md, "Agent cost with many flows").  An
 * update, not a copy into the entry found: it replaces the element under the
 * bucket's lock, which the drain takes too, so a visit lands either in what
 * this tick's drain reads or in what stays for the next one (a copy into an
 * element the drain had just taken would be lost).  Two CPUs visiting one
 * flow at once may leave the older snapshot last: a later visit or the full
 * read brings the rest (counts are cumulative; agent/estimator.py takes a
 * sample below the last one as 0).  A full map (more flows visited in one
 * tick than the table holds) drops the copy; the agent's full read of the
 * table every few seconds catches up. */
static __always_inline void note_visit(struct flow_key *k, struct flow_stats *f)
{
	flows_visited.update(k, f);
}

/* A tracked flow counts the bytes; an untracked one joins the sample set
 * with sample_prob per packet of the tally (at most 1).  last_ns is the time
 * of the flow's last visit.  An entry is the class's that its tallies are
 * counted in: when the rules move the flow (classify_memo settles the old
 * class's tally first), the first tally classified under the newer rules
 * starts the entry over as its class's, a new flow of it, else the old
 * class's FPS would go on counting the flow's bytes and the new one's never
 * see it.  Only a newer generation moves it (rules_gen): an old class's last
 * tally, which a CPU settles only when the flow sends there again or loses
 * the slot, joins the entry where it is, and so do the tallies of one flow
 * whose packets carry marks of two classes (one entry per flow: it may go to
 * the other class at each change of the rules, not at each tally).  The
 * move is one replacing update: adds other CPUs make to the replaced entry
 * meanwhile are lost (one tally each), as they are when the LRU evicts an
 * entry under them. */
static __always_inline void visit(const struct settings *s, struct flow_memo *m, __u64 bytes, __u64 packets,
				  __u64 now)
{
	struct flow_key *k = &m->key;
	struct flow_stats *f = flows.lookup(k);
	struct flow_stats fresh = { .bytes = bytes, .packets = packets, .first_ns = now, .last_ns = now,
				    .class_id = m->class_id, .rules_gen = m->gen };

	if (f && f->class_id != m->class_id && (__s32)(m->gen - f->rules_gen) > 0) {
		if (flows.update(k, &fresh) == 0)
			note_visit(k, &fresh);
		return;
	}
	if (!f) {
		if ((__u64)bpf_get_prandom_u32() >= s->sample_prob * packets)
			return;
		if (flows.insert(k, &fresh) == 0) {
			note_visit(k, &fresh);
			return;
		}
		/* NOEXIST lost: another CPU entered the flow meanwhile (epochs start
		 * at the same time on every CPU, so a new flow sending from two
		 * settles on both at once).  Our tally goes into its entry. */
		f = flows.lookup(k);
		if (!f)
			return;
	}
	__sync_fetch_and_add(&f->bytes, bytes);
	__sync_fetch_and_add(&f->packets, packets);
	f->last_ns = now;
	note_visit(k, f);
}

/* The slot m's tally, if at least every = visit_every packets, visits
 * whole.  A smaller one (a flow of a few packets an epoch among many on a
 * busy CPU) visits with probability packets / every and then counts every
 * packets (Horvitz-Thompson: its flow's counts stay unbiased), so that the
 * CPU's visits stay under about twice its packets per FLOW_VISIT_NS however
 * many flows share it: a class under 4,000 packets a second per CPU
 * (every = 1) is counted exactly. */
static __always_inline void settle(const struct settings *s, struct counters *ctr, struct flow_memo *m, __u64 now)
{
	__u64 bytes = m->bytes, packets = m->packets;
	__u32 every;

	if (!packets || !ctr)
		return;
	every = visit_every(ctr, now);
	if (packets < every) {
		if (bpf_get_prandom_u32() % every >= packets)
			return;
		bytes = bytes * every / packets;
		packets = every;
	}
	visit(s, m, bytes, packets, now);
}

/* A flow's slot in memos: its words folded, then Fibonacci hashing (the top
 * bits of the product depend on every bit folded in).  The destination is
 * multiplied in, not XORed, so A -> B and B -> A take different slots. */
static __always_inline __u32 memo_slot(const struct flow_key *k, __u32 mark)
{
	__u32 src = 0, dst = 0;

	for (int w = 0; w < 4; w++) {
		src ^= k->src[w];
		dst ^= k->dst[w];
	}
	src = (src * 0x9E3779B1u ^ dst) * 0x9E3779B1u ^ ((__u32)k->sport << 16 | k->dport) ^ mark;
	return (__u64)((src * 0x9E3779B1u ^ k->proto) * 0x9E3779B1u) >> (32 - MEMO_BITS);  /* __u64: 0 bits, no UB */
}

/* m is this flow's.  Branch-free, like rule_matches.  struct flow_key is 10
 * words, padding zeroed (drl_egress). */
static __always_inline int same_flow(const struct flow_memo *m, const struct flow_key *k, __u32 mark)
{
	const __u32 *a = (const __u32 *)&m->key, *b = (const __u32 *)k;
	__u32 miss = m->mark ^ mark;

	for (int w = 0; w < sizeof(*k) / 4; w++)
		miss |= a[w] ^ b[w];
	return miss == 0;
}

/* The slot's tally settles now, as its class's (whose counters give m), and
 * the slot starts an empty one: at a new epoch (tally_flow), when another
 * flow takes the slot, or when the rules move the flow to another class. */
static __always_inline void settle_slot(const struct settings *s, struct flow_memo *m)
{
	__u32 held = m->class_id;

	if (!m->packets)
		return;
	settle(s, counters.lookup(&held), m, clock_ns());
	m->packets = 0;
	m->bytes = 0;
}

/* This CPU's memo slot for the flow, or NULL (no such CPU).  A slot another
 * flow held is taken over: that flow's tally settles first, and the class
 * is unknown until classify_memo finds it.  A flow that stopped keeps its
 * last tally (one epoch's bytes at most) here until then. */
static __always_inline struct flow_memo *memo_of(const struct settings *s, const struct flow_key *k, __u32 mark)
{
	__u32 slot = bpf_get_smp_processor_id() << MEMO_BITS | memo_slot(k, mark);
	struct flow_memo *m = memos.lookup(&slot);

	if (!m || same_flow(m, k, mark))
		return m;
	settle_slot(s, m);
	m->key = *k;
	m->mark = mark;
	m->gen = 0;
	return m;
}

/* classify, remembered in the flow's memo slot: the rules' hash probes and
 * compares were ~60 ns of the program's ~75 over a trivial program under
 * BPF_PROG_TEST_RUN (bench/README.md "Per packet"), and a flow's packets all
 * get the same answer.  The answer holds while settings.rules_gen is the
 * generation it was found in; the agent moves rules_gen on at the end of
 * every change of the rules (Datapath.set_rules), so from then on no packet
 * keeps a class the rules no longer give it.  gen is read before the rules
 * (the barrier, and x86's loads in order: agent/abi.py MEMO_CLASS is 0
 * elsewhere, and every packet is classified), so an answer found from
 * entries a change was replacing is filed under the generation before the
 * change's end.  A flow the rules move to another class settles its tally
 * as the old class's first.  Plain writes: tc runs with bottom halves off,
 * so no other run of the program interleaves with this one on its CPU. */
static __always_inline __s64 classify_memo(const struct settings *s, struct flow_memo *m, const struct flow_key *k,
					   __u32 mark)
{
	__u32 gen = s->rules_gen;
	__s64 class_id;

	asm volatile("" ::: "memory");
	if (MEMO_CLASS && m && gen && m->gen == gen)
		return m->class_id;
	class_id = classify(s, k, mark);
	if (m) {
		if (class_id != m->class_id)
			settle_slot(s, m);
		m->class_id = class_id;
		m->gen = gen;
	}
	return class_id;
}

/* The agent's own traffic as egress packets look: UDP from its gossip port, TCP to
 * the registry's port (settings.gossip_port must be set: 0 exempts nothing). */
static __always_inline int agent_ports(const struct settings *s, const struct flow_key *k)
{
	return (k->proto == IPPROTO_UDP && k->sport == s->gossip_port) ||
	       (k->proto == IPPROTO_TCP && s->registry_port && k->dport == s->registry_port);
}

/* The agent's own gossip is never policed, whatever the class rules say:
 * UDP from its listen port (gossip_port) sent by its own socket, which the
 * agent marks with gossip_mark (SO_MARK, agent/gossip/transport.py; the kernel
 * copies sk_mark to skb->mark for every datagram it builds).  Both must
 * hold: any socket may use the port (another address, or as destination),
 * and only CAP_NET_ADMIN can set a mark.  Everything else on the port is
 * traffic like any other (issue 19: the port alone was a bypass).  With a
 * registry, its TCP connections to etcd's port carry the same mark
 * (agent/cluster/etcd.py): a lease renewal dropped by a class that matches every
 * packet would make the agent leave its own cluster. */
static __always_inline int exempt(const struct settings *s, const struct flow_key *k, __u32 mark)
{
	if (!s->gossip_port || mark != s->gossip_mark)
		return 0;
	return agent_ports(s, k);
}

/* The bytes the limit counts: the L2 frame as the kernel's qdiscs (tbf)
 * count it, qdisc_skb_cb(skb)->pkt_len = skb->len + (gso_segs - 1) * header
 * length.  So a GSO skb is charged for every frame it becomes on the wire,
 * Ethernet header included, FCS and preamble not (bench/README.md). */
static __always_inline __u64 wire_bytes(struct __sk_buff *skb)
{
	return skb->wire_len;
}

/* The agent went silent: for timeout_ns neither this config was written
 * nor the agent's heartbeat, which every tick stamps (agent/service/daemon.py tick),
 * so a class whose decision did not change needs no write to stay fresh.
 * Both stamps are the agent's CLOCK_MONOTONIC, like bpf_ktime_get_ns. */
static __always_inline int stale(const struct class_config *c, __u64 now)
{
	__u32 zero = 0;
	__u64 *beat;

	if (!c->timeout_ns || now <= c->updated_ns + c->timeout_ns)
		return 0;  /* fresh by its own stamp (FPS writes every tick): the heartbeat's line stays unread */
	beat = heartbeat.lookup(&zero);
	return !beat || now > *beat + c->timeout_ns;
}

/* What applies to a class right now: its config, or the fail-safe when
 * the agent went silent, with the slow-start floor under a bucket's rate.
 * A rate is a price in time per byte (limiter.h class_config). */
struct policy {
	__u64 ns_per_byte;
	__u64 depth_ns;
	__u32 mode;
};

static __always_inline struct policy policy_of(const struct class_config *c, __u64 now)
{
	struct policy p = { .ns_per_byte = c->ns_per_byte, .depth_ns = c->depth_ns, .mode = c->mode };

	/* Fail-safe: the agent's decision is stale; enforce the safe rate by
	 * ourselves (the lease of [RLDesign], "safe" policy). */
	if (stale(c, now)) {
		p.mode = c->safe_rate_Bps == UNLIMITED ? MODE_PASS : MODE_BUCKET;
		p.ns_per_byte = c->safe_ns_per_byte;
		p.depth_ns = c->safe_depth_ns;
	}
	/* FPS slow start: a bucket slower than the floor (rate 0 included)
	 * still lets that many bytes per second through, so a new flow's SYN and
	 * first packets get out ([Raghavan07] end of §3.2.2), and
	 * so does a starved flow's retransmission: at a few bytes per second
	 * every retransmission would be dropped and TCP would back off for good.
	 * Slower is a higher price per byte; price 0 is rate 0, the slowest. */
	if (p.mode == MODE_BUCKET && c->floor_ns_per_byte &&
	    (!p.ns_per_byte || p.ns_per_byte > c->floor_ns_per_byte)) {
		p.ns_per_byte = c->floor_ns_per_byte;
		p.depth_ns = c->floor_depth_ns;
	}
	return p;
}

/* A packet's price in ns, rounded up like the price per byte (agent/kernel/bucket.py),
 * so the bucket never passes more than the rate: a truncated nanosecond per
 * packet would be 0.1 % too much at a million packets a second, whatever the
 * rate.  Rounding up costs at most as much the other way.  len < 2^20 (a
 * 512 KB BIG TCP skb included) and ns_per_byte <= 2^43 (agent/abi.py
 * MAX_NS_PER_BYTE): the product fits in 64 bits.  A client bucket's len is in
 * its measure's unit, under the price abi.MAX_NS_PER_UNIT allows for it. */
static __always_inline __u64 cost_ns(__u64 len, __u64 ns_per_byte)
{
	return (len * ns_per_byte + (1ULL << NS_FRAC_BITS) - 1) >> NS_FRAC_BITS;
}

/* ns of credit (or debt) priced at `from` as ns at `to`: the same bytes, at
 * most cap_ns.  Every product stays under 2^57: ns is capped at MAX_DEPTH_NS
 * (2^40), and bytes * to is only formed when it is below cap_ns << 16. */
static __always_inline __u64 convert_ns(__u64 ns, __u64 from, __u64 to, __u64 cap_ns)
{
	__u64 bytes;

	if (ns > MAX_DEPTH_NS)
		ns = MAX_DEPTH_NS;
	bytes = (ns << NS_FRAC_BITS) / from;
	if (bytes >= (cap_ns << NS_FRAC_BITS) / to)
		return cap_ns;
	return cost_ns(bytes, to);
}

/* The price changed since tat was last charged: the agent wrote a new rate
 * (FPS does every tick), or the fail-safe or the floor took over.  now - tat
 * is credit as time at the old price, and the same time at the new price is
 * other bytes: a class in debt for a 64 KB skb at the 15 KB/s floor (4 s)
 * would stay shut for 4 s after FPS gave it 10 MB/s, and a full bucket
 * would pass a whole new depth after a raise.  So credit and debt are kept
 * as bytes, credit capped at the new depth: the new rate holds from the next
 * packet, with no burst the old bucket did not hold.  One CPU converts, the
 * one whose cmpxchg on ns_per_byte wins; a packet the other charges at the
 * new price against the old tat meanwhile is off by its own cost at most.  A
 * CPU that moves tat between our read and our cmpxchg makes us read again
 * (4 tries: the verifier wants a bound; all 4 lost leave the credit as time). */
static __always_inline void rescale(struct gcra *b, const struct policy *p, __u64 was, __u64 now)
{
	if (__sync_val_compare_and_swap(&b->ns_per_byte, was, p->ns_per_byte) != was || !was)
		return;  /* another CPU converts; or a fresh bucket (0: tat is plain time) */
	for (int i = 0; i < 4; i++) {
		__u64 tat = b->tat, moved;

		if ((__s64)(now - tat) >= 0)
			moved = now - convert_ns(now - tat, was, p->ns_per_byte, p->depth_ns);
		else
			moved = now + convert_ns(tat - now, was, p->ns_per_byte, MAX_DEPTH_NS);
		if (__sync_val_compare_and_swap(&b->tat, tat, moved) == tat)
			return;
	}
}

/* The token bucket as virtual time (GCRA, the ATM cell-rate algorithm; the
 * same idea as sch_fq's and cilium's EDT horizons): tat is the moment the
 * bucket runs out, so credit = now - tat ns at the class's price, at most
 * depth_ns (a bucket idle for longer is full, not fuller).  No refill step,
 * no division: the agent priced the rate (agent/kernel/bucket.py).
 *
 * A GSO skb passes or drops whole (it is one skb until the driver splits
 * it), so a packet passes while any credit is left (tat < now) and may take
 * the bucket into debt: a 64 KiB GSO skb is never starved by a bucket that
 * small packets keep from filling up (bench/README.md, "bucket depth").
 *
 * Lock-free: a passed packet adds its cost to tat with one atomic add; a
 * refused one writes nothing (the price of shadow mode and of drops is one
 * load).  Two CPUs that both see credit both pass: at most one packet of
 * debt per CPU, paid before anything else passes, and the long-run rate is
 * exact because every passed packet added its whole cost.  Only a full
 * bucket needs tat set, not moved, to now - depth + cost: one cmpxchg; if
 * another CPU moved tat meanwhile it clamped or charged first, and our add
 * lands on top of its value.  tat never goes back, except in rescale.
 *
 * With the coarse clock (clock_ns) now lags by up to two jiffies; every
 * clock reading is at most the true time, so over any interval the bucket
 * passes at most rate x time + depth + one packet per CPU
 * (tests/unit/test_bucket_model.py), and a refusal is checked on the fine
 * clock (below).  A class's bucket and a throttled client's (throttle) alike. */
static __always_inline int take_tokens(struct gcra *b, const struct policy *p, __u64 len, __u64 now)
{
	__u64 was = b->ns_per_byte, tat, full;

	if (!p->ns_per_byte)
		return 0;  /* rate 0 */
	if (was != p->ns_per_byte)
		rescale(b, p, was, now);
	tat = b->tat;
	if ((__s64)(now - tat) <= 0) {
		/* No credit as of the coarse clock (clock_ns), up to two jiffies
		 * old: refusing on it would refill the bucket in 4 ms steps and drop
		 * whatever comes in a step once it is empty, bursts of loss that left
		 * TCP in retransmission timeouts (test_datapath.py's IPv6 test, 3 of 5
		 * runs).  So a refusal is decided on the fine clock, as before: only
		 * packets at the edge of the bucket pay for it. */
		if (!CLOCK_COARSE)
			return 0;
		now = bpf_ktime_get_ns();
		if ((__s64)(now - tat) <= 0)
			return 0;  /* no credit */
	}
	full = now - p->depth_ns;
	if ((__s64)(tat - full) < 0 &&
	    __sync_val_compare_and_swap(&b->tat, tat, full + cost_ns(len, p->ns_per_byte)) == tat)
		return 1;
	__sync_fetch_and_add(&b->tat, cost_ns(len, p->ns_per_byte));
	return 1;
}

/* Take len bytes from the class's allowance (volume quota); 1 = allowed.
 * A new quota_seq from the agent reloads the allowance with quota_bytes.
 * Under the bucket's lock: a test and a subtraction that two CPUs must not
 * interleave (a quota class pays the lock, the others never take it). */
static __always_inline int take_quota(struct bucket *b, const struct class_config *c, __u64 len)
{
	int ok = 1;

	bpf_spin_lock(&b->lock);
	if (b->quota_seq != c->quota_seq) {
		b->quota_seq = c->quota_seq;
		b->quota_left = c->quota_bytes;
	}
	if (b->quota_left < len)
		ok = 0;
	else
		b->quota_left -= len;
	bpf_spin_unlock(&b->lock);
	return ok;
}

/* police's verdicts, __u64 like the registers (an int verdict is zero-extended
 * before every compare: 11 more instructions).  WOULD_DROP: refused, but the
 * class is in shadow mode. */
#define VERDICT_DROP 0
#define VERDICT_PASS 1
#define VERDICT_WOULD_DROP 2

/* A packet the policy refuses: dropped, or for a shadow class (an operator
 * trying a limit out, config.shadow) counted as dropped and passed anyway.
 * It is counted as enforcement would count it (dropped, not passed; its flow
 * gets no bytes), so the agent's signals (demand = passed + dropped, sent =
 * passed, FPS's flow shares) are those enforcement would give for the same
 * arrivals, and it took no tokens, as a drop takes none (take_tokens): the
 * bucket refuses exactly what enforcement would drop.  The flag sits in the
 * config already loaded and is read on this path only: a passed packet pays
 * nothing for it. */
static __always_inline __u64 refuse(const struct class_config *c)
{
	return c->shadow ? VERDICT_WOULD_DROP : VERDICT_DROP;
}

/* VERDICT_*: what becomes of the packet. */
static __always_inline __u64 police(__u32 class_id, __u64 len, __u64 now)
{
	struct class_config *c = config.lookup(&class_id);
	struct bucket *b = buckets.lookup(&class_id);
	struct policy p;

	if (!c || !b)
		return VERDICT_PASS;
	p = policy_of(c, now);
	/* GRD: drop with the probability the allocator computed
	 * ([Raghavan07] Fig. 1, lines 4-6). */
	if (p.mode == MODE_DROP && (__u64)bpf_get_prandom_u32() < c->drop_prob)
		return refuse(c);
	if (p.mode == MODE_BUCKET && !take_tokens(&b->gcra, &p, len, now))
		return refuse(c);
	if (c->quota_seq && !take_quota(b, c, len))
		return refuse(c);
	return VERDICT_PASS;
}

/* Shape mode (config.shape_prio, agent/kernel/shaper.py): the class is queued, not policed.  Its
 * packets pass with skb->priority = its HTB class d1d1:<id+1>; HTB takes a priority that
 * names one of its leaf classes before any filter (sch_htb.c htb_classify), and this clsact
 * egress hook runs in __dev_queue_xmit before the root qdisc's enqueue, so HTB sees it.
 * A stale config (the agent silent past timeout_ns) is policed again at the fail-safe
 * rate (policy_of): the HTB class would hold the dead agent's last rate for good.
 * 1 = shaped. */
static __always_inline int shape(struct __sk_buff *skb, __u32 class_id, __u64 now)
{
	struct class_config *c = config.lookup(&class_id);

	if (!c || !c->shape_prio || stale(c, now))
		return 0;
	skb->priority = c->shape_prio;
	return 1;
}

/* Clients (docs/clients.md, "The kernel part"): a class with a client rule
 * counts, throttles and bans each client, its remote (client_side dst) or
 * local (src) address cut to a prefix, by itself; the agent decides who is
 * throttled or banned and merges what its peers count.  A class without a
 * rule pays one test of client_side in its config. */
#define CLIENT_PASSED 0
#define CLIENT_THROTTLED 1
#define CLIENT_BANNED 2

/* ck (zeroed by the caller: it is a hash key, padding included) for the
 * packet's client: its address on the rule's side, masked to the prefix. */
static __always_inline void client_of(struct client_key *ck, const struct class_config *c, const struct flow_key *k,
				      __u32 class_id)
{
	const __u32 *addr = c->client_side == CLIENT_SRC ? k->src : k->dst;

	ck->class_id = class_id;
	ck->family = k->family;
	if (k->family == 4) {
		ck->addr[0] = addr[0] & c->client_mask4;
		return;
	}
	for (int w = 0; w < 4; w++)
		ck->addr[w] = addr[w] & c->client_mask6[w];
}

/* The client's address lies in one of the class's exempt prefixes: it is
 * nobody's client, whatever prefix holds it (one LPM lookup, for classes
 * with exempt prefixes only). */
static __always_inline int exempt_client(const struct class_config *c, const struct flow_key *k, __u32 class_id)
{
	struct exempt_key ek = { .prefixlen = 64 + (k->family == 4 ? 32 : 128), .class_id = class_id,
				 .family = k->family };

	if (!(c->client_flags & CLIENT_HAS_EXEMPT))
		return 0;
	__builtin_memcpy(ek.addr, c->client_side == CLIENT_SRC ? k->src : k->dst, sizeof(ek.addr));
	return client_exempt.lookup(&ek) != NULL;
}

/* A ban ends by itself at until_ns (the agent's CLOCK_MONOTONIC, the clock of
 * bpf_ktime_get_ns): no agent needs to be alive to lift it.  now is the
 * coarse clock (clock_ns), up to two jiffies behind: a ban lasts at most
 * 8 ms longer, never less. */
static __always_inline int banned(struct client_key *ck, __u64 now)
{
	__u64 *until = client_bans.lookup(ck);

	return until && now < *until;
}

/* A TCP SYN, a connection opened (SYN) or accepted (SYN-ACK): what conns
 * counts.  Read here rather than in parse so only clients' classes pay for
 * it; without ports (a later fragment, a short packet) there is no header. */
static __always_inline __u64 tcp_syn(struct __sk_buff *skb, const struct flow_key *k)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct tcphdr *th = data + sizeof(struct ethhdr) + sizeof(struct ipv6hdr);

	if (k->proto != IPPROTO_TCP || !(k->sport | k->dport))
		return 0;
	if (k->family == 4) {
		if ((void *)(ip + 1) > end)
			return 0;
		th = (void *)ip + ip->ihl * 4;
	}
	if ((void *)(th + 1) > end)
		return 0;
	return th->syn;
}

/* A client's window as of window index (now / client_window_ns): the current
 * count becomes the previous one, or both start at 0 after a quiet window.
 * Not atomic: two CPUs crossing a window's end at once may lose the few
 * units one of them added meanwhile (a count, not a limit: the buckets
 * enforce). */
static __always_inline void roll(struct client_window *w, __u64 index)
{
	__u64 at = w->index;

	if (at == index)
		return;
	w->prev = at + 1 == index ? w->cur : 0;
	w->cur = 0;
	w->index = index;
}

/* The sliding estimate cur + prev x (the share of the previous window still
 * in the last W): agent/clients/table.py sliding_count, the weight in 2^-16 units
 * (into < W <= 2^47 ns: (W - into) << 16 fits; prev < 2^48 units). */
static __always_inline __u64 sliding(const struct client_window *w, __u64 window_ns, __u64 index, __u64 now)
{
	__u64 weight = ((window_ns - (now - index * window_ns)) << 16) / window_ns;

	return w->cur + ((w->prev * weight) >> 16);
}

/* Add units to the client's window w (NULL: no entry yet, made here; NOEXIST:
 * if another CPU made it first, add to that one), keep clear_gen (see
 * clients), and put the client in client_heavy the first time in a window its
 * count reaches the class's line: the agent looks at it from its next tick
 * until its count has faded to 0. */
static __always_inline void count_client(const struct class_config *c, struct client_window *w,
					 struct client_key *ck, __u64 units, __u32 clear_gen, __u64 now)
{
	__u64 index = now / c->client_window_ns;
	__u8 one = 1;

	if (!w) {
		struct client_window fresh = { .index = index, .cur = units, .clear_gen = clear_gen };

		if (client_windows.insert(ck, &fresh) == 0) {
			if (units >= c->client_line && c->client_line)
				client_heavy.update(ck, &one);
			return;
		}
		w = client_windows.lookup(ck);
		if (!w)
			return;
	}
	if (w->clear_gen != clear_gen)
		w->clear_gen = clear_gen;
	roll(w, index);
	if (units)
		__sync_fetch_and_add(&w->cur, units);
	if (w->flagged != index + 1 && c->client_line && sliding(w, c->client_window_ns, index, now) >= c->client_line) {
		w->flagged = index + 1;
		client_heavy.update(ck, &one);
	}
}

/* What the packet costs a client bucket, in the rule's measure: its bytes, its
 * segments, or 1 for a SYN and nothing for the rest of a connection's
 * packets (a throttled conns client's established connections carry on). */
static __always_inline __u64 units_of(const struct class_config *c, __u64 len, __u64 segs, __u64 syn)
{
	if (c->client_measure == MEASURE_BYTES)
		return len;
	return c->client_measure == MEASURE_PACKETS ? segs : syn;
}

/* A throttled client takes from its bucket (client_limits) at the price of
 * its share of the threshold, or, when the class's config is stale (the
 * agent went silent), of the safe share T/N: a dead agent's host never keeps
 * a larger share than its fair one.  The class's GCRA (take_tokens),
 * lock-free; 1 = passes. */
static __always_inline int throttle(const struct class_config *c, struct client_bucket *b, __u64 units, __u64 now)
{
	struct policy p = { .ns_per_byte = b->ns_per_unit, .depth_ns = b->depth_ns, .mode = MODE_BUCKET };

	if (!units)
		return 1;
	if (stale(c, now)) {
		p.ns_per_byte = b->safe_ns_per_unit;
		p.depth_ns = b->safe_depth_ns;
	}
	return take_tokens(&b->gcra, &p, units, now);
}

/* CLIENT_*: the client rule's verdict on an egress packet of a class with
 * one.  In the order of docs/clients.md: an exempt address is left alone; a
 * banned client is dropped and not counted (the ban already answers it);
 * every other packet is counted, throttled or not (the agent shares the
 * threshold by demand, so the counts are arrivals, not what passed); then a
 * throttled client pays its bucket.
 *
 * Bans and buckets are looked up only for a client not known to be clear of
 * both: its window keeps the settings.client_gen in which it was found so
 * (clear_gen; 0: not clear), and the agent moves client_gen on whenever it
 * bans a client or throttles a new one.  So a class with bans or throttled
 * clients costs its other clients one lookup of each per new ban or
 * throttle, not per packet (~40 ns each: bench/README.md, "Per-client
 * accounting"). */
static __always_inline __u64 clients(struct __sk_buff *skb, const struct settings *s, const struct class_config *c,
				     const struct flow_key *k, __u32 class_id, __u64 len, __u64 now)
{
	struct client_key ck = {};
	struct client_bucket *b = NULL;
	struct client_window *w;
	__u64 segs = skb->gso_segs ? skb->gso_segs : 1, units;
	__u32 gen = s->client_gen;    /* once: an entry is marked clear only in the generation it was checked in */

	if (exempt_client(c, k, class_id))
		return CLIENT_PASSED;
	client_of(&ck, c, k, class_id);
	w = client_windows.lookup(&ck);
	if (!w || w->clear_gen != gen) {
		if ((c->client_flags & CLIENT_HAS_BANS) && banned(&ck, now))
			return CLIENT_BANNED;
		if (c->client_flags & CLIENT_HAS_LIMITS)
			b = client_limits.lookup(&ck);
	}
	units = units_of(c, len, segs, c->client_measure == MEASURE_CONNS ? tcp_syn(skb, k) : 0);
	count_client(c, w, &ck, units, b ? 0 : gen, now);
	if (b && !throttle(c, b, units, now))
		return CLIENT_THROTTLED;
	return CLIENT_PASSED;
}

static __always_inline void count(struct counters *ctr, __u64 len, int passed)
{
	if (!ctr)
		return;
	if (passed) {
		ctr->passed_bytes += len;
		ctr->passed_packets++;
	} else {
		ctr->dropped_bytes += len;
		ctr->dropped_packets++;
	}
}

/* A packet the client rule refused (CLIENT_THROTTLED or CLIENT_BANNED):
 * counted as such, neither passed nor dropped.  The rule runs before the
 * class's own policing, so the class's counters, and with them its demand
 * (agent/estimator.py) and its flows, see only what its clients send within
 * their limits: a client's excess is not this host's demand for a larger
 * share of the class's limit, and it took none of the class's tokens.  A
 * class in shadow mode lets it pass all the same, as refuse() does. */
static __always_inline int refuse_client(struct counters *ctr, const struct class_config *c, __u64 why, __u64 len,
					 int drop)
{
	if (ctr && why == CLIENT_BANNED) {
		ctr->banned_bytes += len;
		ctr->banned_packets++;
	} else if (ctr) {
		ctr->throttled_bytes += len;
		ctr->throttled_packets++;
	}
	return c->shadow ? TC_ACT_OK : drop;
}

/* Not ours to police (non-IP, no class, exempt): count it and let it go. */
static __always_inline int bypass(__u64 len)
{
	__u32 zero = 0;

	count(bypass_counters.lookup(&zero), len, 1);
	return TC_ACT_OK;
}

/* The packet's share of its flow's tally (the flow table above): a passed
 * packet adds its bytes in the slot; the first packet of a new epoch settles
 * the tally the last one left. */
static __always_inline void tally_flow(const struct settings *s, struct flow_memo *m, __u64 len, int passed,
				       __u64 now)
{
	__u16 epoch = now >> FLOW_EPOCH_SHIFT;

	if (!m)
		return;
	if (m->epoch != epoch) {
		settle_slot(s, m);
		m->epoch = epoch;
	}
	if (passed) {
		m->bytes += len;
		m->packets++;
	}
}

/* bench/datapath.py builds the program without parts of the pipeline
 * (BENCH_SKIP, agent/abi.py; 0 in the agent) to attribute its cost. */
#define SKIP_FLOWS 1
#define SKIP_POLICE 2
#define SKIP_CLOCK 4    /* now = 0: only with SKIP_POLICE (a bucket at time 0 refuses all) */
#define SKIP_CLASSIFY 8 /* every packet in class 0 */

/* Attached at tc egress (clsact, direct-action) by agent/kernel/datapath.py:
 * parse -> classify -> clients -> police -> count -> tally. */
int drl_egress(struct __sk_buff *skb)
{
	struct flow_key key = {};
	__u32 zero = 0, class_id;
	__u64 len = wire_bytes(skb), now;
	struct settings *s = settings.lookup(&zero);
	struct class_config *c;
	struct counters *ctr;
	struct flow_memo *m;
	__s64 found;
	__u64 verdict, refused;

	if (!s)
		return TC_ACT_OK;
	if (parse(skb, &key) < 0 || exempt(s, &key, skb->mark))
		return bypass(len);
	m = memo_of(s, &key, skb->mark);
	found = (BENCH_SKIP & SKIP_CLASSIFY) ? 0 : classify_memo(s, m, &key, skb->mark);
	if (found == NO_CLASS)
		return bypass(len);
	class_id = found;
	now = (BENCH_SKIP & SKIP_CLOCK) ? 0 : clock_ns();
	ctr = counters.lookup(&class_id);
	c = config.lookup(&class_id);
	refused = c && c->client_side ? clients(skb, s, c, &key, class_id, len, now) : CLIENT_PASSED;
	if (refused)
		return refuse_client(ctr, c, refused, len, DROP_ACTION);
	if (BENCH_SKIP & SKIP_POLICE)
		verdict = VERDICT_PASS;
	else
		verdict = shape(skb, class_id, now) ? VERDICT_PASS : police(class_id, len, now);
	count(ctr, len, verdict == VERDICT_PASS);
	if (!(BENCH_SKIP & SKIP_FLOWS))
		tally_flow(s, m, len, verdict == VERDICT_PASS, now);
	return verdict == VERDICT_DROP ? DROP_ACTION : TC_ACT_OK;
}

/* An ingress packet as the egress packets of its flow look: from us to its
 * sender, so the class rules and the client's side mean the same. */
static __always_inline void reverse(struct flow_key *k)
{
	__u32 addr[4];
	__u16 port = k->sport;

	__builtin_memcpy(addr, k->src, sizeof(addr));
	__builtin_memcpy(k->src, k->dst, sizeof(addr));
	__builtin_memcpy(k->dst, addr, sizeof(addr));
	k->sport = k->dport;
	k->dport = port;
}

/* Attached at tc ingress (clsact, direct-action) by agent/kernel/datapath.py while
 * some class has a ban rule: a banned client's requests stop here instead of
 * costing the server, and its connections cannot even start.  parse ->
 * reverse -> classify -> banned?  Nothing else is done or counted here.
 * Classification has no mark yet (0): a class matched by mark alone is
 * banned at egress only.  The agent's own traffic passes by its ports alone
 * (no mark on the way in): a peer's gossip is never cut off by a ban, and
 * anyone may reach those two ports, which the agent authenticates. */
int drl_ingress(struct __sk_buff *skb)
{
	struct flow_key key = {};
	struct client_key ck = {};
	__u32 zero = 0, class_id;
	struct settings *s = settings.lookup(&zero);
	struct class_config *c;
	__s64 found;

	if (!s || parse(skb, &key) < 0)
		return TC_ACT_OK;
	reverse(&key);
	if (s->gossip_port && agent_ports(s, &key))
		return TC_ACT_OK;
	found = classify(s, &key, 0);
	if (found == NO_CLASS)
		return TC_ACT_OK;
	class_id = found;
	c = config.lookup(&class_id);
	if (!c || !(c->client_flags & CLIENT_HAS_BANS) || exempt_client(c, &key, class_id))
		return TC_ACT_OK;
	client_of(&ck, c, &key, class_id);
	if (!banned(&ck, clock_ns()))
		return TC_ACT_OK;
	/* skb->len, the frame: at ingress wire_len is the length without its
	 * Ethernet header (set before the program's view puts it back). */
	return refuse_client(counters.lookup(&class_id), c, CLIENT_BANNED, skb->len, TC_ACT_SHOT);
}
