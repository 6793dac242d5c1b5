/* The baseline of bench/per_packet.py: a tc program that only says TC_ACT_OK, so a
 * row's distance to it is what bpf/limiter.c itself costs (the bpf_stats probe and
 * the tc hook are in both). */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

int trivial(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}
