/* drl's datapath: a tc egress classifier (clsact, direct-action) for IPv4/IPv6.
 *
 * Every packet goes classify -> police -> count -> sample, from map state
 * alone: the kernel never waits for Python (design.md).  agent/datapath.py
 * compiles this file with bcc, attaches it at egress, writes `settings`,
 * the classification maps (agent/classify.py lays them out) and `config`, and reads `counters`, `bypass_counters` and `flows`.
 * Layouts of every map value are in limiter.h.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/udp.h>
#include "limiter.h"

#define NS_PER_S 1000000000ULL

BPF_ARRAY(settings, struct settings, 1);                 /* agent writes; classify, sample read */
/* Classification (agent/classify.py lays them out; the agent writes, classify
 * reads).  Every prefix of a direction sits in one hash, keyed by its length
 * and masked address, and settings lists the lengths in use: a packet costs
 * one hash lookup per length in use, whatever the number of classes.  An LPM
 * trie walks one node per level: 4,096 /24s cost +35 % per packet there
 * (bench/README.md, "classification"). */
BPF_F_TABLE("hash", struct net_key, struct rule_list, dst_nets, MAX_KEYS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct net_key, struct rule_list, src_nets, MAX_KEYS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct mark_key, struct rule_list, marks, MAX_KEYS, BPF_F_NO_PREALLOC);
BPF_ARRAY(config, struct class_config, MAX_CLASSES);     /* agent writes; police reads */
BPF_ARRAY(buckets, struct bucket, MAX_CLASSES);          /* police writes (locked); agent reads quota */
BPF_PERCPU_ARRAY(counters, struct counters, MAX_CLASSES); /* count writes; agent sums CPUs */
BPF_PERCPU_ARRAY(bypass_counters, struct counters, 1);   /* bypass writes; agent sums CPUs */
BPF_TABLE("lru_hash", struct flow_key, struct flow_stats, flows, MAX_FLOWS); /* sample writes; agent reads */

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
 * destination prefix, then the longest source prefix (agent/classify.py).
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

/* The agent's own gossip is never policed, whatever the class rules say:
 * UDP from its listen port (gossip_port) sent by its own socket, which the
 * agent marks with gossip_mark (SO_MARK, agent/transport.py; the kernel
 * copies sk_mark to skb->mark for every datagram it builds).  Both must
 * hold: any socket may use the port (another address, or as destination),
 * and only CAP_NET_ADMIN can set a mark.  Everything else on the port is
 * traffic like any other (issue 19: the port alone was a bypass). */
static __always_inline int exempt(const struct settings *s, const struct flow_key *k, __u32 mark)
{
	return s->gossip_port && k->proto == IPPROTO_UDP && k->sport == s->gossip_port &&
	       mark == s->gossip_mark;
}

/* The bytes the limit counts: the L2 frame as the kernel's qdiscs (tbf)
 * count it, qdisc_skb_cb(skb)->pkt_len = skb->len + (gso_segs - 1) * header
 * length.  So a GSO skb is charged for every frame it becomes on the wire,
 * Ethernet header included, FCS and preamble not (bench/README.md). */
static __always_inline __u64 wire_bytes(struct __sk_buff *skb)
{
	return skb->wire_len;
}

/* Refill from the clock and take cost for len bytes; 1 = conforming.
 * Tokens are kept as time credit like sch_tbf (credit_ns, capped at the time
 * the bucket takes to fill), so refill needs no multiply that could overflow
 * and a packet's cost is exact to the nanosecond.  A GSO skb passes or drops
 * whole (it is one skb until the driver splits it), so a packet passes while
 * any credit is left and may take the bucket into debt: a 64 KiB GSO skb is
 * never starved by a bucket that small packets keep from filling up, and the
 * long-run rate stays exact (bench/README.md, "bucket depth"). */
static __always_inline int take_tokens(struct bucket *b, __u64 rate, __u64 burst, __u64 len, __u64 now)
{
	__s64 full_ns;

	if (rate == 0)
		return 0;
	full_ns = burst * NS_PER_S / rate;
	if (now > b->last_ns) {  /* another CPU may have refilled at a later now */
		b->credit_ns += now - b->last_ns;
		b->last_ns = now;
	}
	if (b->credit_ns > full_ns)
		b->credit_ns = full_ns;
	if (b->credit_ns <= 0)
		return 0;
	b->credit_ns -= len * NS_PER_S / rate;
	return 1;
}

/* Take len bytes from the class's allowance (volume quota); 1 = allowed.
 * quota_seq 0 means no quota; a new quota_seq from the agent reloads the
 * allowance with quota_bytes.  Caller holds b->lock. */
