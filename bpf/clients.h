/* Clients: a class's per-client rule: each client's sliding count, its
 * bucket when throttled, its ban. */
#pragma once

#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/tcp.h>
#include "consts.h"
#include "limiter.h"
#include "maps.h"
#include "police.h"

/* Per client (docs/clients.md; clients below): each client's sliding
 * window, and the clients whose count reached their class's line (heavy), so
 * that the agent reads those and the few it follows, never all of them.  LRU:
 * a flood of new clients (spoofed sources) evicts idle entries, not the
 * clients that keep sending; an LRU map is always preallocated (its memory:
 * bench/HISTORY.md, "Per-client accounting").  Bans are a plain hash: an
 * eviction would unban.  The others take memory only for what they hold. */
BPF_TABLE("lru_hash", struct client_key, struct client_window, client_windows, MAX_CLIENTS); /* count_client writes; agent reads followed clients */
BPF_F_TABLE("hash", struct client_key, __u8, client_heavy, MAX_CLIENT_HEAVY,
	    BPF_F_NO_PREALLOC);                                 /* count_client adds; the agent drains */
BPF_F_TABLE("hash", struct client_key, struct client_bucket, client_limits, MAX_CLIENT_LIMITS,
	    BPF_F_NO_PREALLOC);                                 /* agent writes prices; throttle charges */
BPF_F_TABLE("hash", struct client_key, __u64, client_bans, MAX_CLIENT_BANS,
	    BPF_F_NO_PREALLOC);                                 /* agent writes until_ns; banned reads */
BPF_F_TABLE("lpm_trie", struct exempt_key, __u8, client_exempt, MAX_CLIENT_EXEMPT,
	    BPF_F_NO_PREALLOC);                                 /* agent writes; exempt_client reads */

/* Clients (docs/clients.md, "The kernel part"): a class with a client rule
 * counts, throttles and bans each client, its remote (client_side dst) or
 * local (src) address cut to a prefix, by itself; the agent decides who is
 * throttled or banned and merges what its peers count.  A class without a
 * rule pays one test of client_side in its config. */

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

/* A client whose count just reached its class's line is held at the class's
 * hold price, T/N, from its next packet on, until the agent's next tick
 * writes its share or lets it go (docs/clients.md "Held at the line"): the
 * agent reacts a tick or two later, and a client spread over N hosts passes
 * its threshold in well under a tick at the class's rate.  The bucket starts
 * in debt for what the packet that reached the line took beyond it (over,
 * at most the packet's units: a 64 KB GSO skb is more than a 0.5 Mbit line;
 * at most the bucket's depth), so that a host passes at most its line before
 * the hold and T/N after; an entry the agent wrote is left as it is
 * (NOEXIST).  0 = this packet made the hold. */
static __always_inline int hold_client(const struct class_config *c, struct client_key *ck, __u64 over, __u64 now)
{
	__u64 debt = cost_ns(over, c->client_hold_ns_per_unit);
	struct client_bucket held = { .gcra = { .tat = now + (debt < c->client_hold_depth_ns ? debt : c->client_hold_depth_ns),
						.ns_per_byte = c->client_hold_ns_per_unit },
				      .ns_per_unit = c->client_hold_ns_per_unit, .depth_ns = c->client_hold_depth_ns,
				      .safe_ns_per_unit = c->client_hold_ns_per_unit,
				      .safe_depth_ns = c->client_hold_depth_ns };

	return client_limits.insert(ck, &held);
}

/* The client's count reached the class's line with a packet of units (count:
 * the count with it): held (hold_client) when the class holds, then into
 * client_heavy for the agent, in that order: a hold the agent can see is
 * there already, so the agent's drop_holds finds it.  A hold that cannot be
 * flagged (client_heavy full) goes again: nobody would ever let it go.  1 =
 * the client has a bucket: its window must not say it is clear of them. */
