/* cotrain: reading one line of the NAT service's protocol (nat_line.h). */
#include "shared/nat/nat_line.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "shared/common/deadline.h"

cot_err nat_line_read(int fd, char out[NAT_LINE_MAX], int64_t deadline, const volatile int *cancel,
                      cot_errbuf *eb)
{
	size_t n = 0;
	for (;;) {
		char c;
		ssize_t got = recv(fd, &c, 1, MSG_DONTWAIT);
		if (got == 1) {
			if (c == '\n') {
				if (n && out[n - 1] == '\r')
					n--;
				out[n] = '\0';
				return COT_OK;
			}
			if (n == NAT_LINE_MAX - 1)
				return cot_seterr(eb, COT_ERR_TOO_LARGE, "line longer than %d bytes",
				                  NAT_LINE_MAX - 1);
			out[n++] = c;
			continue;
		}
		if (got == 0)
			return cot_seterr(eb, COT_ERR_NETWORK,
			                  "connection closed before the end of the line");
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return cot_seterr(eb, COT_ERR_NETWORK, "could not read a line: %s", strerror(errno));
		int left = deadline_left_ms(deadline);
		if (left == 0)
			return cot_seterr(eb, COT_ERR_TIMEOUT, "no complete line before the deadline");
		if (cancel && *cancel)
			return cot_seterr(eb, COT_ERR_TIMEOUT, "cancelled");
		struct pollfd p = { .fd = fd, .events = POLLIN };
		poll(&p, 1, cancel && left > 200 ? 200 : left);
	}
}