static __always_inline int take_quota(struct bucket *b, const struct class_config *c, __u64 len)
{
	if (!c->quota_seq)
		return 1;
	if (b->quota_seq != c->quota_seq) {
		b->quota_seq = c->quota_seq;
		b->quota_left = c->quota_bytes;
	}
	if (b->quota_left < len)
		return 0;
	b->quota_left -= len;
	return 1;
}

/* What applies to a class right now: its config, or the fail-safe when
 * the agent went silent, with the slow-start floor under a bucket's rate. */
struct policy {
	__u64 rate;
	__u64 burst;
	__u32 mode;
};

static __always_inline struct policy policy_of(const struct class_config *c, __u64 now)
{
	struct policy p = { .rate = c->rate_Bps, .burst = c->burst_bytes, .mode = c->mode };

	/* Fail-safe: the agent stopped refreshing the config, so its decision is
	 * stale; enforce the safe rate by ourselves (the lease of
	 * [RLDesign], "safe" policy). */
	if (c->timeout_ns && now > c->updated_ns + c->timeout_ns) {
		p.mode = c->safe_rate_Bps == UNLIMITED ? MODE_PASS : MODE_BUCKET;
		p.rate = c->safe_rate_Bps;
		p.burst = c->safe_burst_bytes;
	}
	/* FPS slow start: a bucket slower than floor_rate_Bps (0 included)
	 * still lets that many bytes per second through, so a new flow's SYN and
	 * first packets get out ([Raghavan07] end of §3.2.2), and
	 * so does a starved flow's retransmission: at a few bytes per second
	 * every retransmission would be dropped and TCP would back off for good. */
	if (p.mode == MODE_BUCKET && p.rate < c->floor_rate_Bps) {
		p.rate = c->floor_rate_Bps;
		p.burst = c->floor_rate_Bps;
	}
	return p;
}

/* Take len bytes from the class's bucket and quota under its lock; 1 = pass. */
static __always_inline int take(struct bucket *b, const struct class_config *c, const struct policy *p,
				__u64 len, __u64 now)
{
	int ok = 1;

	bpf_spin_lock(&b->lock);
	if (p->mode == MODE_BUCKET)
		ok = take_tokens(b, p->rate, p->burst, len, now);
	if (ok)
		ok = take_quota(b, c, len);
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
	if (p.mode != MODE_BUCKET && !c->quota_seq)
		return VERDICT_PASS;  /* nothing to take: skip the lock */
	return take(b, c, &p, len, now) ? VERDICT_PASS : refuse(c);
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

/* Not ours to police (non-IP, no class, exempt): count it and let it go. */
static __always_inline int bypass(__u64 len)
{
	__u32 zero = 0;

	count(bypass_counters.lookup(&zero), len, 1);
	return TC_ACT_OK;
}

/* FPS-HANDLE-PACKET line 1 ([Raghavan07] Fig. 2): a new flow
 * joins the sample set with probability sample_prob; a tracked flow is
 * updated on every packet (bytes that passed). */
static __always_inline void sample_flow(const struct settings *s, struct flow_key *k, __u32 class_id,
					__u64 len, int passed, __u64 now)
{
	struct flow_stats *f = flows.lookup(k);

	if (f) {
		if (passed) {
			__sync_fetch_and_add(&f->bytes, len);
			__sync_fetch_and_add(&f->packets, 1);
		}
		f->last_ns = now;
		return;
	}
	if ((__u64)bpf_get_prandom_u32() >= s->sample_prob)
		return;
	struct flow_stats fresh = {
		.bytes = passed ? len : 0, .packets = passed ? 1 : 0,
		.first_ns = now, .last_ns = now, .class_id = class_id,
	};
	flows.insert(k, &fresh);  /* NOEXIST: a racing CPU's entry wins */
}

/* Attached at tc egress (clsact, direct-action) by agent/datapath.py:
 * parse -> classify -> police -> count -> sample. */
int drl_egress(struct __sk_buff *skb)
{
	struct flow_key key = {};
	__u32 zero = 0, class_id;
	__u64 len = wire_bytes(skb), now;
	struct settings *s = settings.lookup(&zero);
	__s64 found;
	__u64 verdict;

	if (!s)
		return TC_ACT_OK;
	if (parse(skb, &key) < 0 || exempt(s, &key, skb->mark))
		return bypass(len);
	found = classify(s, &key, skb->mark);
	if (found == NO_CLASS)
		return bypass(len);
	class_id = found;
	now = bpf_ktime_get_ns();
	verdict = police(class_id, len, now);
	count(counters.lookup(&class_id), len, verdict == VERDICT_PASS);
	sample_flow(s, &key, class_id, len, verdict == VERDICT_PASS, now);
	return verdict == VERDICT_DROP ? DROP_ACTION : TC_ACT_OK;
}
