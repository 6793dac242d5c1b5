/* Count: what the limit counts of a packet, and the per-CPU counters the
 * agent sums (agent/estimator.py turns them into rates). */
#pragma once

#include <uapi/linux/pkt_cls.h>
#include "limiter.h"

BPF_PERCPU_ARRAY(bypass_counters, struct counters, 1);   /* bypass writes; agent sums CPUs */

/* The bytes the limit counts: the L2 frame as the kernel's qdiscs (tbf)
 * count it, qdisc_skb_cb(skb)->pkt_len = skb->len + (gso_segs - 1) * header
 * length.  So a GSO skb is charged for every frame it becomes on the wire,
 * Ethernet header included, FCS and preamble not (bench/HISTORY.md). */
static __always_inline __u64 wire_bytes(struct __sk_buff *skb)
{
	return skb->wire_len;
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
