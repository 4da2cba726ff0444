/* cotrain client: cheating on purpose, a test hook (doc/client.md, "Test
 * hooks").
 *
 * Off unless the environment variable COTRAIN_CHEAT is set when the client
 * starts (cl_cheat_init):
 *
 *     COTRAIN_CHEAT=skip-half   counts every odd stream microbatch of the
 *         host's own work units as done without computing it, and reports
 *         a made-up sketch for it (a copy of the previous one;
 *         client/compute.h, cl_compute_fake_microbatch);
 *     COTRAIN_CHEAT=poison      sends -5 times its gradient into the
 *         all-reduce (the direction that raises the loss, with a norm
 *         below the aggregators' outlier limit of 10 times the median).
 *
 * Spot checks the host answers for other hosts are computed honestly.  A
 * warning is logged at start, so that a test sees it is on.
 *
 * It lets the tests show that spot checks catch such a host.  It gives a
 * volunteer nothing a modified client would not have. */
#ifndef CL_CHEAT_H
#define CL_CHEAT_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

/* Read COTRAIN_CHEAT once (before any thread starts).  COT_OK when it is
 * unset or names a known cheat; COT_ERR_INVALID with the reason else. */
cot_err cl_cheat_init(cot_errbuf *eb);

/* 1 when stream microbatch g of the host's own work is to be skipped. */
int cl_cheat_skip(int64_t g);

/* With the poison cheat, a malloc'd copy of grad[0..n) as the host sends
 * it (the caller frees it); else NULL (send grad). */
float *cl_cheat_poison(const float *grad, size_t n);

#endif
