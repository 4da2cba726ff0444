/* cotrain: fault points, a test hook (doc/client.md, "Test hooks").
 *
 * Off unless the environment variable COTRAIN_FAULT is set when the
 * program starts (fault_init):
 *
 *     COTRAIN_FAULT=POINT:ACTION[:VERSION[+]]
 *
 * POINT names a protocol point of a round (before-report, before-slices, mid-slice,
 * after-slices, before-outcome, aggregator-mid-sum, cross-stage: an
 * aggregator whose group's slices are in, as it starts the stage across
 * groups); ACTION is what the
 * process does the first time it reaches that point (in round VERSION
 * only, when given; with "+", in the first round from VERSION on): "stop" raises SIGSTOP on itself, "die" leaves at once
 * with _exit (no cleanup; the kernel resets the sockets, like kill -9),
 * "silent" blocks the calling thread for good, sockets held open, the
 * process alive; "fail" (gpu-step only) makes the GPU fail right after
 * that step, as a device fault would.  It fires once.  A warning "fault point NAME: ACTION" is
 * logged before acting, so that a test sees it fired.
 *
 * It lets the tests make one peer fail at an exact step.  It gives a
 * volunteer nothing a modified client would not have. */
#ifndef COT_FAULT_H
#define COT_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include "shared/common/error.h"

/* Read COTRAIN_FAULT once (call before any thread starts).  COT_OK when it
 * is unset or valid; COT_ERR_INVALID with the reason in eb when it names
 * an unknown point or action or a bad version. */
cot_err fault_init(cot_errbuf *eb);

/* The process reached point name in round version: act when the hook is
 * set for it and has not fired yet; return otherwise (at once when no hook
 * is set).  True only when the action is "fail": the caller then fails
 * the step itself.  Thread-safe. */
bool fault_point(const char *name, int64_t version);

#endif