static __always_inline int reach_line(const struct class_config *c, struct client_key *ck, __u64 count,
				      __u64 units, __u64 now)
{
	__u64 over = count - c->client_line;
	int made = c->client_hold_ns_per_unit && hold_client(c, ck, over < units ? over : units, now) == 0;
	__u8 one = 1;

	if (client_heavy.update(ck, &one) && made) {
		client_limits.delete(ck);
		return 0;
	}
	return c->client_hold_ns_per_unit != 0;
}

/* A client's first packet: its window made here (NULL: done) or, if another
 * CPU made it meanwhile, that one to count on.  Its mark (clear_gen) is that
 * CPU's, but for a hold made here. */
static __always_inline struct client_window *first_count(const struct class_config *c, struct client_key *ck,
							 __u64 units, __u64 clear_gen, __u64 index, __u64 now)
{
	int heavy = c->client_line && units >= c->client_line;
	struct client_window fresh = { .index = index, .cur = units, .clear_gen = clear_gen,
				       .flagged = heavy ? index + 1 : 0 };
	struct client_window *w;

	if (heavy && reach_line(c, ck, units, units, now))
		fresh.clear_gen = 0;
	if (client_windows.insert(ck, &fresh) == 0)
		return NULL;
	w = client_windows.lookup(ck);
	if (w && !fresh.clear_gen)
		w->clear_gen = 0;
	return w;
}

/* Add units to the client's window w (NULL: none yet, first_count), mark it
 * clear_gen (see clients) unless another CPU changed the mark since this
 * packet read it (seen): a hold that CPU made must not be marked clear, so
 * the mark moves by compare-and-swap.  The first time in a window its count
 * reaches the class's line, reach_line: the agent looks at it from its next
 * tick until its count has faded to 0. */
static __always_inline void count_client(const struct class_config *c, struct client_window *w,
					 struct client_key *ck, __u64 units, __u64 seen, __u64 clear_gen, __u64 now)
{
	__u64 index = now / c->client_window_ns;

	if (!w) {
		w = first_count(c, ck, units, clear_gen, index, now);
		if (!w)
			return;
	} else if (seen != clear_gen) {
		__sync_val_compare_and_swap(&w->clear_gen, seen, clear_gen);
	}
	roll(w, index);
	if (units)
		__sync_fetch_and_add(&w->cur, units);
	if (w->flagged != index + 1 && c->client_line) {
		__u64 count = sliding(w, c->client_window_ns, index, now);

		if (count < c->client_line)
			return;
		w->flagged = index + 1;
		if (reach_line(c, ck, count, units, now))
			w->clear_gen = 0;
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
 * throttle, not per packet (~40 ns each: bench/HISTORY.md, "Per-client
 * accounting"). */
static __always_inline __u64 clients(struct __sk_buff *skb, const struct settings *s, const struct class_config *c,
				     const struct flow_key *k, __u32 class_id, __u64 len, __u64 now)
{
	struct client_key ck = {};
	struct client_bucket *b = NULL;
	struct client_window *w;
	__u64 segs = skb->gso_segs ? skb->gso_segs : 1, units;
	__u32 gen = s->client_gen;    /* once: an entry is marked clear only in the generation it was checked in */
	__u64 seen = 0;

	if (exempt_client(c, k, class_id))
		return CLIENT_PASSED;
	client_of(&ck, c, k, class_id);
	w = client_windows.lookup(&ck);
	if (w)
		seen = w->clear_gen;
	if (!w || seen != gen) {
		if ((c->client_flags & CLIENT_HAS_BANS) && banned(&ck, now))
			return CLIENT_BANNED;
		if (c->client_flags & CLIENT_HAS_LIMITS)
			b = client_limits.lookup(&ck);
	}
	units = units_of(c, len, segs, c->client_measure == MEASURE_CONNS ? tcp_syn(skb, k) : 0);
	count_client(c, w, &ck, units, seen, b ? 0 : gen, now);
	if (b && !throttle(c, b, units, now))
		return CLIENT_THROTTLED;
	return CLIENT_PASSED;
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
