/* drl's datapath: tc classifiers (clsact, direct-action) for IPv4/IPv6.
 *
 * Every egress packet goes parse -> classify -> clients -> police -> count ->
 * tally, from map state alone: the kernel never waits for Python (design.md).
 * A second entry point, drl_ingress, drops banned clients' packets on their
 * way in (docs/clients.md).  Each stage is a header below, with the maps it
 * owns; layouts of every map value are in limiter.h, the constants shared with
 * Python in agent/abi.py.  agent/kernel/loader.py compiles this file with
 * bcc and the rest of agent/kernel/ attaches it and talks to its maps.
 *
 * bcc rewrites map calls (m.lookup(k)) only in the source it is handed, never
 * in a header it includes: the loader hands it this file with our headers
 * inlined, each once, under #line so messages still name the header.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include "consts.h"
#include "limiter.h"
#include "maps.h"
#include "parse.h"      /* the packet's flow key */
#include "classify.h"   /* its class, or none */
#include "clock.h"
#include "flows.h"      /* its flow's memo slot and tally */
#include "police.h"     /* its class's verdict */
#include "clients.h"    /* its client's verdict, before the class's */
#include "count.h"

/* Attached at tc egress (clsact, direct-action) by agent/kernel/attach.py:
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

/* Attached at tc ingress (clsact, direct-action) by agent/kernel/attach.py while
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
