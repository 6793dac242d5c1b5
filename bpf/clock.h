/* The clock: one read per policed packet, coarse and cached per CPU. */
#pragma once

#include "limiter.h"

BPF_PERCPU_ARRAY(clock_cache, struct clock_cache, 1);     /* clock_ns's own */

/* One clock read per policed packet, shared by police and the flow tally.  Coarse
 * (CLOCK_COARSE, agent/abi.py): CLOCK_MONOTONIC_COARSE, the time at the last
 * jiffy (4 ms at HZ=250), which changes once a jiffy, so each CPU reads it
 * once a jiffy and keeps it with the jiffy it belongs to: a packet pays
 * bpf_jiffies64 (one load) and a compare, not the ~15 ns of the timekeeper's
 * read, nor the ~35 ns of bpf_ktime_get_ns (bench/HISTORY.md, "per packet").
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
