/* Parse: a packet's headers as a struct flow_key (addresses, ports, family,
 * protocol), the same for IPv4 and IPv6. */
#pragma once

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/udp.h>
#include "limiter.h"

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
