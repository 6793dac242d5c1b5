/* Police: a class's verdict on a packet: its token bucket (GCRA, virtual
 * time) or random drop, its quota, the fail-safe when the agent went silent,
 * and shape mode, which hands the packet to HTB instead. */
#pragma once

#include "consts.h"
#include "limiter.h"
#include "maps.h"

BPF_ARRAY(heartbeat, __u64, 1);                          /* agent writes every tick; stale reads (8 bytes: one line anyway) */
BPF_F_TABLE("array", int, struct bucket, buckets, MAX_CLASSES, BPF_F_MMAPABLE); /* police writes; agent reads quota; MMAPABLE: maps.h */

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
 * small packets keep from filling up (bench/HISTORY.md, "bucket depth").
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
 * While shaped, the class's own bucket is kept empty (tat = now): when the config goes
 * stale, the fail-safe policer starts from nothing beside what the HTB leaf still holds,
 * not from a full bucket on top of that backlog (a killed shaped host sent 470-500 kB
 * beyond G x T with the two together: bench/RESULTS.md "Envelope, measured").  tat is
 * written once in SHAPE_EMPTY_NS at most, so shaped packets rarely write its line.
 * 1 = shaped. */
static __always_inline int shape(struct __sk_buff *skb, __u32 class_id, __u64 now)
{
	struct class_config *c = config.lookup(&class_id);
	struct bucket *b;

	if (!c || !c->shape_prio || stale(c, now))
		return 0;
	b = buckets.lookup(&class_id);
	if (b && (__s64)(now - b->gcra.tat) > SHAPE_EMPTY_NS)
		b->gcra.tat = now;
	skb->priority = c->shape_prio;
	return 1;
}
