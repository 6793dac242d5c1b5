/* The program's constants.
 *
 * Those shared with Python (map sizes, array lengths, modes, fixed points, the
 * clock...) are not written here: agent/abi.py is their one table, and the agent
 * passes every one as a -D flag (abi.cflags()), with DRL_ABI among them, so a
 * compile without them stops here rather than at the first name it misses.
 * tests/unit/kernel/test_abi.py checks that every upper-case name the C code
 * uses is defined here, by a kernel header or by that table, and by one only.
 *
 * Below, the program's own, which Python never sees.
 */
#pragma once

#ifndef DRL_ABI
#error "compile with agent/abi.py cflags(): the constants shared with Python come from there"
#endif

/* classify's answer for a packet no rule matches (bypass). */
#define NO_CLASS -1

/* police's verdicts, __u64 like the registers (an int verdict is zero-extended
 * before every compare: 11 more instructions).  WOULD_DROP: refused, but the
 * class is in shadow mode. */
#define VERDICT_DROP 0
#define VERDICT_PASS 1
#define VERDICT_WOULD_DROP 2

/* How stale a shaped class's empty policer may get before a packet marks it
 * empty again (police.h shape): at most 1 ms of credit, one write a ms. */
#define SHAPE_EMPTY_NS 1000000

/* The client rule's verdict on a packet (clients.h clients). */
#define CLIENT_PASSED 0
#define CLIENT_THROTTLED 1
#define CLIENT_BANNED 2

/* bench/datapath.py builds the program without parts of the pipeline
 * (BENCH_SKIP, agent/abi.py; 0 in the agent) to attribute its cost. */
#define SKIP_FLOWS 1
#define SKIP_POLICE 2
#define SKIP_CLOCK 4    /* now = 0: only with SKIP_POLICE (a bucket at time 0 refuses all) */
#define SKIP_CLASSIFY 8 /* every packet in class 0 */
