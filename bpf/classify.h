/* Classify: a packet's class from its flow key and mark, in a few hash
 * lookups whatever the number of classes; and the agent's own traffic, which
 * no class polices. */
#pragma once

#include <uapi/linux/in.h>
#include "consts.h"
#include "limiter.h"

/* Classification (agent/kernel/classify.py lays them out; the agent writes, classify
 * reads).  Every prefix of a direction sits in one hash, keyed by its length
 * and masked address, and settings lists the lengths in use: a packet costs
 * one hash lookup per length in use, whatever the number of classes.  An LPM
 * trie walks one node per level: 4,096 /24s cost +35 % per packet there
 * (bench/HISTORY.md, "classification"). */
BPF_F_TABLE("hash", struct net_key, struct rule_list, dst_nets, MAX_KEYS, BPF_F_NO_PREALLOC); /* agent writes; longest_prefix reads */
BPF_F_TABLE("hash", struct net_key, struct rule_list, src_nets, MAX_KEYS, BPF_F_NO_PREALLOC); /* agent writes; longest_prefix reads */
BPF_F_TABLE("hash", struct mark_key, struct rule_list, marks, MAX_KEYS, BPF_F_NO_PREALLOC);       /* agent writes; by_mark reads */

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
 * traffic like any other (the port alone was a bypass).  With a
 * registry, its TCP connections to etcd's port carry the same mark
 * (agent/cluster/etcd.py): a lease renewal dropped by a class that matches every
 * packet would make the agent leave its own cluster. */
static __always_inline int exempt(const struct settings *s, const struct flow_key *k, __u32 mark)
{
	if (!s->gossip_port || mark != s->gossip_mark)
		return 0;
	return agent_ports(s, k);
}
