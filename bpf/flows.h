/* A flow's memo slot (its class, remembered) and the flow table its passed
 * bytes are tallied into (FPS's sample set). */
#pragma once

#include "classify.h"
#include "clock.h"
#include "consts.h"
#include "limiter.h"
#include "maps.h"

BPF_F_TABLE("array", int, struct flow_memo, memos, MAX_CPUS << MEMO_BITS, BPF_F_MMAPABLE); /* memo_of's own; MMAPABLE: maps.h */

BPF_TABLE("lru_hash", struct flow_key, struct flow_stats, flows, MAX_FLOWS); /* visit writes; agent reads it whole */
/* visit writes (an update, ~150 ns: preallocated, ~210 without); the agent drains */
BPF_TABLE("hash", struct flow_key, struct flow_stats, flows_visited, MAX_FLOWS);

/* The flow table (FPS's sample set, [Raghavan07] Fig. 2 FPS-HANDLE-PACKET
 * line 1).  A packet does not visit it: each CPU tallies a flow's passed
 * bytes in the flow's memo slot, a line the packet reads anyway, and the
 * tally visits the table once per epoch of 2^FLOW_EPOCH_SHIFT ns (16.8 ms) the
 * flow sends in, or when another flow takes the slot (tally_flow, memo_of).
 * A visit (an LRU lookup, atomic adds on a line other CPUs write, an update
 * of flows_visited) cost 500-900 ns live with its lines cold, and every CPU
 * paid ~4,000 a second when packets visited at random: at 16 TCP flows that
 * was most of the program's cost over a trivial one (bench/HISTORY.md, "Per
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
 * syscalls a tick: bench/HISTORY.md, "Agent cost with many flows").  An
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
 * BPF_PROG_TEST_RUN (bench/HISTORY.md "Per packet"), and a flow's packets all
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
