/* cotrain: forming averaging groups of nearby peers.
 *
 * Every peer with gradients for the round goes into exactly one group of at
 * most `max_size` peers; groups are as equal in size as possible
 * (ceil(n / max_size) groups), and peers close to each other by measured
 * round-trip time go together.  Seeds are picked by farthest-point sampling
 * (starting from peer 0), preferring peers that can aggregate so that every
 * group has one when enough exist; then (peer, group) pairs are taken in
 * order of the peer's distance to the group's seed while the group has room.
 * Everything is deterministic: the same inputs give the same groups. */
#ifndef COT_GROUPING_H
#define COT_GROUPING_H

#include <stdbool.h>

#include "shared/common/error.h"

/* Distance used for an unknown round-trip time. */
#define GRP_RTT_UNKNOWN_MS 1e4

/* rtt: n*n row-major, milliseconds, rtt[i*n+j] < 0 when unknown (the
 * symmetric entry is used when known).  can_aggregate: n flags (may be NULL:
 * all can).  On success group[i] is peer i's group in [0, *n_groups). */
cot_err grp_form(int n, const double *rtt, const bool *can_aggregate, int max_size, int *group, int *n_groups,
                 cot_errbuf *eb);

#endif
