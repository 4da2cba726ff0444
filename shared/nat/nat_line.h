/* cotrain: one line of the NAT service's protocol (doc/nat.md), with the one
 * limit both sides hold to.  The client reads the service's answers with it
 * (nat_proto.c) and the service reads requests with it (server/relay.c), so
 * neither accepts a line the other would refuse. */
#ifndef COT_NAT_LINE_H
#define COT_NAT_LINE_H

#include <stdint.h>

#include "shared/common/error.h"

/* Room for the longest line either side accepts: NAT_LINE_MAX - 1 bytes
 * before the "\n" (a MEET line with a 256-byte token fits). */
#define NAT_LINE_MAX 448

/* Read one line from fd (blocking or not) into out, byte by byte so that
 * nothing after its "\n" is consumed; the "\n", and a "\r" before it, are
 * dropped and out is NUL-terminated.  Gives up at deadline (a
 * deadline_after_ms() value) and, with cancel, once *cancel is set (checked
 * every 200 ms).  COT_OK; COT_ERR_TOO_LARGE for a line of NAT_LINE_MAX bytes
 * or more; COT_ERR_TIMEOUT at the deadline or on cancel; COT_ERR_NETWORK when
 * the connection fails or closes first.  out holds NAT_LINE_MAX bytes and is
 * undefined after an error. */
cot_err nat_line_read(int fd, char out[NAT_LINE_MAX], int64_t deadline, const volatile int *cancel,
                      cot_errbuf *eb);

#endif
