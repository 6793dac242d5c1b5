/* The maps more than one stage reads: the agent's run-time settings, each
 * class's config, and each class's counters.  The maps of one stage are
 * defined in its header.  Layouts of every value: limiter.h. */
#pragma once

#include "limiter.h"

/* Arrays every packet reads (these, memos, buckets) are BPF_F_MMAPABLE, not to map them but because
 * such a map's values start a page, so limiter.h can keep what a packet reads
 * of a value in one cache line (an array's values start at any multiple of 8
 * otherwise, per-CPU ones too). */
BPF_F_TABLE("array", int, struct settings, settings, 1, BPF_F_MMAPABLE); /* agent writes; every stage reads */

BPF_F_TABLE("array", int, struct class_config, config, MAX_CLASSES, BPF_F_MMAPABLE); /* agent writes; police, clients read */

BPF_PERCPU_ARRAY(counters, struct counters, MAX_CLASSES); /* count, refuse_client write; agent sums CPUs */
